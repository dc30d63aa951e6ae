"""Sessions running: a real sandbox pool, a real SQLite database, real workers bound to each
session's workspace (no HTTP: tests/web/test_agent_sessions.py drives the routes)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from conch.config import Settings
from conch.sandbox.jobs import Job
from conch.sandbox.pool import SandboxPool
from conch.sessions import runtime as runtime_module
from conch.sessions.errors import SessionNotFound
from conch.sessions.runtime import SessionRuntime
from conch.sessions.service import SessionService

Body = Callable[[SessionService, SessionRuntime, SandboxPool], Awaitable[Any]]


def _run(tmp_path: Path, body: Body, **overrides: Any) -> Any:
    overrides.setdefault("workers", 1)
    overrides.setdefault("session_spares", 1)
    overrides.setdefault("wall_time_s", 5.0)
    settings = Settings(data_dir=tmp_path / "data", **overrides)

    async def main() -> Any:
        pool = SandboxPool(settings)
        service = SessionService.from_settings(settings)
        await pool.start()
        runtime = SessionRuntime(service, pool)
        await runtime.start()
        try:
            return await body(service, runtime, pool)
        finally:
            await runtime.close()
            await pool.close()

    return asyncio.run(main())


async def _value(runtime: SessionRuntime, sid: str, source: str) -> Any:
    done, _unsaved = await runtime.run(sid, Job("program", source=source))
    assert done.success, done.error
    return done.value


def test_bindings_are_kept_from_run_to_run(tmp_path: Path) -> None:
    async def body(service: SessionService, runtime: SessionRuntime, pool: SandboxPool) -> None:
        sid = service.create().id
        assert await _value(runtime, sid, "let x = 41; let mut n = 1") is None
        assert await _value(runtime, sid, "x + n") == 42
        assert await _value(runtime, sid, "let f = fn(v) => v * x; f(2)") == 82
        assert await _value(runtime, sid, "f(1) + 1") == 42  # a function kept in memory
        # A pipeline's stages and a call's functions see the session's bindings.
        done, _ = await runtime.run(sid, Job("pipeline", input=[1, 2], steps=["map(fn(v) => v + x)"]))
        assert done.value == [42, 43]
        done, _ = await runtime.run(sid, Job("call", builtin="map", args=[[1], "fn(v) => v + x"]))
        assert done.value == [42]
        # Without the session, a run knows none of it.
        stateless = await pool.run(Job("program", source="x"))
        assert stateless.error is not None and stateless.error.kind == "NameError"
        # Saved: the documents on disk are the bindings' (a function is named unsaved by a
        # language without the saving API, and kept in memory either way).
        names = {b["name"] for b in service.state(sid).bindings()}
        assert {"x", "n"} <= names

    _run(tmp_path, body)


def test_what_cannot_be_saved_is_named_and_its_old_value_forgotten(tmp_path: Path) -> None:
    async def body(service: SessionService, runtime: SessionRuntime, pool: SandboxPool) -> None:
        sid = service.create().id
        await _value(runtime, sid, "let xs = [1, 2, 3]")
        assert [b["name"] for b in service.state(sid).bindings()] == ["xs"]
        done, unsaved = await runtime.run(sid, Job("program", source=(
            "let xs = range(0, 10) | map(fn(i) => i * 2)")))
        assert done.success
        assert [u["name"] for u in unsaved] == ["xs"]
        assert "lazy" in unsaved[0]["reason"]
        # The old [1, 2, 3] must not come back on a resume: it is gone from the saved state.
        assert service.state(sid).bindings() == []
        assert await _value(runtime, sid, "xs | take(2)") == [0, 2]  # still in memory

    _run(tmp_path, body)


def test_runs_of_one_session_go_in_arrival_order_and_sessions_in_parallel(tmp_path: Path) -> None:
    async def body(service: SessionService, runtime: SessionRuntime, pool: SandboxPool) -> None:
        a, b = service.create().id, service.create().id
        await _value(runtime, a, "let mut seen = []")
        runs = [runtime.run(a, Job("program", source=f"sleep(20); seen = seen + [{i}]"))
                for i in range(12)]
        await asyncio.gather(*runs)
        assert await _value(runtime, a, "seen") == list(range(12))
        # Two sessions: their runs overlap.
        await _value(runtime, b, "1")
        started = time.monotonic()
        await asyncio.gather(_value(runtime, a, "sleep(700)"), _value(runtime, b, "sleep(700)"))
        assert time.monotonic() - started < 1.3

    _run(tmp_path, body, session_spares=2)


def test_pause_ends_the_worker_and_the_next_run_resumes(tmp_path: Path) -> None:
    async def body(service: SessionService, runtime: SessionRuntime, pool: SandboxPool) -> None:
        sid = service.create().id
        await _value(runtime, sid, 'let mut total = 10; write("notes.txt", "kept")')
        pid = pool.session_pids()[0]
        paused = await runtime.pause(sid)
        assert paused.status == "paused" and paused.lease_owner is None
        assert pool.session_pids() == []
        for _ in range(100):
            if not os.path.exists(f"/proc/{pid}"):
                break
            await asyncio.sleep(0.02)
        assert not os.path.exists(f"/proc/{pid}"), "a paused session still holds a process"
        assert await _value(runtime, sid, 'total = total + 1; [total, cat("notes.txt")]') \
            == [11, "kept"]
        assert service.get(sid).status == "active"

    _run(tmp_path, body)


def test_an_idle_session_is_paused_and_holds_no_process(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_module, "TICK_S", 0.1)
    monkeypatch.setattr(runtime_module, "HOLD_S", 0.2)

    async def body(service: SessionService, runtime: SessionRuntime, pool: SandboxPool) -> None:
        sid = service.create().id
        await _value(runtime, sid, "let k = 7")
        assert len(pool.session_pids()) == 1
        await asyncio.sleep(0.5)
        # The lease is given back after HOLD_S, the worker kept until session_idle_s.
        assert service.get(sid).lease_owner is None and len(pool.session_pids()) == 1
        for _ in range(100):
            if service.get(sid).status == "paused":
                break
            await asyncio.sleep(0.05)
        assert service.get(sid).status == "paused"
        assert pool.session_pids() == []
        assert service.get(sid).runs == 1  # recorded before it was paused
        assert await _value(runtime, sid, "k * 6") == 42

    _run(tmp_path, body, session_idle_s=1.0)


def test_ttl_expiry_deletes_and_use_moves_it(tmp_path: Path) -> None:
    async def body(service: SessionService, runtime: SessionRuntime, pool: SandboxPool) -> None:
        sid = service.create(ttl_s=2).id
        first = service.get(sid).expires_at
        await asyncio.sleep(0.3)
        await _value(runtime, sid, "1")
        await runtime.pause(sid)
        assert service.get(sid).expires_at > first  # moved with use
        done = await runtime.sweep()
        assert sid not in done["expired"]
        await asyncio.sleep(2.2)
        done = await runtime.sweep()
        assert sid in done["expired"]
        with pytest.raises(SessionNotFound):
            service.get(sid)
        assert not service.dirs.exists(sid)
        with pytest.raises(SessionNotFound):
            await runtime.run(sid, Job("program", source="1"))

    _run(tmp_path, body)


def test_a_worker_lost_mid_run_resumes_from_the_last_save(tmp_path: Path) -> None:
    async def body(service: SessionService, runtime: SessionRuntime, pool: SandboxPool) -> None:
        sid = service.create().id
        await _value(runtime, sid, "let mut n = 1")
        task = asyncio.create_task(runtime.run(sid, Job("program", source="n = 2; sleep(5000)")))
        while not pool.busy_pids():
            await asyncio.sleep(0.01)
        os.kill(pool.busy_pids()[0], signal.SIGKILL)
        done, _unsaved = await task
        assert not done.success
        assert await _value(runtime, sid, "n") == 1  # the lost run's n = 2 was never saved

    _run(tmp_path, body)


def test_a_session_lowers_limits_and_permissions(tmp_path: Path) -> None:
    async def body(service: SessionService, runtime: SessionRuntime, pool: SandboxPool) -> None:
        low = service.create(limits={"steps": 1000}, allow_process=False).id
        done, _ = await runtime.run(low, Job("program", source="range(0, 100000) | map(fn(i) => i) | sum"))
        assert done.error is not None and done.error.kind == "LimitError"
        done, _ = await runtime.run(low, Job("program", source='run_process("true", [])'))
        assert done.error is not None and done.error.kind == "PermissionError"
        # A request may lower the session's limits further, never raise them.
        high = service.create().id
        done, _ = await runtime.run(high, Job("program", source="range(0, 5000) | map(fn(i) => i) | sum",
                                              limits={"steps": 100}))
        assert done.error is not None and done.error.kind == "LimitError"
        done, _ = await runtime.run(high, Job("program", source='run_process("true", [])'))
        assert done.success, done.error

    _run(tmp_path, body, allow_process=True)


def test_another_tenants_session_is_not_found(tmp_path: Path) -> None:
    async def body(service: SessionService, runtime: SessionRuntime, pool: SandboxPool) -> None:
        sid = service.create(tenant="a").id
        assert await _value(runtime, sid, "1 + 1") == 2
        with pytest.raises(SessionNotFound):
            await runtime.run(sid, Job("program", source="1"), tenant="b")
        done, _ = await runtime.run(sid, Job("program", source="2"), tenant="a")
        assert done.value == 2

    _run(tmp_path, body)


def test_past_the_cap_the_longest_idle_session_is_paused(tmp_path: Path) -> None:
    async def body(service: SessionService, runtime: SessionRuntime, pool: SandboxPool) -> None:
        ids = [service.create().id for _ in range(3)]
        for i, sid in enumerate(ids):
            await _value(runtime, sid, f"let v = {i}")
        assert len(pool.session_pids()) == 2
        assert service.get(ids[0]).status == "paused"
        assert [await _value(runtime, sid, "v") for sid in ids] == [0, 1, 2]

    _run(tmp_path, body, session_workers_max=2)


def test_a_restored_document_that_is_damaged_is_named_once(tmp_path: Path) -> None:
    async def body(service: SessionService, runtime: SessionRuntime, pool: SandboxPool) -> None:
        sid = service.create().id
        await _value(runtime, sid, "let good = 1; let bad = 2")
        await runtime.pause(sid)
        bindings = service.dirs.state(sid) / "bindings"
        damaged = next(p for p in bindings.iterdir() if p.name.startswith("bad."))
        damaged.write_bytes(b"x" * damaged.stat().st_size)
        done, unsaved = await runtime.run(sid, Job("program", source="good"))
        assert done.value == 1
        assert [u["name"] for u in unsaved] == ["bad"]
        assert "checksum" in unsaved[0]["reason"]
        _done, again = await runtime.run(sid, Job("program", source="good"))
        assert again == []

    _run(tmp_path, body)


def test_saved_bindings_are_bounded_by_the_disk_quota(tmp_path: Path) -> None:
    async def body(service: SessionService, runtime: SessionRuntime, pool: SandboxPool) -> None:
        sid = service.create().id
        done, unsaved = await runtime.run(sid, Job("program", source='let small = "ok"'))
        assert done.success and unsaved == []
        big = 'let big = range(0, 30000) | map(fn(i) => "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx") | reverse'
        done, unsaved = await runtime.run(sid, Job("program", source=big))
        assert done.success
        assert [u["name"] for u in unsaved] == ["big"] and "session_disk_mb" in unsaved[0]["reason"]
        assert [b["name"] for b in service.state(sid).bindings()] == ["small"]

    _run(tmp_path, body, session_disk_mb=1)
