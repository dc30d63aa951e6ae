"""Where workflow ``run`` steps and agent tool calls execute: the executor interface.

``local`` (the default) hands each job to the server's sandbox pool (worker processes with
OS limits). ``dask`` submits it to a Dask distributed cluster (``dask_scheduler``), where a
Dask worker runs it with the same :class:`~conch.agents.sandbox_worker.Runner` the sandbox
workers use: the same workspace confinement, effect policy and language limits, but the
cluster's processes, so the OS limits (RLIMIT_AS, RLIMIT_CPU) are the cluster's to set.
Both return the sandbox's envelope as its wire dict
``{success, result, type, value, output, error}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Protocol

from conch.agents.sandbox import Job, SandboxPool, configured_limits, effective_limits
from conch.agents.sandbox_worker import WorkerConfig
from conch.config import Settings

_GRACE_S = 2.0


class Executor(Protocol):
    name: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def run(self, job: Job) -> dict[str, Any]: ...


class LocalExecutor:
    """Jobs run in the server's sandbox pool (started and closed by whoever owns the pool)."""

    name = "local"

    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def run(self, job: Job) -> dict[str, Any]:
        return (await self.pool.run(job)).to_wire()


def _failure(kind: str, message: str) -> dict[str, Any]:
    return {
        "success": False,
        "result": None,
        "type": None,
        "value": None,
        "output": [],
        "error": {"kind": kind, "message": message, "line": None, "column": None, "hint": None},
    }


class _Collect:
    """Stands in for the worker's socket channel: keeps the frames a run sends."""

    def __init__(self) -> None:
        self.done: dict[str, Any] | None = None

    def send(self, message: Any) -> None:
        if message and message[0] == "done":
            self.done = message[1]


_RUNNERS: dict[str, Any] = {}


def run_on_dask_worker(config: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """Run one sandbox job inside a Dask worker (module-level so that Dask can ship it by
    reference); one Runner per configuration keeps its compile caches warm."""
    import json

    from conch.agents.sandbox_worker import Runner
    from conch.lang.builtins.registry import load_all

    key = json.dumps(config, sort_keys=True)
    runner = _RUNNERS.get(key)
    if runner is None:
        load_all()
        runner = _RUNNERS[key] = Runner(WorkerConfig(**config))
    chan = _Collect()
    runner.run(payload, chan)  # type: ignore[arg-type]
    return chan.done or _failure("LimitError", "the job produced no result")


class DaskExecutor:
    """Jobs run on a Dask distributed cluster."""

    name = "dask"

    def __init__(self, settings: Settings, pool: SandboxPool | None = None) -> None:
        if not settings.dask_scheduler:
            raise ValueError('executor = "dask" needs dask_scheduler = "tcp://host:8786"')
        self.address = settings.dask_scheduler
        self.limits = configured_limits(settings)
        base = pool.config if pool is not None else None
        if base is None:
            from conch.agents.sandbox import allowed_effects

            public = settings.model_copy(update={"api_key": None})
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
            run_on_dask_worker, self.config, job.payload(limits), pure=False
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


def make_executor(settings: Settings, pool: SandboxPool) -> Executor:
    if settings.executor == "local":
        return LocalExecutor(pool)
    if settings.executor == "dask":
        return DaskExecutor(settings, pool)
    raise ValueError(f"unknown executor {settings.executor!r}: use 'local' or 'dask'")
