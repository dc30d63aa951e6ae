"""Two ``conch serve`` processes on one PostgreSQL database: they share workflows (created on
one, visible and cancellable on the other) and no step runs twice; a task whose server dies
is resumed from its checkpoint by the other, and a waiting task is approved there."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from tests.orchestration.pg import postgres_cluster
from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import finished, start_process_server, wait_for

pytestmark = pytest.mark.timeout(300)

API = "/api/v1/orchestration"


def test_two_servers_share_one_database(tmp_path: Path) -> None:
    with postgres_cluster(tmp_path) as url:
        env = {"database_url": url, "orchestration_lease_s": "3", "workers": "2"}
        a = start_process_server(tmp_path / "a", tmp_path / "a.log", **env)
        b = start_process_server(tmp_path / "b", tmp_path / "b.log", **env)
        try:
            n = 40
            steps = [{"id": "root", "run": "0"}]
            steps += [
                {
                    "id": f"s{i}",
                    "depends_on": ["root"],
                    "run": f'append("ran.log", "s{i}\\n"); sleep(50); {i}',
                }
                for i in range(n)
            ]
            steps.append(
                {
                    "id": "sum",
                    "depends_on": [f"s{i}" for i in range(n)],
                    "run": "steps | values | map(fn(s) => s.result) | sum",
                }
            )
            with a.client() as ca, b.client() as cb:
                wf = ca.post(f"{API}/workflows", json={"name": "shared", "steps": steps})
                assert wf.status_code == 201, wf.text
                wf_id = wf.json()["id"]
                assert cb.get(f"{API}/workflows/{wf_id}").status_code == 200
                done = wait_for(cb, f"{API}/workflows/{wf_id}", finished, 120)
                assert done["status"] == "succeeded", done
                by_id = {s["id"]: s for s in done["steps"]}
                assert by_id["sum"]["result"] == sum(range(n))
                assert all(s["attempts"] == 1 for s in done["steps"])
                ran: Counter[str] = Counter()
                for ws in (tmp_path / "a" / "workspace", tmp_path / "b" / "workspace"):
                    log = ws / "ran.log"
                    if log.exists():
                        ran.update(log.read_text().split())
                assert ran == Counter({f"s{i}": 1 for i in range(n)})

                # Created on A, cancelled on B while A or B runs its long step.
                long = ca.post(
                    f"{API}/workflows",
                    json={
                        "steps": [
                            {"id": "long", "run": "sleep(30000); 1"},
                            {"id": "after", "depends_on": ["long"], "run": "2"},
                        ]
                    },
                ).json()
                wait_for(
                    cb,
                    f"{API}/workflows/{long['id']}",
                    lambda w: w["steps"][0]["status"] == "running",
                    30,
                )
                r = cb.post(f"{API}/workflows/{long['id']}/cancel")
                assert r.status_code == 200 and r.json()["status"] == "cancelled"
                assert ca.post(f"{API}/workflows/{long['id']}/cancel").status_code == 409
                # The server running the step stops it: both pools serve at once again.
                time.sleep(2.5)
                quick = ca.post(
                    f"{API}/workflows",
                    json={"steps": [{"id": "q", "run": "1"}, {"id": "r", "run": "2"}]},
                ).json()
                assert (
                    wait_for(ca, f"{API}/workflows/{quick['id']}", finished, 20)["status"]
                    == "succeeded"
                )
                assert (
                    ca.get(f"{API}/workflows/{long['id']}").json()["steps"][1]["status"]
                    == "skipped"
                )
                assert cb.get(f"{API}/metrics").json()["total_workflows"] == 3
        finally:
            a.stop()
            b.stop()


def test_tasks_resume_and_wait_across_servers(tmp_path: Path, scripted: ScriptedModel) -> None:
    """A task whose server is killed between two tool calls is resumed from its checkpoint by
    the other server once the lease runs out; a task waiting for an approval on the dead
    server is approved, and run, on the other."""
    with postgres_cluster(tmp_path) as url:
        env = {"database_url": url, "orchestration_lease_s": "3", "models_url": scripted.v1}
        a = start_process_server(tmp_path / "a", tmp_path / "a.log", **env)
        b = start_process_server(tmp_path / "b", tmp_path / "b.log", **env)
        between = scripted.script_by_position(
            "postgres: between two calls",
            tool("append", path="pg.log", content="1\n"),
            {"delay_first": 10, "content": tool("append", path="pg.log", content="2\n")},
            final("pg done"),
        )
        asking = scripted.script_by_position(
            "postgres: waiting", tool("append", path="asked.log", content="yes\n"), final("ok")
        )
        try:
            with a.client() as ca:
                t1 = ca.post(f"{API}/tasks", json={"goal": between, "tools": ["append"]}).json()
                t2 = ca.post(
                    f"{API}/tasks",
                    json={"goal": asking, "tools": ["append"],
                          "approvals": {"effects": {"write": "ask"}}},
                ).json()  # fmt: skip
                wait_for(ca, f"{API}/tasks/{t2['id']}", lambda t: t["status"] == "waiting", 30)
                wait_for(ca, f"{API}/tasks/{t1['id']}", lambda t: len(t["steps"]) == 1, 30)
                deadline = time.monotonic() + 30
                while len(scripted.requests_for(between)) < 2:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            a.kill()
            with b.client() as cb:
                r = cb.post(f"{API}/tasks/{t2['id']}/approve")
                assert r.status_code == 200, r.text
                done2 = wait_for(cb, f"{API}/tasks/{t2['id']}", finished, 30)
                done1 = wait_for(cb, f"{API}/tasks/{t1['id']}", finished, 60)
                events = cb.get(f"{API}/tasks/{t1['id']}/events").text
        finally:
            a.stop()
            b.stop()
    assert done1["status"] == "succeeded", done1
    assert [s["action"] for s in done1["steps"]] == ["append", "append", "final"]
    # Each line once, the first by A before it died, the second by B after it took over.
    assert (tmp_path / "a" / "workspace" / "pg.log").read_text() == "1\n"
    assert (tmp_path / "b" / "workspace" / "pg.log").read_text() == "2\n"
    at = Counter(
        sum(1 for m in r["messages"] if m["role"] == "assistant")
        for r in scripted.requests_for(between)
    )
    assert at == Counter({0: 1, 1: 2, 2: 1})  # position 1 was in flight when A died
    assert '"reason":"recovered"' in events
    assert done2["status"] == "succeeded", done2
    assert (tmp_path / "b" / "workspace" / "asked.log").read_text() == "yes\n"
    assert not (tmp_path / "a" / "workspace" / "asked.log").exists()
    assert len(scripted.requests_for(asking)) == 2
