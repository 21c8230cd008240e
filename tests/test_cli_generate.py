"""`mlxbun generate` end to end: real subprocesses on the tiny model."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor

from conftest import run_cli
from tokenizers import Tokenizer

PROMPT = "Tell me a story"


def bias_flags(no_eos_bias: dict) -> list[str]:
    """`--logit-bias` flags that forbid EOS, so a run goes to its token limit."""
    return [f"--logit-bias={token}={bias}" for token, bias in no_eos_bias.items()]


def assert_clean(result) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr


def generate_json(*args: str, input: str | None = None, env: dict | None = None) -> dict:
    result = run_cli("generate", *args, "--json", input=input, env=env)
    assert_clean(result)
    return json.loads(result.stdout)  # stdout holds the JSON object and nothing else


def install_models(home, tiny_model_dir, *names: str) -> None:
    """Copies of the tiny model in the data dir, where `models` looks for them."""
    for name in names:
        shutil.copytree(tiny_model_dir, home / "data" / "models" / name)


def check_usage(data: dict, max_tokens: int) -> None:
    usage = data["usage"]
    assert usage["prompt_tokens"] > 0
    assert 0 <= usage["cached_tokens"] <= usage["prompt_tokens"]
    assert 1 <= usage["completion_tokens"] <= max_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_seed_replays_exactly_from_argument_and_stdin(tiny_model_dir, no_eos_bias):
    flags = ["--temperature", "0.8", "-n", "16", "--logprobs", "2", *bias_flags(no_eos_bias)]
    first = generate_json(str(tiny_model_dir), PROMPT, "--seed", "7", *flags)
    from_stdin = generate_json(str(tiny_model_dir), "-", "--seed", "7", *flags, input=PROMPT)
    other_seed = generate_json(str(tiny_model_dir), PROMPT, "--seed", "8", *flags)

    assert first["model"] == str(tiny_model_dir.resolve())
    assert first["demo"] is False
    assert first["seed"] == 7 and other_seed["seed"] == 8
    assert first["finish_reason"] == "length"  # EOS is forbidden, so it runs to -n
    assert first["reasoning"] is None and first["tool_calls"] == []
    for data in (first, from_stdin, other_seed):
        check_usage(data, max_tokens=16)
        assert data["usage"]["completion_tokens"] == 16 == len(data["logprobs"])

    # `-` read the same prompt from stdin, and the same seed replayed the same text.
    assert from_stdin["usage"]["prompt_tokens"] == first["usage"]["prompt_tokens"]
    assert from_stdin["text"] == first["text"]
    assert [t["token"] for t in from_stdin["logprobs"]] == [t["token"] for t in first["logprobs"]]
    assert other_seed["text"] != first["text"]

    for entry in first["logprobs"]:
        assert isinstance(entry["token"], str)
        assert entry["logprob"] <= 0
        top = entry["top_logprobs"]
        assert len(top) == 2
        assert all(isinstance(t["token"], str) and t["logprob"] <= 0 for t in top)
        assert top[0]["logprob"] >= top[1]["logprob"]
        assert entry["logprob"] <= top[0]["logprob"] + 1e-6  # nothing beats the top choice


def test_raw_prompt_and_stop_string_never_printed(tiny_model_dir, no_eos_bias):
    # Seeded sampling replays (see above) and, unlike greedy, gives varied text to cut.
    flags = ["--raw", "--temperature", "1", "--seed", "1", "-n", "40", *bias_flags(no_eos_bias)]
    base = generate_json(str(tiny_model_dir), "Hello world", *flags)
    # No chat template: the prompt is exactly the tokens of "Hello world", not a rendered turn.
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    assert base["usage"]["prompt_tokens"] == len(tokenizer.encode("Hello world").ids)
    check_usage(base, max_tokens=40)
    text = base["text"]
    assert len(text) > 12, text

    # A stop string from the middle of the first answer, whose first occurrence is not at 0.
    stop = next(
        text[i : i + 5]
        for i in range(len(text) // 2, len(text) - 5)
        if "\ufffd" not in text[i : i + 5] and text.find(text[i : i + 5]) > 0
    )
    expected = text[: text.find(stop)]

    result = run_cli("generate", str(tiny_model_dir), "Hello world", *flags, f"--stop={stop}")
    assert_clean(result)
    # Plain mode: only the answer on stdout (ended with a newline); stats go to stderr.
    assert result.stdout == (expected if expected.endswith("\n") else expected + "\n")
    assert stop not in result.stdout
    assert "finish: stop" in result.stderr


def test_demo_model_is_built_on_first_use(isolated_home):
    data = generate_json("demo", "hi", "-n", "4", "--temperature", "0")
    assert data["demo"] is True
    assert data["model"] == "demo"
    check_usage(data, max_tokens=4)
    assert (isolated_home / "cache" / "demo-model" / "model.safetensors").is_file()


def test_default_model_from_env_and_config_file(tiny_model_dir, isolated_home, no_eos_bias):
    install_models(isolated_home, tiny_model_dir, "tiny-one")
    env = {"MLXBUN_DEFAULT_MODEL": "one", "MLXBUN_MAX_TOKENS": "3"}  # "one": a unique part
    data = generate_json("hello", *bias_flags(no_eos_bias), env=env)
    assert data["model"] == "tiny-one"
    assert data["usage"]["completion_tokens"] == 3  # max_tokens from the env

    # The config file names the default; a flag beats MLXBUN_MAX_TOKENS.
    assert run_cli("config", "set", "default_model", "tiny-one").returncode == 0
    data = generate_json(
        "hello", "-n", "5", *bias_flags(no_eos_bias), env={"MLXBUN_MAX_TOKENS": "3"}
    )
    assert data["model"] == "tiny-one"
    assert data["usage"]["completion_tokens"] == 5


def test_bad_input_is_one_error_line_and_exit_2(tiny_model_dir, isolated_home, tmp_path):
    install_models(isolated_home, tiny_model_dir, "tiny-one", "tiny-two")
    empty_dir = tmp_path / "not-a-model"
    empty_dir.mkdir()
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text("{not json")
    no_type = tmp_path / "no-type"
    no_type.mkdir()
    (no_type / "config.json").write_text('{"hidden_size": 8}')
    model = str(tiny_model_dir)
    cases = [
        # (arguments, stdin, words the error line must contain)
        (["no-such-model", "hi"], None, "no local model matches 'no-such-model'"),
        (["tiny", "hi"], None, "ambiguous"),
        (["./no-such-dir/", "hi"], None, "no such model directory"),
        ([str(empty_dir), "hi"], None, "no config.json"),
        ([str(corrupt), "hi"], None, "not valid JSON"),
        ([str(no_type), "hi"], None, "no model_type"),
        (["hi"], None, "no model named and no default model"),
        ([model, "   "], None, "prompt is empty"),
        ([model, "-"], "\n \n", "prompt is empty"),
        ([model, "hi", "--temperature", "-0.5"], None, "temperature"),
        ([model, "hi", "--top-p", "1.5"], None, "top_p"),
        ([model, "hi", "-n", "0"], None, "max_tokens"),
        ([model, "hi", "--logit-bias", "abc"], None, "--logit-bias"),
        ([model, "hi", "--reasoning-effort", "lots"], None, "reasoning_effort"),
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda c: run_cli("generate", *c[0], input=c[1]), cases))
    problems = []
    for (args, _, words), result in zip(cases, results, strict=True):
        lines = result.stderr.splitlines()
        ok = (
            result.returncode == 2
            and "Traceback" not in result.stderr
            and result.stdout == ""
            and len(lines) in (1, 2)
            and lines[0].startswith("error: ")
            and words in lines[0]
            and (len(lines) == 1 or lines[1].startswith("hint: "))
        )
        if not ok:
            problems.append(f"{args}: exit {result.returncode}\n{result.stderr}")
    assert not problems, "\n".join(problems)


def test_malformed_option_value_is_one_error_line(tiny_model_dir):
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(
            pool.map(
                lambda extra: run_cli("generate", str(tiny_model_dir), "hi", *extra),
                [["--temperature", "warm"], ["--logprobs", "50"]],
            )
        )
    for result in results:
        assert result.returncode == 2
        assert "Traceback" not in result.stderr
        lines = result.stderr.splitlines()
        assert lines and lines[0].startswith("error: "), result.stderr
        assert len(lines) <= 2, result.stderr
