"""`mlxbun config` end to end: each setting's value and where it came from."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from conftest import run_cli


def ok(*args: str, env: dict | None = None):
    result = run_cli("config", *args, env=env)
    assert "Traceback" not in result.stderr
    assert result.returncode == 0, result.stderr
    return result


def show(env: dict | None = None) -> dict:
    return json.loads(ok("show", "--json", env=env).stdout)


def one_error_line(result, *words: str) -> None:
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert lines and lines[0].startswith("error: "), result.stderr
    assert all(word in lines[0] for word in words), result.stderr
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), result.stderr


def test_sources_default_file_env(isolated_home):
    config_file = isolated_home / "config" / "config.toml"
    assert ok("path").stdout.strip() == str(config_file)

    data = show()
    assert data["config_file"] == str(config_file)
    assert data["locations"]["data"] == str(isolated_home / "data")
    port = data["settings"]["port"]
    assert port == {"value": 8080, "source": "default"}
    assert data["settings"]["default_model"] == {"value": None, "source": "default"}

    ok("set", "port", "9000")
    ok("set", "api_key", "s3cret-key")
    ok("set", "enable_thinking", "off")
    ok("set", "default_model", 'my "odd" \\ mödel')  # quotes, backslash, non-ASCII survive TOML
    assert "port = 9000" in config_file.read_text(encoding="utf-8")

    with ThreadPoolExecutor(max_workers=2) as pool:
        from_file, from_env = pool.map(show, [None, {"MLXBUN_PORT": "9100"}])
    source = f"config {config_file}"
    settings = from_file["settings"]
    assert settings["port"] == {"value": 9000, "source": source}
    assert settings["enable_thinking"] == {"value": False, "source": source}
    assert settings["default_model"] == {"value": 'my "odd" \\ mödel', "source": source}
    assert settings["api_key"] == {"value": "(set)", "source": source}  # never echoed
    assert "s3cret-key" not in json.dumps(from_file)
    assert settings["host"] == {"value": "127.0.0.1", "source": "default"}
    # The environment beats the config file.
    assert from_env["settings"]["port"] == {"value": 9100, "source": "env MLXBUN_PORT"}
    assert from_env["settings"]["default_model"]["source"] == source

    ok("unset", "port")
    assert show()["settings"]["port"] == {"value": 8080, "source": "default"}


def test_bad_values_and_unknown_settings_exit_2(isolated_home):
    ok("set", "port", "9000")
    cases = [
        (["set", "port", "abc"], None, ("port", "integer", "'abc'")),
        (["set", "enable_thinking", "maybe"], None, ("enable_thinking", "true/false")),
        (["set", "colour", "blue"], None, ("unknown setting", "colour")),
        (["unset", "colour"], None, ("unknown setting", "colour")),
        (["show", "--json"], {"MLXBUN_PORT": "abc"}, ("port", "MLXBUN_PORT", "integer")),
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda c: run_cli("config", *c[0], env=c[1]), cases))
    for (_, _, words), result in zip(cases, results, strict=True):
        one_error_line(result, *words)
    # A rejected `set` left the file as it was.
    assert show()["settings"]["port"]["value"] == 9000

    # A config file that is not TOML, or names an unknown setting, is a clear error too.
    config_file = isolated_home / "config" / "config.toml"
    config_file.write_text("port = = 1\n", encoding="utf-8")
    broken = run_cli("config", "show")
    config_file.write_text("port = 9000\nturbo = true\n", encoding="utf-8")
    unknown = run_cli("config", "show")
    one_error_line(broken, "cannot read config file", str(config_file))
    one_error_line(unknown, "unknown setting", "turbo")


def test_setting_the_api_key_keeps_it_secret(isolated_home):
    result = ok("set", "api_key", "s3cret-key")
    assert "s3cret-key" not in result.stdout + result.stderr
    mode = (isolated_home / "config" / "config.toml").stat().st_mode & 0o777
    assert mode & 0o077 == 0, oct(mode)
