"""The keys, usage and audit routes over HTTP, and the audit log's call sites: keys made,
changed, rotated and revoked; marketplace publishes; model pulls and deletes (approvals are
in test_keys_tenants). A change made through one server applies on the other within a
second."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conch import db
from tests.web.agent_fixtures import AgentServer, start_agent_server
from tests.web.conftest import RunningServer, start_server
from tests.web.keys_support import ADMIN, ADMIN_KEY, bearer, make_key

KEYS = "/api/v1/keys"


@dataclass
class Pair:
    agent: AgentServer
    inference: RunningServer

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.agent.url, headers=ADMIN, timeout=60)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    data = tmp_path_factory.mktemp("keys-api")
    agent = start_agent_server(data, admin_key=ADMIN_KEY)
    inference, server, thread = start_server(data, admin_key=ADMIN_KEY)
    yield Pair(agent, inference)
    agent.stop()
    server.should_exit = True
    thread.join(timeout=30)
    db.dispose_all()


def _until(check: Any, timeout: float = 1.0) -> float:
    """Seconds until ``check()`` holds (fails after ``timeout``)."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, "not within the time allowed"
        time.sleep(0.02)
    return time.monotonic() - start


def test_create_list_show_patch_rotate_revoke(pair: Pair) -> None:
    with pair.admin() as c:
        r = c.post(KEYS, json={"name": "ci", "tenant": "acme", "scopes": ["execute", "inference"],
                               "limits": {"requests_per_minute": 100, "tokens_per_day": 5000},
                               "models": ["local:*"]})  # fmt: skip
        assert r.status_code == 201, r.text
        made = r.json()
        secret, key_id = made["secret"], made["id"]
        assert secret.startswith("ck-") and made["prefix"] == secret[:11]
        assert made["status"] == "active" and made["created_by"] == "admin"
        # The secret is shown once: never in a list or a read.
        listed = c.get(KEYS).json()
        assert key_id in {k["id"] for k in listed} and secret not in str(listed)
        assert "secret" not in c.get(f"{KEYS}/{key_id}").json()
        assert [k["id"] for k in c.get(KEYS, params={"tenant": "acme"}).json()] == [key_id]

        # The key works on both servers.
        with httpx.Client(headers=bearer(secret), timeout=60) as k:
            assert k.post(pair.agent.url + "/api/v1/execute", json={"command": "1"}).status_code == 200
            assert k.get(pair.inference.url + "/v1/models").status_code == 200

            # A patch on the agent server applies on the inference server within a second.
            r = c.patch(f"{KEYS}/{key_id}", json={"scopes": ["execute"], "limits": {"tokens_per_day": None}})
            assert r.status_code == 200, r.text
            assert r.json()["scopes"] == ["execute"]
            assert r.json()["limits"] == {"requests_per_minute": 100}
            took = _until(lambda: k.get(pair.inference.url + "/v1/models").status_code == 403)
            assert took < 1.0

            # Rotation: a new secret; the old one is refused at once here and within a
            # second there; usage stays with the key.
            r = c.post(f"{KEYS}/{key_id}/rotate")
            assert r.status_code == 200 and r.json()["secret"] != secret
            new = r.json()["secret"]
            assert k.post(pair.agent.url + "/api/v1/execute", json={"command": "1"}).status_code == 401
            _until(lambda: k.get(pair.inference.url + "/v1/models").status_code == 401)
            with httpx.Client(headers=bearer(new), timeout=60) as k2:
                assert k2.post(pair.agent.url + "/api/v1/execute", json={"command": "1"}).status_code == 200
                usage = k2.get(pair.agent.url + "/api/v1/usage").json()
                rpm = {u["limit"]: u for u in usage["limits"]}["requests_per_minute"]
                # The requests made with the old secret still count: rotation keeps windows.
                assert rpm["used"] >= 3 and rpm["remaining"] == 100 - rpm["used"]
                assert rpm["resets_at"] is not None and rpm["window_s"] == 60

                r = c.delete(f"{KEYS}/{key_id}")
                assert r.status_code == 200 and r.json()["status"] == "revoked"
                assert k2.post(pair.agent.url + "/api/v1/execute", json={"command": "1"}).status_code == 401
                _until(lambda: k2.get(pair.inference.url + "/v1/models").status_code == 401)
        # A revoked key stays revoked.
        assert c.post(f"{KEYS}/{key_id}/rotate").status_code == 409
        assert c.patch(f"{KEYS}/{key_id}", json={"name": "back"}).status_code == 409


def test_bad_requests_name_the_field(pair: Pair) -> None:
    with pair.admin() as c:
        cases = [
            ({"scopes": []}, "name"),
            ({"name": "x"}, "scopes"),
            ({"name": "x", "scopes": ["root"]}, "scopes[0]"),
            ({"name": "x", "scopes": [], "limits": {"tokens_per_week": 1}}, "limits.tokens_per_week"),
            ({"name": "x", "scopes": [], "limits": {"requests_per_minute": -1}}, "limits.requests_per_minute"),
            ({"name": "x", "scopes": [], "colour": "red"}, "colour"),
            ({"name": "x", "scopes": [], "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
            ({"name": "x", "scopes": [], "tenant": "key:other"}, "tenant"),
        ]
        for body, where in cases:
            r = c.post(KEYS, json=body)
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"]["where"] == where, (body, r.json())
        key_id = c.post(KEYS, json={"name": "x", "scopes": []}).json()["id"]
        r = c.patch(f"{KEYS}/{key_id}", json={"tenant": "other"})
        assert r.status_code == 400 and r.json()["error"]["where"] == "tenant"
        assert c.get(f"{KEYS}/key_nope").status_code == 404
        assert c.post(KEYS, content=b"{not json").status_code == 400


def test_usage_is_the_callers_own(pair: Pair) -> None:
    key_id, secret = make_key(pair.agent.url, name="usage", scopes=["execute"],
                              limits={"runs_per_minute": 10, "concurrent_runs": 2})  # fmt: skip
    other_id, _ = make_key(pair.agent.url, name="other", scopes=[])
    with httpx.Client(base_url=pair.agent.url, headers=bearer(secret), timeout=60) as c:
        c.post("/api/v1/execute", json={"command": "1"})
        mine = c.get("/api/v1/usage").json()
        assert mine["key"] == {"id": key_id, "name": "usage", "tenant": None}
        limits = {u["limit"]: u for u in mine["limits"]}
        assert limits["runs_per_minute"]["used"] == 1 and limits["runs_per_minute"]["max"] == 10
        assert limits["concurrent_runs"] == {"limit": "concurrent_runs", "max": 2, "used": 0,
                                             "remaining": 2, "window_s": None, "resets_at": None}  # fmt: skip
        r = c.get("/api/v1/usage", params={"key": other_id})
        assert r.status_code == 403 and r.json()["error"]["where"] == "key"
    with pair.admin() as admin:
        assert admin.get("/api/v1/usage", params={"key": key_id}).json()["key"]["id"] == key_id
        assert admin.get("/api/v1/usage", params={"key": "key_none"}).status_code == 404


def test_usage_says_what_the_key_may_do(pair: Pair, tmp_path: Path) -> None:
    """The studio reads a key's scopes from its usage: scopes, whether it is an admin, and
    whether the server needs a key at all."""
    _, secret = make_key(pair.agent.url, name="scoped", scopes=["inference", "execute"])
    with httpx.Client(base_url=pair.agent.url, headers=bearer(secret), timeout=60) as c:
        body = c.get("/api/v1/usage").json()
        assert body["scopes"] == ["execute", "inference"]
        assert body["admin"] is False and body["open"] is False
    with pair.admin() as admin:
        body = admin.get("/api/v1/usage").json()
        assert body["admin"] is True and "admin" in body["scopes"] and body["open"] is False
    open_server = start_agent_server(tmp_path / "open")
    try:
        body = httpx.get(open_server.url + "/api/v1/usage", timeout=60).json()
        assert body["open"] is True and body["admin"] is True
    finally:
        open_server.stop()


def test_the_audit_log(pair: Pair) -> None:
    with pair.admin() as c:
        since = time.time()
        key_id = c.post(KEYS, json={"name": "audited", "scopes": ["execute"]}).json()["id"]
        c.patch(f"{KEYS}/{key_id}", json={"limits": {"runs_per_minute": 5}})
        c.post(f"{KEYS}/{key_id}/rotate")
        c.delete(f"{KEYS}/{key_id}")
        page = c.get("/api/v1/audit", params={"target": f"key:{key_id}"}).json()
        actions = [e["action"] for e in page["entries"]]
        assert actions == ["key.revoked", "key.rotated", "key.changed", "key.created"]
        changed = page["entries"][2]
        assert changed["details"] == {"limits": {"from": {}, "to": {"runs_per_minute": 5}}}
        assert changed["actor"] == {"id": "admin", "name": "admin", "tenant": None}
        assert "secret" not in str(page)
        # Filters and keyset pagination: newest first, a page never repeats an entry.
        first = c.get("/api/v1/audit", params={"since": since, "limit": 2}).json()
        assert len(first["entries"]) == 2 and first["next_before"] is not None
        second = c.get("/api/v1/audit", params={"since": since, "limit": 2,
                                                "before": first["next_before"]}).json()  # fmt: skip
        ids = [e["id"] for e in first["entries"] + second["entries"]]
        assert ids == sorted(ids, reverse=True) and len(set(ids)) == 4
        only = c.get("/api/v1/audit", params={"action": "key.rotated", "target": "key:*"}).json()
        assert only["entries"] and {e["action"] for e in only["entries"]} == {"key.rotated"}
        assert c.get("/api/v1/audit", params={"action": "key.eaten"}).status_code == 400
        assert c.get("/api/v1/audit", params={"until": since - 3600}).json()["entries"] == []


def test_marketplace_publishes_are_audited(pair: Pair) -> None:
    key_id, secret = make_key(pair.agent.url, name="publisher", tenant="acme",
                              scopes=["marketplace:publish"])  # fmt: skip
    body = {"name": "audited-agent", "description": "d", "system_prompt": "p", "tools": ["len"],
            "model": "local:smollm2-135m-instruct", "category": "data", "tags": []}  # fmt: skip
    r = httpx.post(pair.agent.url + "/api/v1/marketplace/publish", json=body, headers=bearer(secret), timeout=60)
    assert r.status_code == 201, r.text
    with pair.admin() as c:
        entries = c.get("/api/v1/audit", params={"action": "marketplace.published"}).json()["entries"]
    entry = entries[0]
    assert entry["target"] == f"agent:audited-agent@{r.json()['version']}"
    assert entry["actor"] == {"id": key_id, "name": "publisher", "tenant": "acme"}
    assert entry["details"]["digest"] == r.json()["digest"]
    # Installing is the admin's.
    r = httpx.post(pair.agent.url + "/api/v1/marketplace/install", json={"name": "audited-agent"},
                   headers=bearer(secret), timeout=60)  # fmt: skip
    assert r.status_code == 403 and "'admin'" in r.json()["error"]["message"]


def test_model_pulls_and_deletes_are_audited(pair: Pair, tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    from tests.inference.sources.conftest import make_small_gguf

    path = tmp_path / "tiny.gguf"
    make_small_gguf(path)
    key_id, secret = make_key(pair.agent.url, name="puller", scopes=["models:write", "inference"])
    with httpx.Client(base_url=pair.inference.url, headers=bearer(secret), timeout=120) as c:
        r = c.post("/v1/models/audit-tiny/download", json={"source": "file", "path": str(path)})
        assert r.status_code == 201, r.text
        r = c.post("/api/pull", json={"model": "audit-tiny-2", "source": "file", "path": str(path),
                                      "stream": False})  # fmt: skip
        assert r.status_code == 200, r.text
        assert c.delete("/v1/models/audit-tiny").status_code == 200
        assert c.request("DELETE", "/api/delete", json={"model": "audit-tiny-2"}).status_code == 200
    with pair.admin() as admin:
        entries = admin.get("/api/v1/audit", params={"actor": key_id}).json()["entries"]
    got = [(e["action"], e["target"], e["details"].get("source")) for e in reversed(entries)]
    assert got == [
        ("model.pulled", "model:audit-tiny", "file"),
        ("model.pulled", "model:audit-tiny-2", "file"),
        ("model.deleted", "model:audit-tiny", None),
        ("model.deleted", "model:audit-tiny-2", None),
    ]
