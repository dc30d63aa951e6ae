"""The sandbox pool on its own: limits, OS limits of workers, kill-and-replace."""

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
from conch.lang.context import Limits
from conch.sandbox.jobs import Job, effective_limits
from conch.sandbox.pool import SandboxPool


def _with_pool(
    tmp_path: Path, body: Callable[[SandboxPool], Awaitable[Any]], **overrides: Any
) -> Any:
    overrides.setdefault("workers", 1)
    overrides.setdefault("wall_time_s", 2.0)
    settings = Settings(data_dir=tmp_path, **overrides)

    async def main() -> Any:
        pool = SandboxPool(settings)
        await pool.start()
        try:
            return await body(pool)
        finally:
            await pool.close()

    return asyncio.run(main())


def test_effective_limits_only_lower() -> None:
    configured = Limits(
        wall_time_s=30, steps=1000, recursion=100, output_bytes=10, collection_size=5
    )
    got = effective_limits(configured, {"wall_time_s": 60, "steps": 10, "recursion": 1000})
    assert (got.wall_time_s, got.steps, got.recursion) == (30, 10, 100)
    assert (got.output_bytes, got.collection_size) == (10, 5)
    unlimited = effective_limits(Limits(), {"steps": 7})
    assert unlimited.steps == 7 and unlimited.wall_time_s is None


def test_runs_in_a_separate_process_inside_the_workspace(tmp_path: Path) -> None:
    async def body(pool: SandboxPool) -> Any:
        return await pool.run(Job("program", source="pwd()")), pool.worker_pids()

    result, pids = _with_pool(tmp_path, body)
    assert result.success, result
    assert os.getpid() not in pids
    assert result.result in ("/", str(tmp_path / "workspace"))


def test_worker_has_os_limits(tmp_path: Path) -> None:
    async def body(pool: SandboxPool) -> str:
        await pool.run(Job("program", source="1"))
        return Path(f"/proc/{pool.worker_pids()[0]}/limits").read_text()

    limits = _with_pool(tmp_path, body, worker_memory_mb=300)
    as_line = next(line for line in limits.splitlines() if line.startswith("Max address space"))
    assert str(300 * 1024 * 1024) in as_line
    cpu_line = next(line for line in limits.splitlines() if line.startswith("Max cpu time"))
    assert "unlimited" not in cpu_line.split()[3]


def test_killed_worker_is_replaced_and_run_answered(tmp_path: Path) -> None:
    async def body(pool: SandboxPool) -> tuple[dict[str, Any], int, list[int], dict[str, Any]]:
        task = asyncio.create_task(pool.run(Job("program", source="sleep(5000)")))
        while not pool.busy_pids():
            await asyncio.sleep(0.01)
        victim = pool.busy_pids()[0]
        os.kill(victim, signal.SIGKILL)
        result = await task
        for _ in range(500):
            if pool.idle == pool.size:
                break
            await asyncio.sleep(0.02)
        after = await pool.run(Job("program", source="2 * 21"))
        return result, victim, pool.worker_pids(), after

    result, victim, pids, after = _with_pool(tmp_path, body)
    assert result.success is False
    assert result.error.kind == "LimitError"
    assert "SIGKILL" in result.error.message
    assert victim not in pids and len(pids) == 1
    assert after.value == 42


def test_wall_time_watchdog_kills_native_work(tmp_path: Path) -> None:
    async def body(pool: SandboxPool) -> tuple[dict[str, Any], int]:
        result = await pool.run(Job("program", source="10 ** 10 ** 9", limits={"wall_time_s": 0.5}))
        return result, pool.restarts["timeout"] + pool.restarts["limit"]

    result, restarts = _with_pool(tmp_path, body)
    assert result.error.kind in ("TimeoutError", "LimitError")
    assert restarts >= 1


def test_memory_limit_answers_limit_error(tmp_path: Path) -> None:
    async def body(pool: SandboxPool) -> dict[str, Any]:
        return await pool.run(Job("program", source='"x" | repeat(2 * 10**9)'))

    result = _with_pool(tmp_path, body, worker_memory_mb=400)
    assert result.error.kind == "LimitError"


def test_stream_events_are_incremental(tmp_path: Path) -> None:
    async def body(pool: SandboxPool) -> list[str]:
        kinds = []
        job = Job("program", source='print("a")\n[1, 2]', stream=True)
        async for event in pool.events(job):
            kinds.append(event.kind)
        return kinds

    assert _with_pool(tmp_path, body) == ["progress", "data", "progress", "data", "data", "done"]


def test_closing_a_run_early_kills_its_worker(tmp_path: Path) -> None:
    async def body(pool: SandboxPool) -> tuple[int, list[int], int]:
        job = Job("program", source="range(0, 10**9) | map(fn(x) => sleep(20))", stream=True)
        events = pool.events(job)
        async for event in events:
            if event.kind == "data":
                break
        victim = pool.busy_pids()[0]
        await events.aclose()
        for _ in range(500):
            if pool.idle == pool.size:
                break
            await asyncio.sleep(0.02)
        return victim, pool.worker_pids(), pool.restarts["cancelled"]

    victim, pids, cancelled = _with_pool(tmp_path, body)
    assert cancelled == 1
    assert victim not in pids


@pytest.mark.parametrize("name", ["CONCH_API_KEY", "OPENAI_API_KEY", "HF_TOKEN"])
def test_secrets_do_not_reach_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "must-not-leak")

    async def body(pool: SandboxPool) -> dict[str, Any]:
        return await pool.run(Job("program", source=f'env("{name}")'))

    assert _with_pool(tmp_path, body).value is None


def _wait_dead(pid: int) -> None:
    """Block (without letting the event loop run) until ``pid`` has exited."""
    for _ in range(500):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"worker {pid} did not exit")


def test_worker_dead_while_idle_is_replaced_before_a_run_reaches_it(tmp_path: Path) -> None:
    async def body(pool: SandboxPool) -> tuple[dict[str, Any], int, list[int], int]:
        victim = pool.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        await asyncio.sleep(0.2)
        result = await pool.run(Job("program", source="1"))
        return result, victim, pool.worker_pids(), pool.restarts["crash"]

    result, victim, pids, crashes = _with_pool(tmp_path, body)
    assert result.success is True and result.value == 1, result
    assert victim not in pids and len(pids) == 1
    assert crashes == 1


def test_run_sent_to_a_worker_that_died_idle_is_retried_on_a_fresh_one(tmp_path: Path) -> None:
    async def body(pool: SandboxPool) -> tuple[dict[str, Any], int, list[int], int]:
        victim = pool.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        # The loop has not run since the kill, so the pool still lists the dead worker as
        # idle and hands the run to it; the frame cannot be delivered, so the run was never
        # started and must go to the replacement instead of failing.
        _wait_dead(victim)
        result = await pool.run(Job("program", source="40 + 2"))
        return result, victim, pool.worker_pids(), pool.restarts["crash"]

    result, victim, pids, crashes = _with_pool(tmp_path, body)
    assert result.success is True and result.value == 42, result
    assert victim not in pids and len(pids) == 1
    assert crashes == 1


# -- batches and variables ---------------------------------------------------------------


def test_variables_bind_names_without_changing_the_program(tmp_path: Path) -> None:
    async def body(pool: SandboxPool) -> list[Any]:
        jobs = [Job("program", source="steps.a.result + n", variables={"steps": {"a": {"result": i}}, "n": 1})
                for i in range(3)]
        wrong = await pool.run(Job("program", source="nope + 1", variables={"n": 1}))
        return [await pool.run(j) for j in jobs] + [wrong]

    *answers, wrong = _with_pool(tmp_path, body)
    assert [a.value for a in answers] == [1, 2, 3]
    # Nothing is prepended to the program: positions are the step's own.
    assert wrong.error.kind == "NameError" and (wrong.error.line, wrong.error.column) == (1, 1)


def test_a_batch_answers_each_job_as_if_run_alone(tmp_path: Path) -> None:
    jobs = [Job("program", source=f"{i} * 2") for i in range(5)]
    jobs.insert(2, Job("program", source="1 / 0"))
    jobs.append(Job("call", builtin="len", args=[[1, 2, 3]]))

    async def body(pool: SandboxPool) -> tuple[list[Any], list[Any]]:
        return await pool.run_batch(jobs), [await pool.run(j) for j in jobs]

    batched, alone = _with_pool(tmp_path, body)
    assert [b.to_wire() for b in batched] == [a.to_wire() for a in alone]
    assert batched[2].error.kind == "ZeroDivisionError" and batched[-1].value == 3


def test_each_job_of_a_batch_has_its_own_wall_time(tmp_path: Path) -> None:
    # The second job is stuck in native code: the watchdog stops it after its own wall time
    # (not the batch's total), the first keeps its answer and the third runs elsewhere.
    jobs = [Job("program", source="1"), Job("program", source="10 ** 10 ** 9", limits={"wall_time_s": 0.5}),
            Job("program", source="3")]

    async def body(pool: SandboxPool) -> tuple[list[Any], float]:
        started = time.monotonic()
        answers = await pool.run_batch(jobs)
        return answers, time.monotonic() - started

    answers, elapsed = _with_pool(tmp_path, body, wall_time_s=30.0)
    assert answers[0].value == 1 and answers[2].value == 3
    assert answers[1].error.kind in ("TimeoutError", "LimitError")
    assert elapsed < 10


def test_a_job_that_spoils_its_worker_ends_the_batch_and_the_rest_run_elsewhere(tmp_path: Path) -> None:
    jobs = [Job("program", source="1"), Job("program", source='"x" | repeat(2 * 10**9)'), Job("program", source="3")]

    async def body(pool: SandboxPool) -> tuple[list[Any], int]:
        answers = await pool.run_batch(jobs)
        return answers, sum(pool.restarts.values())

    answers, restarts = _with_pool(tmp_path, body, worker_memory_mb=400)
    assert answers[0].value == 1 and answers[1].error.kind == "LimitError" and answers[2].value == 3
    assert restarts >= 1
