"""Schemathesis against the agent server's own OpenAPI document: no generated request
(valid or not) gets a 5xx.

Operations are driven through schemathesis' hypothesis strategies directly, one bounded
run per operation, rather than through its pytest plugin.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.web.agent_fixtures import *  # noqa: F403
from tests.web.agent_fixtures import AgentServer

MAX_EXAMPLES = 30


@pytest.fixture(scope="module")
def agent_api_schema(agent_server: AgentServer) -> Any:
    with httpx.Client(base_url=agent_server.url) as c:
        document = c.get("/api-docs/openapi.json").json()
    return schemathesis.openapi.from_dict(document)


def _operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


def test_fuzz_every_operation_without_5xx(agent_server: AgentServer, agent_api_schema: Any) -> None:
    operations = _operations(agent_api_schema)
    assert len(operations) >= 14
    failures: list[str] = []
    statuses: list[int] = []
    with httpx.Client(base_url=agent_server.url, timeout=60) as client:
        for operation in operations:
            strategy = operation.as_strategy()

            @given(case=strategy)
            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
                database=None,
            )
            def run(case: Any) -> None:
                response = client.request(
                    case.method,
                    case.formatted_path,
                    params=case.query,
                    headers={k: v for k, v in (case.headers or {}).items() if k.lower() != "host"},
                    **({"json": case.body} if _has_body(case) else {}),
                )
                statuses.append(response.status_code)
                if response.status_code >= 500:
                    failures.append(f"{case.method} {case.path}: {response.status_code} for {case.body!r}")

            run()
    assert failures == []
    assert len(statuses) >= 5 * len(operations)
    assert 200 in statuses and 400 in statuses
    with httpx.Client(base_url=agent_server.url) as c:
        assert c.get("/health").status_code == 200


def _has_body(case: Any) -> bool:
    from schemathesis.core import NOT_SET

    return case.body is not NOT_SET


def test_fuzz_raw_bodies(agent_server: AgentServer) -> None:
    """Arbitrary JSON (and non-JSON) bodies on every body-taking route: 200 or 400, never 5xx."""
    paths = [
        "/api/v1/execute",
        "/api/v1/eval",
        "/api/v1/call/upper",
        "/api/v1/pipeline",
        "/api/v1/stream/execute",
        "/api/v1/stream/eval",
        "/api/v1/stream/pipeline",
    ]
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["command", "code", "args", "kwargs", "input", "steps", "limits", "x"]),
            inner,
            max_size=4,
        ),
        max_leaves=10,
    )
    seen: list[int] = []
    with httpx.Client(base_url=agent_server.url, timeout=60) as client:

        @given(path=st.sampled_from(paths), body=json_values | st.binary(max_size=40))
        @settings(max_examples=120, deadline=None, derandomize=True, database=None)
        def run(path: str, body: Any) -> None:
            if isinstance(body, bytes):
                r = client.post(path, content=body)
            else:
                r = client.post(path, json=body)
            seen.append(r.status_code)
            assert r.status_code in (200, 400, 404), (path, body, r.status_code, r.text[:200])

        run()
    assert 400 in seen
