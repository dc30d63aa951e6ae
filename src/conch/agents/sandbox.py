"""The sandbox: a pool of worker processes that run conch programs for the server.

The server process never runs untrusted code. Each run is sent to a pre-started worker
(:mod:`conch.agents.sandbox_worker`) which applies OS limits (``RLIMIT_AS`` for memory,
``RLIMIT_CPU`` per job) and runs the program with a workspace-confined :class:`Context`
and per-request :class:`Limits`. Results, ``print`` lines, statement progress and the
elements of a lazily produced Array come back incrementally, so callers can stream them.

A worker that breaks a limit, crashes, overruns its wall time or whose run is abandoned
(client disconnect) is killed and replaced; the run ends with ``TimeoutError``,
``LimitError`` or ``CancelledError``.

Workers are separate interpreters (``python -P -m conch.agents.sandbox_worker``), not forks
of the server: they inherit none of its state, sockets or secrets, and the directory they
run in (the workspace, which programs write to) is never on their import path.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conch.agents.sandbox_worker import HEADER, MAX_FRAME, SECRET_MARKERS, WorkerConfig, encode
from conch.config import Settings
from conch.lang.context import Limits

_LIMIT_FIELDS = ("wall_time_s", "steps", "recursion", "output_bytes", "collection_size")

# How long past its wall time a run may go before the server kills its worker: the
# interpreter checks wall time itself and reports it with a position; this is the backstop
# for code that does not reach a check (a long native call, ``sleep``).
_GRACE_S = 1.0

# How long a run may wait for a free worker before it is refused with TimeoutError. Longer
# than any wall time so that a burst queues instead of failing; bounded so that a client is
# never left waiting forever behind a stuck pool.
QUEUE_TIMEOUT_S = 120.0


def effective_limits(configured: Limits, requested: dict[str, Any] | None) -> Limits:
    """The configured limits lowered by what the request asks; a request can never raise
    a limit (a larger value is ignored, the configured one applies)."""
    out = Limits(**{k: getattr(configured, k) for k in _LIMIT_FIELDS})
    for key, wanted in (requested or {}).items():
        if key not in _LIMIT_FIELDS or wanted is None:
            continue
        current = getattr(out, key)
        setattr(out, key, wanted if current is None else min(current, wanted))
    return out


def configured_limits(settings: Settings, *, stream: bool = False) -> Limits:
    return Limits(
        wall_time_s=settings.stream_wall_time_s if stream else settings.wall_time_s,
        steps=settings.max_steps,
        recursion=settings.max_recursion,
        output_bytes=settings.max_output_bytes,
        collection_size=settings.max_collection_size,
    )


def allowed_effects(settings: Settings) -> frozenset[str]:
    effects = {"pure", "read", "write", "model"}
    if settings.allow_network:
        effects.add("network")
    if settings.allow_process:
        effects.add("process")
    return frozenset(effects)


@dataclass
class Job:
    """One run: a program (``execute``/``eval``), a builtin call or a pipeline."""

    mode: str  # "program" | "call" | "pipeline"
    source: str | None = None
    builtin: str | None = None
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    input: Any = None
    steps: list[str] = field(default_factory=list)
    limits: dict[str, Any] | None = None
    stream: bool = False

    def payload(self, limits: Limits) -> dict[str, Any]:
        wall = limits.wall_time_s or 0.0
        return {
            "mode": self.mode,
            "stream": self.stream,
            "source": self.source,
            "builtin": self.builtin,
            "args": self.args,
            "kwargs": self.kwargs,
            "input": self.input,
            "steps": self.steps,
            "limits": {k: getattr(limits, k) for k in _LIMIT_FIELDS},
            "cpu_s": wall + _GRACE_S,
        }


@dataclass
class Event:
    """Something a run reported: ``progress`` (step, total, message), ``data`` (a print line
    or an element of the resulting Array, in order) or ``done`` (the final envelope)."""

    kind: str
    step: int = 0
    total: int = 0
    message: str = ""
    text: str = ""
    result: dict[str, Any] | None = None


class WorkerError(Exception):
    """A worker did not behave (died, sent garbage, did not start)."""


class Worker:
    def __init__(
        self,
        process: subprocess.Popen[bytes],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pid: int,
    ) -> None:
        self.process = process
        self.reader = reader
        self.writer = writer
        self.pid = pid
        self.jobs = 0

    async def send(self, message: Any) -> None:
        self.writer.write(encode(message))
        await self.writer.drain()

    async def recv(self) -> Any:
        try:
            header = await self.reader.readexactly(HEADER.size)
            (size,) = HEADER.unpack(header)
            if size > MAX_FRAME:
                raise WorkerError(f"worker sent an oversized frame ({size} bytes)")
            body = await self.reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise WorkerError("worker closed its channel") from exc
        try:
            return json.loads(body)
        except ValueError as exc:
            raise WorkerError("worker sent an undecodable frame") from exc

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.writer.close()

    def exit_signal(self) -> int | None:
        code = self.process.poll()
        return -code if code is not None and code < 0 else None


class SandboxPool:
    """A fixed number of warm worker processes; runs queue for a free one."""

    def __init__(self, settings: Settings, size: int | None = None) -> None:
        self.settings = settings
        self.size = max(1, size if size is not None else settings.workers)
        self.workspace = Path(settings.workspace_dir)
        public = settings.model_copy(update={"api_key": None})
        self.config = WorkerConfig(
            workspace=str(self.workspace),
            allowed_effects=sorted(allowed_effects(settings)),
            memory_mb=settings.worker_memory_mb,
            max_recursion=settings.max_recursion,
            settings_json=public.model_dump_json(),
        )
        self.limits = configured_limits(settings)
        self.stream_limits = configured_limits(settings, stream=True)
        self.restarts: Counter[str] = Counter()
        self.active = 0
        self._idle: asyncio.LifoQueue[Worker] = asyncio.LifoQueue()
        self._workers: set[Worker] = set()
        self._busy: set[Worker] = set()
        self._spawning: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.workspace.mkdir(parents=True, exist_ok=True)
        workers = await asyncio.gather(*(self._spawn() for _ in range(self.size)))
        for w in workers:
            self._idle.put_nowait(w)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._spawning):
            task.cancel()
        for w in list(self._workers):
            w.kill()
        await asyncio.gather(*(asyncio.to_thread(_reap, w.process) for w in self._workers))
        self._workers.clear()

    def worker_pids(self) -> list[int]:
        return sorted(w.pid for w in self._workers)

    def busy_pids(self) -> list[int]:
        """Workers running a program now."""
        return sorted(w.pid for w in self._busy)

    @property
    def idle(self) -> int:
        return self._idle.qsize()

    async def _spawn(self) -> Worker:
        parent_sock, child_sock = socket.socketpair()
        try:
            process = await asyncio.to_thread(self._popen, child_sock.fileno())
        finally:
            child_sock.close()
        reader, writer = await asyncio.open_unix_connection(sock=parent_sock)
        worker = Worker(process, reader, writer, process.pid)
        try:
            await worker.send(["config", dataclasses.asdict(self.config)])
            ready = await asyncio.wait_for(worker.recv(), timeout=60)
        except (TimeoutError, WorkerError) as exc:
            worker.kill()
            raise WorkerError(f"a sandbox worker failed to start: {exc}") from exc
        if not (isinstance(ready, list) and ready and ready[0] == "ready"):
            worker.kill()
            raise WorkerError("a sandbox worker sent an unexpected greeting")
        self._workers.add(worker)
        return worker

    def _popen(self, fd: int) -> subprocess.Popen[bytes]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.upper().startswith("CONCH_")
            and not any(m in k.upper() for m in SECRET_MARKERS)
        }
        return subprocess.Popen(
            [sys.executable, "-P", "-m", "conch.agents.sandbox_worker", str(fd)],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            cwd=str(self.workspace.parent),
            start_new_session=True,  # a Ctrl-C on the server's terminal is the server's to handle
        )

    def _replace(self, worker: Worker, reason: str) -> None:
        """Kill ``worker`` and start its successor in the background."""
        worker.kill()
        self._workers.discard(worker)
        self.restarts[reason] += 1
        asyncio.get_running_loop().run_in_executor(None, _reap, worker.process)
        if self._closed:
            return

        async def respawn() -> None:
            for attempt in range(5):
                try:
                    fresh = await self._spawn()
                except WorkerError:
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                if self._closed:
                    fresh.kill()
                    return
                self._idle.put_nowait(fresh)
                return

        task = asyncio.get_running_loop().create_task(respawn())
        self._spawning.add(task)
        task.add_done_callback(self._spawning.discard)

    # -- running --------------------------------------------------------------------------

    def new_run_id(self) -> str:
        return uuid.uuid4().hex

    async def run(self, job: Job) -> dict[str, Any]:
        """Run ``job`` to completion and return its envelope
        (``success, result, type, value, output, error`` and ``steps`` for pipelines)."""
        result: dict[str, Any] | None = None
        async with contextlib.aclosing(self.events(job)) as events:
            async for event in events:
                if event.kind == "done":
                    result = event.result
        assert result is not None
        return result

    async def events(self, job: Job) -> AsyncGenerator[Event, None]:
        """Run ``job`` and yield its events as the worker reports them; the last is ``done``.

        Closing the iterator before ``done`` (a client went away) kills the worker.
        """
        base = self.stream_limits if job.stream else self.limits
        limits = effective_limits(base, job.limits)
        wall = limits.wall_time_s or 0.0
        try:
            if self._idle.empty():
                async with asyncio.timeout(QUEUE_TIMEOUT_S):
                    worker = await self._idle.get()
            else:
                worker = self._idle.get_nowait()
        except TimeoutError:
            yield _done_error(
                job, "TimeoutError", f"no sandbox worker became free within {QUEUE_TIMEOUT_S:g} s"
            )
            return
        deadline = time.monotonic() + wall + _GRACE_S
        finished = False
        self.active += 1
        self._busy.add(worker)
        try:
            # A worker that died while idle (the OOM killer, say) cannot take the job; the
            # closed channel is then reported by the receive below, as a crash.
            with contextlib.suppress(ConnectionError, OSError):
                await worker.send(job.payload(limits))
            worker.jobs += 1
            while True:
                remaining = deadline - time.monotonic()
                try:
                    async with asyncio.timeout(max(0.0, remaining) if wall > 0 else None):
                        message = await worker.recv()
                except TimeoutError:
                    finished = True
                    self._replace(worker, "timeout")
                    yield _done_error(
                        job, "TimeoutError", f"wall time limit of {wall:g} s exceeded"
                    )
                    return
                except WorkerError:
                    finished = True
                    yield await self._crashed(job, worker)
                    return
                kind = message[0]
                if kind == "data":
                    yield Event("data", text=message[1])
                elif kind == "progress":
                    yield Event("progress", step=message[1], total=message[2], message=message[3])
                elif kind == "done":
                    finished = True
                    done = message[1]
                    recycle = done.pop("recycle", False)
                    if recycle or worker.jobs >= 10_000:
                        self._replace(worker, "limit" if recycle else "recycle")
                    else:
                        self._idle.put_nowait(worker)
                    yield Event("done", result=done)
                    return
                else:
                    finished = True
                    self._replace(worker, "protocol")
                    yield _done_error(job, "LimitError", "the sandbox worker misbehaved")
                    return
        finally:
            self.active -= 1
            self._busy.discard(worker)
            if not finished:
                # Abandoned mid-run (client disconnect, server shutdown): stop the program.
                self._replace(worker, "cancelled")

    async def _crashed(self, job: Job, worker: Worker) -> Event:
        # The channel closed: wait briefly for the exit status to tell why.
        await asyncio.to_thread(_reap, worker.process, 2.0)
        sig = worker.exit_signal()
        self._replace(worker, "crash")
        if sig == signal.SIGXCPU:
            return _done_error(
                job, "TimeoutError", "CPU time limit exceeded; the worker was stopped"
            )
        if sig is not None:
            name = signal.Signals(sig).name
            return _done_error(
                job,
                "LimitError",
                f"the program was stopped by the sandbox ({name}): it exceeded a resource "
                "limit (memory or stack)",
            )
        return _done_error(job, "LimitError", "the sandbox worker exited unexpectedly")


def _reap(process: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout)


def _done_error(job: Job, kind: str, message: str) -> Event:
    result: dict[str, Any] = {
        "success": False,
        "result": None,
        "type": None,
        "value": None,
        "output": [],
        "error": {"kind": kind, "message": message, "line": None, "column": None, "hint": None},
    }
    if job.mode == "pipeline":
        result["steps"] = []
    return Event("done", result=result)
