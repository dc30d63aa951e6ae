"""Tenants own their things: tasks, threads, workflows, approvals, registered agents, chats
and sessions belong to the tenant of the key that made them. Another tenant gets ``404``
for them and never sees them listed, searched, counted or streamed; the admin sees all. A
key made without a tenant is a tenant of its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from conch import db
from tests.web.keys_support import ADMIN, ADMIN_KEY, bearer, make_key
from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import Server, finished, start_thread_server, wait_for

API = "/api/v1/orchestration"
ORCH = ["orchestration"]


@dataclass
class Tenants:
    server: Server
    a: httpx.Client  # tenant acme
    b: httpx.Client  # tenant beta
    solo: httpx.Client  # a key without a tenant
    admin: httpx.Client


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory, scripted: ScriptedModel) -> Iterator[Tenants]:
    server = start_thread_server(tmp_path_factory.mktemp("tenants"), models_url=scripted.v1,
                                 admin_key=ADMIN_KEY, wall_time_s=5.0)  # fmt: skip
    scopes = ["orchestration", "approve", "inference", "execute"]
    clients = []
    for name, tenant in (("a", "acme"), ("b", "beta"), ("solo", None)):
        _kid, secret = make_key(server.url, name=name, tenant=tenant, scopes=scopes)
        clients.append(httpx.Client(base_url=server.url, headers=bearer(secret), timeout=60))
    admin = httpx.Client(base_url=server.url, headers=ADMIN, timeout=60)
    yield Tenants(server, *clients, admin)
    for c in (*clients, admin):
        c.close()
    server.stop()
    db.dispose_all()


def _task(c: httpx.Client, goal: str, **body: Any) -> dict[str, Any]:
    r = c.post(f"{API}/tasks", json={"goal": goal, "tools": [], "max_steps": 3, **body})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def _not_found(r: httpx.Response) -> None:
    assert r.status_code == 404, r.text
    assert r.json()["success"] is False


def test_tasks(tenants: Tenants, scripted: ScriptedModel) -> None:
    goal = scripted.script("tenants: acme's task", final("acme's answer"))
    task = _task(tenants.a, goal)
    assert task["tenant"] == "acme"
    tid = task["id"]
    wait_for(tenants.a, f"{API}/tasks/{tid}", finished)
    for other in (tenants.b, tenants.solo):
        _not_found(other.get(f"{API}/tasks/{tid}"))
        _not_found(other.get(f"{API}/tasks/{tid}/events"))
        _not_found(other.get(f"{API}/tasks/{tid}/checkpoint"))
        _not_found(other.post(f"{API}/tasks/{tid}/cancel"))
        _not_found(other.post(f"{API}/tasks/{tid}/fork", json={"checkpoint": 0}))
        assert tid not in {t["id"] for t in other.get(f"{API}/tasks").json()}
    assert tenants.a.get(f"{API}/tasks/{tid}").json()["result"] == "acme's answer"
    assert tid in {t["id"] for t in tenants.a.get(f"{API}/tasks").json()}
    assert "event: complete" in tenants.a.get(f"{API}/tasks/{tid}/events").text
    # The admin sees every tenant's.
    assert tenants.admin.get(f"{API}/tasks/{tid}").status_code == 200
    assert tid in {t["id"] for t in tenants.admin.get(f"{API}/tasks").json()}
    # A fork is its maker's.
    fork = tenants.a.post(f"{API}/tasks/{tid}/fork", json={"checkpoint": 0})
    assert fork.status_code == 201 and fork.json()["tenant"] == "acme"


def test_a_key_without_a_tenant_is_a_tenant_of_its_own(tenants: Tenants, scripted: ScriptedModel) -> None:
    mine = _task(tenants.solo, scripted.script("tenants: solo's task", final("solo")))
    assert mine["tenant"].startswith("key:")
    admins = _task(tenants.admin, scripted.script("tenants: the admin's task", final("admin")))
    assert admins["tenant"] is None
    _not_found(tenants.solo.get(f"{API}/tasks/{admins['id']}"))
    _not_found(tenants.a.get(f"{API}/tasks/{admins['id']}"))
    _not_found(tenants.a.get(f"{API}/tasks/{mine['id']}"))
    assert tenants.admin.get(f"{API}/tasks/{mine['id']}").status_code == 200


def test_threads_are_a_tenants_own(tenants: Tenants, scripted: ScriptedModel) -> None:
    """Two tenants using one thread id have two threads: neither continues the other's
    conversation, nor reads it."""
    goal_a = scripted.script("tenants: acme's secret plan", final("plan A"))
    first = _task(tenants.a, goal_a, thread_id="shared-name")
    wait_for(tenants.a, f"{API}/tasks/{first['id']}", finished)
    goal_b = scripted.script("tenants: beta in the same thread id", final("B"))
    second = _task(tenants.b, goal_b, thread_id="shared-name")
    wait_for(tenants.b, f"{API}/tasks/{second['id']}", finished)
    asked = scripted.requests_for(goal_b)
    assert asked and "secret plan" not in json.dumps(asked[0]["messages"])
    thread_b = tenants.b.get(f"{API}/threads/shared-name").json()
    assert [t["id"] for t in thread_b["tasks"]] == [second["id"]]
    thread_a = tenants.a.get(f"{API}/threads/shared-name").json()
    assert [t["id"] for t in thread_a["tasks"]] == [first["id"]]
    _not_found(tenants.solo.get(f"{API}/threads/shared-name"))


def test_workflows(tenants: Tenants) -> None:
    wf = {"name": "acme's flow", "steps": [{"id": "one", "run": "1 + 1"}]}
    r = tenants.a.post(f"{API}/workflows", json=wf)
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    assert r.json()["tenant"] == "acme"
    wait_for(tenants.a, f"{API}/workflows/{wid}", lambda w: w["status"] == "succeeded")
    for other in (tenants.b, tenants.solo):
        _not_found(other.get(f"{API}/workflows/{wid}"))
        _not_found(other.get(f"{API}/workflows/{wid}/events"))
        _not_found(other.post(f"{API}/workflows/{wid}/cancel"))
        assert wid not in {w["id"] for w in other.get(f"{API}/workflows").json()}
    assert wid in {w["id"] for w in tenants.admin.get(f"{API}/workflows").json()}


def test_a_workflows_tasks_are_its_tenants(tenants: Tenants, scripted: ScriptedModel) -> None:
    goal = scripted.script("tenants: a step's task", final("stepped"))
    wf = {"name": "with a task", "steps": [{"id": "t", "task": {"goal": goal, "tools": []}}]}
    wid = tenants.b.post(f"{API}/workflows", json=wf).json()["id"]
    done = wait_for(tenants.b, f"{API}/workflows/{wid}", lambda w: w["status"] == "succeeded")
    task_id = done["steps"][0]["task_id"]
    assert tenants.b.get(f"{API}/tasks/{task_id}").json()["tenant"] == "beta"
    _not_found(tenants.a.get(f"{API}/tasks/{task_id}"))


def test_approvals(tenants: Tenants, scripted: ScriptedModel) -> None:
    """Another tenant cannot see or decide a waiting call; the tenant's key needs approve;
    the decision is in the audit log with the deciding key and the edited arguments."""
    goal = scripted.script(
        "tenants: write with approval", tool("append", path="tenant.log", content="hi\n"),
        final("written"),
    )  # fmt: skip
    task = _task(tenants.a, goal, tools=["append"], approvals={"effects": {"write": "ask"}})
    tid = task["id"]
    waiting = wait_for(tenants.a, f"{API}/tasks/{tid}", lambda t: t["status"] == "waiting")
    call_id = waiting["pending"][0]["call_id"]
    _not_found(tenants.b.post(f"{API}/tasks/{tid}/approve"))
    _not_found(tenants.b.post(f"{API}/tasks/{tid}/reject"))
    # An agent's own key (orchestration, no approve) cannot decide.
    _kid, agent_key = make_key(tenants.server.url, name="agent", tenant="acme", scopes=ORCH)
    r = httpx.post(f"{tenants.server.url}{API}/tasks/{tid}/approve", headers=bearer(agent_key))
    assert r.status_code == 403 and "'approve'" in r.json()["error"]["message"]
    approver_id, approver = make_key(tenants.server.url, name="approver", tenant="acme",
                                     scopes=["approve"])  # fmt: skip
    edited = {"path": "tenant.log", "content": "edited\n"}
    r = httpx.post(f"{tenants.server.url}{API}/tasks/{tid}/approve", headers=bearer(approver),
                   json={"args": edited}, timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    wait_for(tenants.a, f"{API}/tasks/{tid}", finished)
    entries = tenants.admin.get("/api/v1/audit", params={"action": "approval.decided",
                                                         "target": f"task:{tid}"}).json()["entries"]  # fmt: skip
    assert len(entries) == 1
    entry = entries[0]
    assert entry["actor"] == {"id": approver_id, "name": "approver", "tenant": "acme"}
    assert entry["details"]["call_id"] == call_id
    assert entry["details"]["decision"] == "approved"
    assert entry["details"]["tool"] == "append"
    assert entry["details"]["arguments"] == {"path": "tenant.log", "content": "hi\n"}
    assert entry["details"]["edited_arguments"] == edited


def test_agents(tenants: Tenants) -> None:
    body = {"id": "acme-helper", "system_prompt": "help acme", "tools": ["len"]}
    r = tenants.a.post(f"{API}/agents", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["tenant"] == "acme"
    assert "acme-helper" in {x["id"] for x in tenants.a.get(f"{API}/agents").json()}
    for other in (tenants.b, tenants.solo):
        assert "acme-helper" not in {x["id"] for x in other.get(f"{API}/agents").json()}
        _not_found(other.get(f"{API}/agents/acme-helper"))
        _not_found(other.delete(f"{API}/agents/acme-helper"))
        # The id is taken: another tenant cannot register over it.
        r = other.post(f"{API}/agents", json={**body, "system_prompt": "hijack"})
        assert r.status_code == 409, r.text
        r = other.post(f"{API}/tasks", json={"goal": "use it", "agent": "acme-helper", "tools": []})
        assert r.status_code == 400 and "no agent" in r.text
    assert tenants.a.get(f"{API}/agents/acme-helper").json()["system_prompt"] == "help acme"
    assert "acme-helper" in {x["id"] for x in tenants.admin.get(f"{API}/agents").json()}
    # Everyone sees the built-in agent.
    assert "default" in {x["id"] for x in tenants.b.get(f"{API}/agents").json()}


def test_metrics_count_the_tenants_own(tenants: Tenants, scripted: ScriptedModel) -> None:
    fresh = make_key(tenants.server.url, name="fresh", tenant="fresh-tenant", scopes=ORCH)[1]
    c = httpx.Client(base_url=tenants.server.url, headers=bearer(fresh), timeout=60)
    before = c.get(f"{API}/metrics").json()
    assert before["completed_tasks"] == 0 and before["total_workflows"] == 0
    task = _task(c, scripted.script("tenants: fresh's one task", final("one")))
    wait_for(c, f"{API}/tasks/{task['id']}", finished)
    assert c.get(f"{API}/metrics").json()["completed_tasks"] == 1
    assert tenants.admin.get(f"{API}/metrics").json()["completed_tasks"] > 1
    c.close()


def test_chats(tenants: Tenants) -> None:
    r = tenants.a.post("/api/v1/chats", json={"title": "acme roadmap", "messages": [
        {"id": "m1", "role": "user", "content": "the zebra project ships in spring"}]})
    assert r.status_code == 201, r.text
    chat = r.json()
    cid = chat["id"]
    assert chat["tenant"] == "acme"
    assert [x["id"] for x in tenants.a.get("/api/v1/chats", params={"q": "zebra"}).json()["chats"]] == [cid]
    for other in (tenants.b, tenants.solo):
        _not_found(other.get(f"/api/v1/chats/{cid}"))
        _not_found(other.patch(f"/api/v1/chats/{cid}", json={"title": "mine now"}))
        _not_found(other.delete(f"/api/v1/chats/{cid}"))
        listed = other.get("/api/v1/chats").json()
        assert cid not in {x["id"] for x in listed["chats"]}
        assert other.get("/api/v1/chats", params={"q": "zebra"}).json() == {"total": 0, "chats": []}
    assert cid in {x["id"] for x in tenants.admin.get("/api/v1/chats", params={"q": "zebra"}).json()["chats"]}
    # Importing the same browser chat id as two tenants makes two chats.
    browser = {"id": "c-browser-1", "title": "t", "created": 1_700_000_000_000,
               "updated": 1_700_000_000_000, "settings": {}, "messages": []}  # fmt: skip
    ia = tenants.a.post("/api/v1/chats/import", json={"chats": [browser]}).json()["imported"][0]
    ib = tenants.b.post("/api/v1/chats/import", json={"chats": [browser]}).json()["imported"][0]
    assert ia["status"] == ib["status"] == "created" and ia["id"] != ib["id"]


def test_sessions_readers_never_read_every_tenant(tenants: Tenants) -> None:
    """What the sessions routes pass the sessions service as ``tenant``: the admin's reads
    are every tenant's (``None``); any other key's are its own tenant, never ``None``."""
    from conch.config import Settings
    from conch.sessions.service import SessionService

    service = SessionService.from_settings(Settings(data_dir=tenants.server.settings.data_dir))
    made = service.create(tenant="acme")
    from conch.keys import ADMIN_PRINCIPAL, Principal

    solo = Principal(key_id="key_1", name="solo", tenant=None, scopes=frozenset({"sessions"}))
    beta = Principal(key_id="key_2", name="b", tenant="beta", scopes=frozenset({"sessions"}))
    assert solo.reads == "key:key_1" and beta.reads == "beta" and ADMIN_PRINCIPAL.reads is None
    from conch.sessions.errors import SessionNotFound

    for p in (solo, beta):
        with pytest.raises(SessionNotFound):
            service.get(made.id, tenant=p.reads)
        assert made.id not in {s.id for s in service.list(tenant=p.reads)}
    assert service.get(made.id, tenant=ADMIN_PRINCIPAL.reads).id == made.id
    service.delete(made.id)
