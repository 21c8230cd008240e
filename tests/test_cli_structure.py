"""`--json-schema`, `--tools` and `--tool-choice` on the command line."""

from __future__ import annotations

import json

import jsonschema
from conftest import run_cli

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "score"],
    "additionalProperties": False,  # else a random model may add keys until max_tokens
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"enum": ["UTC", "CET"]}},
                "required": ["tz"],
                "additionalProperties": False,
            },
        },
    }
]


def test_json_schema_and_forced_tool_from_files(tiny_model_dir, tmp_path):
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps(TOOLS))
    r = run_cli(
        "generate",
        str(tiny_model_dir),
        "Is it?",
        "--json-schema",
        str(schema_file),
        "--no-think",
        "-q",
    )
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), SCHEMA)
    r = run_cli(
        "generate",
        str(tiny_model_dir),
        "time?",
        "--tools",
        str(tools_file),
        "--tool-choice",
        "get_time",
        "--no-think",
        "--json",
        "-q",
    )
    out = json.loads(r.stdout)
    assert out["finish_reason"] == "tool_calls"
    assert out["tool_calls"][0]["function"]["name"] == "get_time"
    jsonschema.validate(
        json.loads(out["tool_calls"][0]["function"]["arguments"]),
        TOOLS[0]["function"]["parameters"],
    )


def test_structure_flags_bad_input(tiny_model_dir, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cases = [
        (["--json-schema", str(tmp_path / "missing.json")], "no such file"),
        (["--json-schema", str(bad)], "not valid JSON"),
        (["--tool-choice", "required"], "needs --tools"),
    ]
    for args, message in cases:
        r = run_cli("generate", str(tiny_model_dir), "x", *args)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
