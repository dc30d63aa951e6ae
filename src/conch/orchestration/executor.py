"""Where workflow ``run`` steps and agent tool calls execute: the executor interface.

``local`` (the default) hands each job to the server's sandbox pool (worker processes with
OS limits). ``dask`` submits it to a Dask distributed cluster (``dask_scheduler``), where a
Dask worker runs it with the same :class:`~conch.sandbox.worker.Runner` the sandbox
workers use: the same workspace confinement, effect policy and language limits, but the
cluster's processes, so the OS limits (RLIMIT_AS, RLIMIT_CPU) are the cluster's to set.
Both return the sandbox's envelope as its wire dict
``{success, result, type, value, output, error}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Protocol

from conch.config import Settings
from conch.sandbox.envelope import RunEnvelope
from conch.sandbox.jobs import Job, configured_limits, effective_limits
from conch.sandbox.pool import SandboxPool
from conch.sandbox.worker import WorkerConfig

_GRACE_S = 2.0


class Executor(Protocol):
    name: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def run(self, job: Job) -> dict[str, Any]: ...


class LocalExecutor:
    """Jobs run in the server's sandbox pool (started and closed by whoever owns the pool).

    Jobs submitted in the same turn of the event loop (the steps one scheduling round
    claimed, a burst of agent tool calls) that outnumber the free workers go to the workers
    in batches (:meth:`SandboxPool.run_batch`): a trivial step costs far less to run than
    the round trip to a worker, and a batch pays that once. No more jobs than there are free
    workers run one per worker, so independent slow steps still run side by side, and a
    batch is at most ``MAX_BATCH`` jobs, so a slow job holds up few others.
    """

    name = "local"
    MAX_BATCH = 32

    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool
        self._queue: list[tuple[Job, asyncio.Future[RunEnvelope]]] = []
        self._chunks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        for chunk in list(self._chunks):
            chunk.cancel()
        await asyncio.gather(*self._chunks, return_exceptions=True)

    async def run(self, job: Job) -> dict[str, Any]:
        if job.stream or job.mode not in ("program", "call"):
            return (await self.pool.run(job)).to_wire()
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[RunEnvelope] = loop.create_future()
        if not self._queue:
            loop.call_soon(self._flush)
        self._queue.append((job, answer))
        return (await answer).to_wire()

    def _flush(self) -> None:
        queued, self._queue = self._queue, []
        free = self.pool.idle
        size = 1
        if len(queued) > free:
            size = min(self.MAX_BATCH, -(-len(queued) // self.pool.size))
        loop = asyncio.get_running_loop()
        for start in range(0, len(queued), size):
            chunk = queued[start : start + size]
            task = loop.create_task(self._run_chunk(chunk))
            self._chunks.add(task)
            task.add_done_callback(self._chunks.discard)
            for _job, answer in chunk:
                answer.add_done_callback(functools.partial(_abandon, chunk, task))

    async def _run_chunk(self, chunk: list[tuple[Job, asyncio.Future[RunEnvelope]]]) -> None:
        live = [(job, answer) for job, answer in chunk if not answer.done()]
        if not live:
            return
        try:
            if len(live) == 1:
                results = [await self.pool.run(live[0][0])]
            else:
                results = await self.pool.run_batch([job for job, _answer in live])
        except Exception as exc:
            for _job, answer in live:
                if not answer.done():
                    answer.set_exception(exc)
            return
        for (_job, answer), result in zip(live, results, strict=True):
            if not answer.done():
                answer.set_result(result)


def _abandon(
    chunk: list[tuple[Job, asyncio.Future[RunEnvelope]]],
    task: asyncio.Task[None],
    _answer: asyncio.Future[RunEnvelope],
) -> None:
    # Every job of the chunk was given up (its steps cancelled): stop the worker running it.
    if all(answer.cancelled() for _job, answer in chunk):
        task.cancel()


def _failure(kind: str, message: str) -> dict[str, Any]:
    return {
        "success": False,
        "result": None,
        "type": None,
        "value": None,
        "output": [],
        "error": {"kind": kind, "message": message, "line": None, "column": None, "hint": None},
    }


class DaskExecutor:
    """Jobs run on a Dask distributed cluster."""

    name = "dask"

    def __init__(self, settings: Settings, pool: SandboxPool | None = None, *,
                 run_job: DaskJob) -> None:
        if not settings.dask_scheduler:
            raise ValueError('executor = "dask" needs dask_scheduler = "tcp://host:8786"')
        self.address = settings.dask_scheduler
        self.limits = configured_limits(settings)
        # What a Dask worker calls with each job: given by the composition root
        # (conch.worker_process.run_on_dask_worker), which picks the host programs reach.
        self.run_job = run_job
        base = pool.config if pool is not None else None
        if base is None:
            from conch.sandbox.jobs import allowed_effects
            from conch.sandbox.worker_env import worker_settings

            public = worker_settings(settings)
            base = WorkerConfig(
                workspace=str(settings.workspace_dir),
                allowed_effects=sorted(allowed_effects(settings)),
                memory_mb=settings.worker_memory_mb,
                max_recursion=settings.max_recursion,
                settings_json=public.model_dump_json(),
            )
        self.config = dataclasses.asdict(base)
        self.client: Any = None

    async def start(self) -> None:
        try:
            from distributed import Client
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise RuntimeError(
                'executor = "dask" needs Dask distributed: pip install "conch[dask]"'
            ) from exc
        self.client = await Client(self.address, asynchronous=True)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def run(self, job: Job) -> dict[str, Any]:
        if self.client is None:
            return _failure("ValueError", "the Dask executor is not started")
        limits = effective_limits(self.limits, job.limits) if job.limits else self.limits
        future = self.client.submit(
            self.run_job, self.config, job.payload(limits), pure=False
        )
        wall = limits.wall_time_s
        try:
            if wall:
                return await asyncio.wait_for(future, wall + _GRACE_S)  # type: ignore[no-any-return]
            return await future  # type: ignore[no-any-return]
        except TimeoutError:
            await future.cancel()
            return _failure("TimeoutError", f"wall time limit of {wall:g} s exceeded")
        except asyncio.CancelledError:
            await asyncio.shield(future.cancel())
            raise
        except Exception as exc:
            return _failure("LimitError", f"the Dask worker failed the job: {exc}")


# A Dask worker's job: (worker config, job payload) -> the run's envelope as JSON data.
DaskJob = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


def make_executor(settings: Settings, pool: SandboxPool, *, dask_job: DaskJob | None = None
                  ) -> Executor:
    """``dask_job``: what Dask workers run (``conch.worker_process.run_on_dask_worker``);
    needed only with ``executor = "dask"``."""
    if settings.executor == "local":
        return LocalExecutor(pool)
    if settings.executor == "dask":
        if dask_job is None:
            raise ValueError('executor = "dask" needs the Dask job function')
        return DaskExecutor(settings, pool, run_job=dask_job)
    raise ValueError(f"unknown executor {settings.executor!r}: use 'local' or 'dask'")
