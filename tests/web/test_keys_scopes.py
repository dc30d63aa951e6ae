"""Every route of both servers, walked with keys: a key that lacks the scope a route
declares gets ``403`` naming that scope, in the route's API's own error shape; a route no
declaration names is the admin's alone; no key is a ``401`` with ``WWW-Authenticate``; the
open routes stay open and the any-key routes take a key without scopes.

The routes are those of both OpenAPI documents and every route the apps serve outside them
(Ollama's ``/api/*`` are in the document; ``/mcp``, ``/metrics``, the documentation's pages
are not): the walk takes them from the apps themselves and checks that it covered them all.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conch import db
from conch.keys import SCOPES
from conch.web.common.auth import ANY, OPEN, app_routes
from tests.web.agent_fixtures import AgentServer, start_agent_server
from tests.web.conftest import RunningServer, start_server
from tests.web.keys_support import (
    ADMIN,
    ADMIN_KEY,
    api_of,
    bearer,
    error_message,
    error_type,
    make_key,
)


@dataclass
class Walk:
    agent: AgentServer
    inference: RunningServer
    keys: dict[str, str]  # a scope -> a key with every scope but it (and not admin)
    no_scopes: str


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    data = tmp_path_factory.mktemp("keys-walk")
    agent = start_agent_server(data, admin_key=ADMIN_KEY)
    inference, server, thread = start_server(data, admin_key=ADMIN_KEY)
    others = [s for s in SCOPES if s != "admin"]
    keys = {
        scope: make_key(agent.url, name=f"all but {scope}", scopes=[s for s in others if s != scope])[1]
        for scope in SCOPES
    }
    yield Walk(agent, inference, keys, make_key(agent.url, name="no scopes")[1])
    agent.stop()
    server.should_exit = True
    thread.join(timeout=30)
    db.dispose_all()


def _routes(app: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path template, rules) of every route the app serves."""
    out = []
    for route in app_routes(app.router.routes):
        rules = route.handle.rules
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            if method != "HEAD":
                out.append((method, route.path, rules))
    return out


def _concrete(template: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", template)


def _check_server(base: str, app: Any, walk: Walk, server: str) -> set[tuple[str, str]]:
    doc = httpx.get(base + "/api-docs/openapi.json", headers=ADMIN, timeout=60).json()
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    seen: set[tuple[str, str]] = set()
    with httpx.Client(base_url=base, timeout=60) as c:
        for method, template, rules in _routes(app):
            rule = rules[method]
            path = _concrete(template)
            api = api_of(path, server)
            seen.add((method, template.replace(":path", "")))
            if rule.access == OPEN:
                r = c.request(method, path)
                assert r.status_code != 401, (method, path, r.text)
                continue
            r = c.request(method, path)
            assert r.status_code == 401, (method, path, r.status_code, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer"), (method, path)
            error_message(api, r.json())
            if rule.access == ANY:
                r = c.request(method, path, headers=bearer(walk.no_scopes))
                assert r.status_code not in (401, 403), (method, path, r.text)
                continue
            r = c.request(method, path, headers=bearer(walk.keys[rule.access]))
            assert r.status_code == 403, (method, path, rule.access, r.status_code, r.text)
            body = r.json()
            message = error_message(api, body)
            assert f"'{rule.access}'" in message, (method, path, message)
            if api in ("openai", "responses"):
                assert body["error"]["code"] == "missing_scope", body
            if api == "openai" or api == "anthropic":
                assert error_type(api, body) == "permission_error", body
    # Every documented operation was walked (``{id:path}`` is ``{id}`` in the document).
    assert documented <= seen, sorted(documented - seen)
    return seen


def test_every_route_of_the_agent_server(walk: Walk) -> None:
    seen = _check_server(walk.agent.url, walk.agent.app, walk, "agent")
    # Beyond its OpenAPI document: MCP and the Prometheus text.
    assert ("POST", "/mcp") in seen and ("GET", "/metrics") in seen


def test_every_route_of_the_inference_server(walk: Walk) -> None:
    seen = _check_server(walk.inference.url, walk.inference.app, walk, "inference")
    assert ("POST", "/api/chat") in seen and ("GET", "/metrics") in seen


def test_the_fast_path_is_guarded_as_its_routes(walk: Walk) -> None:
    """execute, eval and pipeline are served before the framework: the same rules hold."""
    with httpx.Client(base_url=walk.agent.url, timeout=60) as c:
        for path, body in (("/api/v1/execute", {"command": "1 + 1"}),
                           ("/api/v1/eval", {"code": "1 + 1"}),
                           ("/api/v1/pipeline", {"input": [1], "steps": ["sum"]})):  # fmt: skip
            assert c.post(path, json=body).status_code == 401
            r = c.post(path, json=body, headers=bearer(walk.keys["execute"]))
            assert r.status_code == 403 and "'execute'" in r.json()["error"]["message"]
            r = c.post(path, json=body, headers=bearer(walk.keys["inference"]))
            assert r.status_code == 200 and r.json()["success"] is True, r.text


def test_an_undeclared_route_is_the_admins(walk: Walk) -> None:
    """The keys routes, the audit log and /metrics are declared by no scope: a key with
    every other scope is refused, naming admin; the admin key is let through."""
    every = make_key(walk.agent.url, name="every scope but admin",
                     scopes=[s for s in SCOPES if s != "admin"])[1]  # fmt: skip
    for base, path in ((walk.agent.url, "/api/v1/keys"), (walk.agent.url, "/api/v1/audit"),
                       (walk.agent.url, "/metrics"), (walk.inference.url, "/metrics")):  # fmt: skip
        r = httpx.get(base + path, headers=bearer(every), timeout=30)
        assert r.status_code == 403 and "'admin'" in r.text, (path, r.text)
        assert httpx.get(base + path, headers=ADMIN, timeout=30).status_code == 200, path


def test_a_key_with_the_admin_scope_may_do_everything(walk: Walk) -> None:
    admin = make_key(walk.agent.url, name="an admin", scopes=["admin"])[1]
    assert httpx.get(walk.agent.url + "/api/v1/keys", headers=bearer(admin), timeout=30).status_code == 200
    r = httpx.post(walk.agent.url + "/api/v1/execute", json={"command": "2 * 21"},
                   headers=bearer(admin), timeout=30)  # fmt: skip
    assert r.json()["value"] == 42


def test_unknown_revoked_and_expired_keys_are_refused_in_each_apis_shape(walk: Walk) -> None:
    key_id, secret = make_key(walk.agent.url, name="soon revoked", scopes=["inference", "execute"])
    cases = [
        (walk.agent.url, "POST", "/api/v1/execute", {"command": "1"}),
        (walk.inference.url, "POST", "/v1/chat/completions", {"model": "x", "messages": []}),
        (walk.inference.url, "POST", "/v1/messages", {"model": "x", "messages": [], "max_tokens": 1}),
        (walk.inference.url, "POST", "/api/chat", {"model": "x", "messages": []}),
    ]
    r = httpx.delete(f"{walk.agent.url}/api/v1/keys/{key_id}", headers=ADMIN, timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "revoked"
    for secret_used, said in ((secret, "revoked"), ("ck-" + "A" * 43, "invalid")):
        for base, method, path, body in cases:
            r = httpx.request(method, base + path, json=body, headers=bearer(secret_used), timeout=30)
            assert r.status_code == 401, (path, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
            server = "agent" if base == walk.agent.url else "inference"
            assert said in error_message(api_of(path, server), r.json()), (path, r.text)
    # Expired: made to expire in a second.
    import time

    _kid, secret = make_key(walk.agent.url, name="short-lived", scopes=["execute"],
                            expires_at=time.time() + 1.0)  # fmt: skip
    time.sleep(1.2)
    r = httpx.post(walk.agent.url + "/api/v1/execute", json={"command": "1"},
                   headers=bearer(secret), timeout=30)  # fmt: skip
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]


def test_anthropic_clients_send_their_key_as_x_api_key(walk: Walk) -> None:
    import anthropic

    _kid, secret = make_key(walk.agent.url, name="claude client", scopes=["execute"])
    client = anthropic.Anthropic(api_key=secret, base_url=walk.inference.url, max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as err:
        client.messages.create(model="smollm2-135m-instruct", max_tokens=1,
                               messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    assert "'inference'" in str(err.value)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(api_key="ck-" + "B" * 43, base_url=walk.inference.url,
                            max_retries=0).messages.create(
            model="smollm2-135m-instruct", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    # x-api-key counts only on the Messages API: elsewhere a key is a bearer token.
    r = httpx.get(walk.inference.url + "/v1/models", headers={"x-api-key": ADMIN_KEY}, timeout=30)
    assert r.status_code == 401


def test_a_single_user_server_needs_no_key(tmp_path: Path) -> None:
    """No admin key on a loopback bind: every request is the admin, as before keys; a
    foreign token (OpenAI clients always send one) changes nothing."""
    agent = start_agent_server(tmp_path / "a")
    try:
        with httpx.Client(base_url=agent.url, timeout=60) as c:
            assert c.post("/api/v1/execute", json={"command": "1 + 1"}).json()["value"] == 2
            r = c.post("/api/v1/execute", json={"command": "1 + 1"}, headers=bearer("anything"))
            assert r.json()["value"] == 2
            assert c.get("/api/v1/keys").status_code == 200
            assert c.get("/api/v1/usage").json()["key"]["id"] == "admin"
    finally:
        agent.stop()
