"""Fuzz the served OpenAPI document with schemathesis: no input may cause a 5xx."""

from __future__ import annotations

import json
import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from serverutil import start_server


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    from mlxbun_cli.demo_model import build_demo_model

    # A 64-token context keeps every generated request short.
    model = build_demo_model(tmp_path_factory.mktemp("fuzz-model") / "m", size="tiny")
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 64
    (model / "config.json").write_text(json.dumps(config))
    srv = start_server(model, tmp_path_factory.mktemp("fuzz-home"))
    yield srv
    assert srv.stop() == 0, srv.output()


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_server):
    return schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")


def test_no_input_causes_a_server_error(fuzz_schema):
    """Every operation, bounded examples each; schemathesis checks for 5xx."""
    operations = [result.ok() for result in fuzz_schema.get_all_operations()]
    assert any(op.path == "/v1/chat/completions" for op in operations)
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=30,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=bool(os.environ.get("CI")),
        )
        def call(case):
            case.call_and_validate(checks=[not_a_server_error], timeout=30)

        call()
