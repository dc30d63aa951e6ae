"""Execution routes of the agent server: execute, eval, call, pipeline (SPEC §2.1)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.web.agent_fixtures import *  # noqa: F403
from tests.web.agent_fixtures import AgentServer

ENVELOPE = {"success", "result", "type", "value", "output", "error", "elapsed_ms"}


def _check_envelope(body: dict[str, Any]) -> None:
    assert set(body) >= ENVELOPE
    assert isinstance(body["success"], bool)
    assert isinstance(body["output"], list)
    assert isinstance(body["elapsed_ms"], int)
    if body["success"]:
        assert isinstance(body["result"], str)
        assert isinstance(body["type"], str)
        assert body["error"] is None
    else:
        assert set(body["error"]) >= {"kind", "message", "line", "column", "hint"}


def test_execute_returns_result_and_type(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        r = c.post("/api/v1/execute", json={"command": "1 + 1"})
    assert r.status_code == 200
    body = r.json()
    _check_envelope(body)
    assert body["success"] is True
    assert body["result"] == "2"
    assert body["type"] == "Int"
    assert body["value"] == 2


@pytest.mark.parametrize(
    ("code", "result", "type_", "value"),
    [
        ('"a,b,c" | split(",") | join("-")', "a-b-c", "String", "a-b-c"),
        ("[3, 1, 2] | sort | map(fn(x) => x * 10) | sum", "60", "Int", 60),
        ('{name: "a", n: 1}', '{"name":"a","n":1}', "Record", {"name": "a", "n": 1}),
        ("[{a: 1}, {a: 2}]", '[{"a":1},{"a":2}]', "Table", [{"a": 1}, {"a": 2}]),
        ("1 / 2", "0.5", "Float", 0.5),
        ("let x = 1", "null", "Null", None),
        ("range(0, 3) | map(fn(x) => x + 1)", "[1,2,3]", "Array", [1, 2, 3]),
    ],
)
def test_eval_renders_values(
    agent_server: AgentServer, code: str, result: str, type_: str, value: Any
) -> None:
    with agent_server.client() as c:
        body = c.post("/api/v1/eval", json={"code": code}).json()
    _check_envelope(body)
    assert body["success"], body
    assert (body["result"], body["type"], body["value"]) == (result, type_, value)


def test_print_output_is_collected_in_order(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        body = c.post("/api/v1/eval", json={"code": 'print("a")\nprint("b")\n3'}).json()
    assert body["output"] == ["a", "b"]
    assert body["result"] == "3"


def test_conch_error_is_200_with_position(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        syntax = c.post("/api/v1/execute", json={"command": "let x = (1 + )"})
        zero = c.post("/api/v1/eval", json={"code": "let a = 1\n1 / 0"})
        name = c.post("/api/v1/eval", json={"code": "lenght([1])"})
    assert syntax.status_code == 200
    err = syntax.json()["error"]
    assert syntax.json()["success"] is False
    assert (err["kind"], err["line"], err["column"]) == ("SyntaxError", 1, 14)
    assert zero.json()["error"]["kind"] == "ZeroDivisionError"
    assert zero.json()["error"]["line"] == 2
    assert name.json()["error"]["kind"] == "NameError"
    assert "length" in (name.json()["error"]["hint"] or "")


def test_call_builtin_with_args_and_kwargs(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        upper = c.post("/api/v1/call/upper", json={"args": ["abc"]}).json()
        mapped = c.post("/api/v1/call/map", json={"args": [[1, 2, 3], "fn(x) => x * 2"]}).json()
        named = c.post(
            "/api/v1/call/sort_by",
            json={"args": [[{"n": 2}, {"n": 1}], "n"], "kwargs": {"desc": True}},
        ).json()
        bad = c.post("/api/v1/call/upper", json={"args": [1]}).json()
    _check_envelope(upper)
    assert (upper["result"], upper["type"]) == ("ABC", "String")
    assert mapped["value"] == [2, 4, 6]
    assert named["value"] == [{"n": 2}, {"n": 1}]
    assert bad["success"] is False and bad["error"]["kind"] == "TypeError"


def test_call_unknown_builtin_is_404_with_hint(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        r = c.post("/api/v1/call/uper", json={"args": ["x"]})
    assert r.status_code == 404
    body = r.json()
    assert body["success"] is False
    assert 'did you mean "upper"?' in body["error"]["hint"]


def test_pipeline_adds_step_timings(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        r = c.post(
            "/api/v1/pipeline",
            json={"input": [1, 2, 3], "steps": ["map(fn(x) => x * 2)", "sum"]},
        )
    body = r.json()
    _check_envelope(body)
    assert body["result"] == "12" and body["type"] == "Int"
    assert [s["step"] for s in body["steps"]] == [1, 2]
    assert [s["type"] for s in body["steps"]] == ["Array", "Int"]
    assert all(isinstance(s["elapsed_ms"], int) for s in body["steps"])


def test_pipeline_step_error_names_the_step(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        body = c.post("/api/v1/pipeline", json={"input": [1], "steps": ["sum", "upper"]}).json()
    assert body["success"] is False
    assert body["error"]["kind"] == "TypeError"
    assert body["error"]["message"].startswith("step 2:")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/execute", {}),
        ("/api/v1/execute", {"command": 5}),
        ("/api/v1/execute", {"command": None}),
        ("/api/v1/eval", {"cmd": "1"}),
        ("/api/v1/pipeline", {"input": [1]}),
        ("/api/v1/pipeline", {"input": [1], "steps": "sum"}),
        ("/api/v1/pipeline", {"input": [1], "steps": [1]}),
        ("/api/v1/call/upper", {"args": "x"}),
        ("/api/v1/call/upper", {"kwargs": []}),
        ("/api/v1/execute", {"command": "1", "limits": {"wall_time_s": -1}}),
        ("/api/v1/execute", [1, 2]),
        ("/api/v1/stream/execute", {"command": 1}),
    ],
)
def test_malformed_requests_are_400_request_error(
    agent_server: AgentServer, path: str, body: Any
) -> None:
    with agent_server.client() as c:
        r = c.post(path, json=body)
    assert r.status_code == 400, r.text
    data = r.json()
    assert data["success"] is False
    assert data["error"]["kind"] == "RequestError"
    assert isinstance(data["error"]["message"], str) and data["error"]["message"]


def test_body_not_json_is_400(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        r = c.post(
            "/api/v1/execute", content=b"{not json", headers={"content-type": "application/json"}
        )
        empty = c.post("/api/v1/execute")
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert empty.status_code == 400


def test_body_over_limit_is_413(agent_server_factory: Any) -> None:
    server = agent_server_factory(max_body_bytes=1000)
    big = {"command": "x" * 2000}
    with server.client() as c:
        r = c.post("/api/v1/execute", json=big)
        chunked = c.post(
            "/api/v1/execute",
            content=iter([b'{"command": "', b"y" * 1500, b'"}']),
            headers={"content-type": "application/json"},
        )
        ok = c.post("/api/v1/execute", json={"command": "1"})
    assert r.status_code == 413 and r.json()["success"] is False
    assert chunked.status_code == 413
    assert ok.status_code == 200


def test_requests_may_lower_but_not_raise_limits(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        lowered = c.post(
            "/api/v1/eval",
            json={"code": "range(0, 100) | map(fn(x) => x)", "limits": {"collection_size": 10}},
        ).json()
        raised = c.post(
            "/api/v1/eval",
            json={"code": "while true { 1 }", "limits": {"wall_time_s": 10_000, "steps": 10**15}},
        ).json()
        output = c.post(
            "/api/v1/eval",
            json={"code": 'print("0123456789")', "limits": {"output_bytes": 5}},
        ).json()
    assert lowered["error"]["kind"] == "LimitError"
    # The configured wall time (3 s) and step limit still apply.
    assert raised["error"]["kind"] in ("TimeoutError", "LimitError")
    assert output["error"]["kind"] == "LimitError"


def test_security_headers_on_api_responses(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        r = c.post("/api/v1/execute", json={"command": "1"})
        h = c.get("/health")
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["cache-control"] == "no-store"
    assert h.headers["x-content-type-options"] == "nosniff"


def test_health(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        body = c.get("/health").json()
    assert body["status"] == "healthy"
    assert isinstance(body["version"], str) and body["version"].count(".") >= 1
    assert isinstance(body["uptime_seconds"], int)


def test_metrics_prometheus_text(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        c.post("/api/v1/execute", json={"command": "1"})
        r = c.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'conch_http_requests_total{method="POST",route="/api/v1/execute",status="200"}' in text
    assert "conch_run_duration_seconds_bucket" in text
    assert "conch_active_runs" in text
    assert "conch_worker_restarts_total" in text


def test_own_openapi_document(agent_server: AgentServer) -> None:
    from openapi_spec_validator import validate

    with agent_server.client() as c:
        doc = c.get("/api-docs/openapi.json").json()
    validate(doc)
    for path in (
        "/api/v1/execute",
        "/api/v1/eval",
        "/api/v1/call/{builtin}",
        "/api/v1/pipeline",
        "/api/v1/stream/execute",
        "/api/v1/stream/pipeline",
        "/api/v1/stream/eval",
        "/api/v1/builtins",
        "/api/v1/builtins/{name}",
        "/api/v1/types",
        "/api/v1/schema",
        "/api/v1/schema/{format}",
        "/health",
        "/metrics",
    ):
        assert path in doc["paths"], path
    execute = doc["paths"]["/api/v1/execute"]["post"]
    assert "422" not in execute["responses"] and "400" in execute["responses"]
    assert "command" in doc["components"]["schemas"]["ExecuteRequest"]["properties"]


def test_pipeline_input_reaches_the_worker_exactly(agent_server: AgentServer) -> None:
    """The input goes to the worker as the client's own bytes: integers past 64 bits and the
    non-finite floats Python's json writes arrive as they were sent, and results too."""
    big = 2**70 + 1
    body = ('{"input": [' + str(big) + ', 1, NaN, -Infinity], '
            '"steps": ["map(fn(x) => type_of(x))"]}')
    with agent_server.client() as c:
        types = c.post("/api/v1/pipeline", content=body,
                       headers={"content-type": "application/json"}).json()
        total = c.post("/api/v1/pipeline", json={"input": [big, 1], "steps": ["sum"]}).json()
        echoed = c.post("/api/v1/execute", json={"command": f"{big} * 2"}).json()
    assert types["value"] == ["Int", "Int", "Float", "Float"], types
    assert total["result"] == str(big + 1) and total["value"] == big + 1
    assert echoed["value"] == big * 2


@pytest.mark.parametrize(
    "body",
    [
        b'{"input": [1, 2]}',
        b'{"input": [1], "steps": "sum"}',
        b'{"input": [1], "steps": ["sum"], "limits": {"steps": 0}}',
        b'{"input": [1], "steps": ["sum"], "limits": {"steps": true}}',
        b'{"input": [1, 2, "steps": ["sum"]}',
        b'[1, 2]',
    ],
)
def test_pipeline_refusals_are_the_models_own(agent_server: AgentServer, body: bytes) -> None:
    """The server leaves a pipeline's input unparsed (msgspec reads the rest), yet refuses
    exactly what the request model refuses, with the model's own message."""
    from pydantic import ValidationError

    from conch.web.agent.errors import problems
    from conch.web.agent.protocol import PipelineRequest

    with pytest.raises(ValidationError) as refused:
        PipelineRequest.model_validate_json(body)
    with agent_server.client() as c:
        r = c.post("/api/v1/pipeline", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == problems(refused.value.errors(include_url=False))


def test_pipeline_input_may_be_anything_json(agent_server: AgentServer) -> None:
    nested = {"a": [1, {"b": 2**70}], "s": "é\u2028", "f": 0.1}
    with agent_server.client() as c:
        echoed = c.post("/api/v1/pipeline", json={"input": nested, "steps": ["get(\"a\")"]}).json()
        absent = c.post("/api/v1/pipeline", json={"steps": ["type_of"]}).json()
        null = c.post("/api/v1/pipeline", json={"input": None, "steps": ["type_of"]}).json()
    assert echoed["value"] == [1, {"b": 2**70}], echoed
    assert absent["value"] == null["value"] == "Null", (absent, null)
