"""The checkpoint number a running task keeps (``store.CheckpointSeq``) instead of reading
``max(seq)`` in each transaction: read at the first write, advanced only by writes that
committed, never by refused ones, and a wrong one fails its transaction rather than overwrite
an entry. On PostgreSQL (each write in a worker thread) the concurrent calls of a native turn
still number their entries one after another."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from conch.db import create_engine, migrate
from conch.orchestration.store import CheckpointSeq, Stores
from tests.orchestration.test_checkpoints import checkpoint
from testsupport.scripted_model import ScriptedModel, call, native
from testsupport.servers import finished, wait_for

pytestmark = pytest.mark.timeout(240)

API = "/api/v1/orchestration"


@pytest.fixture()
def store(tmp_path: Path) -> Any:
    engine = create_engine(f"sqlite:///{tmp_path / 'conch.db'}")
    migrate(engine)
    yield Stores(engine)
    engine.dispose()


def running(store: Stores, id: str, owner: str = "me") -> None:
    store.tasks.insert_task(
        {"id": id, "goal": "g", "tools": ["len"], "max_steps": 5, "agent": "default",
         "model": "m", "status": "pending", "steps": [], "usage": {},
         "created_at": time.time(), "origin": "api"},
        [("message", {"before": 0, "content": "copied"})],  # as a fork's copy
    )  # fmt: skip
    assert store.tasks.start_task(id, owner, time.time() + 60)


def seqs(store: Stores, id: str) -> list[tuple[int, str]]:
    return [(e["seq"], e["kind"]) for e in store.checkpoints.checkpoint_entries(id) or []]


def step(i: int) -> dict[str, Any]:
    return {"index": i, "action": "len", "args": {"value": [i]}, "observation": "1"}


def test_read_once_then_kept(store: Stores) -> None:
    running(store, "t1")
    seq = CheckpointSeq()
    assert store.checkpoints.add_checkpoint("t1", "me", [("model", {"turn": 0}), ("call", {"index": 0})], seq)
    assert seq.last == 3  # read at the first write: after the copied entry
    assert store.tasks.add_task_step("t1", step(0), {"n": 1}, [("result", {"index": 0})], "me", seq)
    assert seq.last == 4
    assert store.tasks.add_task_step("t1", step(1), {"n": 2}, None, "me", seq)  # no entries
    assert seq.last == 4
    assert store.checkpoints.add_checkpoint("t1", "me", [("model", {"turn": 2})], seq)
    assert seq.last == 5
    assert seqs(store, "t1") == [
        (1, "message"), (2, "model"), (3, "call"), (4, "result"), (5, "model")
    ]  # fmt: skip
    record = store.tasks.get_task("t1")
    assert record is not None
    assert record["steps"] == [step(0), step(1)] and record["usage"] == {"n": 2}
    events = [e for _, e, _ in store.db.events_after("task:t1", 0)]
    assert events == ["start", "step", "step"]


def test_refused_writes_leave_it(store: Stores) -> None:
    running(store, "t2")
    seq = CheckpointSeq()
    assert store.checkpoints.add_checkpoint("t2", "me", [("model", {"turn": 0})], seq)
    assert seq.last == 2
    # Another owner (the task was taken over), then a cancelled task: nothing written.
    assert not store.checkpoints.add_checkpoint("t2", "other", [("call", {"index": 0})], seq)
    assert not store.tasks.add_task_step("t2", step(0), {}, [("result", {})], "other", seq)
    assert seq.last == 2
    store.tasks.finish_task("t2", "cancelled")
    assert not store.checkpoints.add_checkpoint("t2", "me", [("call", {"index": 0})], seq)
    assert not store.tasks.add_task_step("t2", step(0), {}, [("result", {})], "me", seq)
    assert seq.last == 2
    assert seqs(store, "t2") == [(1, "message"), (2, "model")]
    assert store.tasks.get_task("t2")["steps"] == []  # type: ignore[index]


def test_a_wrong_number_fails_and_writes_nothing(store: Stores) -> None:
    running(store, "t3")
    stale = CheckpointSeq(0)  # as if the copied entry were not there
    with pytest.raises(sa.exc.IntegrityError):
        store.tasks.add_task_step("t3", step(0), {"n": 1}, [("result", {"index": 0})], "me", stale)
    assert stale.last == 0
    # The whole step's transaction rolled back: no step, no event, the entry kept.
    assert store.tasks.get_task("t3")["steps"] == []  # type: ignore[index]
    assert [e for _, e, _ in store.db.events_after("task:t3", 0)] == ["start"]
    assert seqs(store, "t3") == [(1, "message")]
    # Without a number (other callers) it is read in the transaction, as before.
    assert store.checkpoints.add_checkpoint("t3", "me", [("model", {"turn": 0})])
    assert store.tasks.add_task_step("t3", step(0), {}, [("result", {"index": 0})], "me")
    assert seqs(store, "t3") == [(1, "message"), (2, "model"), (3, "result")]


def test_concurrent_native_calls_on_postgres(tmp_path: Path, scripted: ScriptedModel) -> None:
    """Three calls of one native turn end at different times, each result written as it
    ends (on PostgreSQL from worker threads): every entry once, numbered 1..n."""
    from tests.orchestration.pg import postgres_cluster
    from testsupport.servers import start_thread_server

    model = "native-tools"
    scripted.tool_models.add(model)
    goal = scripted.script(
        "checkpoint seq: three calls at once on postgres",
        native(call("sleep", ms=300), call("sleep", ms=10), call("sleep", ms=150)),
        native(call("sleep", ms=1), call("sleep", ms=2)),
        {"content": "slept"},
    )
    with postgres_cluster(tmp_path) as url:
        srv = start_thread_server(tmp_path / "data", database_url=url, models_url=scripted.v1)
        try:
            with srv.client() as c:
                r = c.post(f"{API}/tasks", json={"goal": goal, "model": model, "tools": ["sleep"]})
                assert r.status_code == 201, r.text
                record = wait_for(c, f"{API}/tasks/{r.json()['id']}", finished, 60)
                entries = checkpoint(c, record["id"])
        finally:
            srv.stop()
    assert record["status"] == "succeeded" and record["result"] == "slept", record
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    kinds = [e["kind"] for e in entries]
    assert kinds.count("model") == 3 and kinds.count("call") == 5 and kinds.count("result") == 5
    results = [e["data"]["call_id"] for e in entries if e["kind"] == "result"]
    assert sorted(results) == sorted(e["data"]["call_id"] for e in entries if e["kind"] == "call")
    assert results[:3] == ["call_0_1", "call_0_2", "call_0_0"]  # as they ended
