"""The local executor: bursts of jobs go to the sandbox in batches, each answered alone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from conch.config import Settings
from conch.orchestration.executor import LocalExecutor
from conch.sandbox.jobs import Job
from conch.sandbox.pool import SandboxPool


def _with_executor(tmp_path: Path, body: Any, workers: int = 1) -> Any:
    settings = Settings(data_dir=tmp_path, workers=workers, wall_time_s=10.0)

    async def main() -> Any:
        pool = SandboxPool(settings)
        await pool.start()
        executor = LocalExecutor(pool)
        try:
            return await body(executor, pool)
        finally:
            await executor.close()
            await pool.close()

    return asyncio.run(main())


def test_a_burst_is_answered_job_by_job(tmp_path: Path) -> None:
    async def body(ex: LocalExecutor, pool: SandboxPool) -> list[dict[str, Any]]:
        jobs = [Job("program", source="x * 2", variables={"x": i}) for i in range(40)]
        jobs[7] = Job("program", source="1 / 0")
        return await asyncio.gather(*(ex.run(j) for j in jobs))

    answers = _with_executor(tmp_path, body)
    assert [a["value"] for i, a in enumerate(answers) if i != 7] == [i * 2 for i in range(40) if i != 7]
    assert answers[7]["success"] is False and answers[7]["error"]["kind"] == "ZeroDivisionError"


def test_no_more_jobs_than_free_workers_run_side_by_side(tmp_path: Path) -> None:
    async def body(ex: LocalExecutor, pool: SandboxPool) -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.gather(*(ex.run(Job("program", source="sleep(400)")) for _ in range(2)))
        return loop.time() - started

    assert _with_executor(tmp_path, body, workers=2) < 0.75


def test_giving_up_every_job_of_a_batch_stops_its_worker(tmp_path: Path) -> None:
    async def body(ex: LocalExecutor, pool: SandboxPool) -> tuple[int, Any]:
        runs = [asyncio.ensure_future(ex.run(Job("program", source="sleep(5000)"))) for _ in range(3)]
        while not pool.busy_pids():
            await asyncio.sleep(0.01)
        for r in runs:
            r.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        for _ in range(200):
            if pool.restarts["cancelled"]:
                break
            await asyncio.sleep(0.01)
        return pool.restarts["cancelled"], await ex.run(Job("program", source="6 * 7"))

    cancelled, after = _with_executor(tmp_path, body)
    assert cancelled == 1 and after["value"] == 42
