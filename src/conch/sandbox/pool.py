"""The sandbox: a pool of worker processes that run conch programs for the server.

The server process never runs untrusted code. Each run is sent to a pre-started worker
(:mod:`conch.sandbox.worker`) which applies OS limits (hard rlimits for memory, files and
processes, ``RLIMIT_CPU`` per job) and its kernel layers, and runs the program with a
workspace-confined :class:`Context` and per-request :class:`Limits`. Results, ``print`` lines, statement progress and the
elements of a lazily produced Array come back incrementally, so callers can stream them.

A worker that breaks a limit, crashes, overruns its wall time or whose run is abandoned
(client disconnect) is killed and replaced; the run ends with ``TimeoutError``,
``LimitError`` or ``CancelledError``.

Workers are separate interpreters (``python -P -m conch.worker_process``), not forks
of the server: they inherit none of its state, sockets or secrets, and the directory they
run in (the workspace, which programs write to) is never on their import path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any, NamedTuple

from conch.config import Settings
from conch.lang.context import Limits
from conch.sandbox import cgroups, identity, netns, probe, relay, slirp, uids
from conch.sandbox.channel import (
    Process,
    Worker,
    WorkerError,
    WorkerGone,
    WorkerRun,
    reap,
    serving_pid,
)
from conch.sandbox.envelope import PipelineEnvelope, RunEnvelope, RunError
from conch.sandbox.frames import (
    HEADER,
    encode,
    encode_exact,
    encode_raw,
)
from conch.sandbox.jobs import (
    GRACE_S,
    Event,
    Job,
    Placement,
    allowed_effects,
    configured_limits,
    confinement,
    effective_limits,
    worker_rlimits,
)
from conch.sandbox.layers import Layer, SandboxUnavailable
from conch.sandbox.session_config import SessionConfigs, hidden_for_sessions
from conch.sandbox.setup import prepare
from conch.sandbox.worker import WorkerConfig
from conch.sandbox.worker_env import worker_environment, worker_settings
from conch.sandbox.zygote import Zygote, ZygoteError

log = logging.getLogger("conch.sandbox")
HEADER_BYTES = HEADER.size

# How long a run may wait for a free worker before it is refused with TimeoutError. Longer
# than any wall time so that a burst queues instead of failing; bounded so that a client is
# never left waiting forever behind a stuck pool.
QUEUE_TIMEOUT_S = 120.0

# How long after a bind its spare is replaced: the fork and the new spare's preparation then
# do not compete with the session's first run for the CPU.
SPARE_REFILL_S = 0.05

# A worker is replaced after this many runs, so that whatever a long series of programs
# leaves behind in its heap (fragmentation, caches) is bounded. Starting a worker costs a
# few hundred ms of CPU, so this must be rare at thousands of runs per second.
RECYCLE_AFTER_JOBS = 100_000


class _Started(NamedTuple):
    """A job handed to a worker: its run and wall-time deadline (``time.monotonic()``)."""

    worker: Worker
    run: WorkerRun
    wall: float
    deadline: float | None


class SandboxPool:
    """A fixed number of warm worker processes; runs queue for a free one."""

    def __init__(self, settings: Settings, size: int | None = None, *,
                 language_checks: bool = True, spares: int | None = None) -> None:
        """``language_checks=False`` turns off the language's own path, effect and network
        checks in the workers, so that tests can show what the kernel layers refuse on
        their own. It is reachable from Python only: no setting or request can reach it.
        ``spares``: warm workers kept unbound for sessions (``session_spares``)."""
        self.settings = settings
        self.size = max(1, size if size is not None else settings.workers)
        self.spares = max(0, spares if spares is not None else settings.session_spares)
        self.workspace = Path(settings.workspace_dir)
        public = worker_settings(settings)
        self.config = WorkerConfig(
            workspace=str(self.workspace),
            allowed_effects=sorted(allowed_effects(settings)),
            memory_mb=settings.worker_memory_mb,
            max_recursion=settings.max_recursion,
            settings_json=public.model_dump_json(),
            confinement=dataclasses.asdict(confinement(settings, self.workspace)),
            language_checks=language_checks,
            rlimits=worker_rlimits(settings),
        )
        # Who workers run as (None: as the server) and their cgroups (None: rlimits); both
        # decided in start(), with the layers in force that workers report back.
        # Who keeps what a run sends to be recorded (worker pid, kind, data); the app sets it.
        self.recorder: Callable[[int, str, Any], None] | None = None
        self.user: identity.SandboxUser | None = None
        self.delegation: cgroups.Delegation | None = None
        # A uid of its own per worker from sandbox_uids, and the server's group (held while
        # the pool lives); None: every worker runs as ``user``
        self.ids: uids.Ids | None = None
        self.group: uids.Lease | None = None
        # The user-mode network stack and the relay of the inference server's port, where
        # workers have network namespaces of their own
        self.stack = False
        self.relay: probe.Relay | None = None
        self.pid_namespaces = False
        self.layers: dict[str, Layer] = {}
        self.limits = configured_limits(settings)
        self.stream_limits = configured_limits(settings, stream=True)
        self.restarts: Counter[str] = Counter()
        self.active = 0
        # Free workers, most recently used last (its memory is the warmest), and runs
        # waiting for one, oldest first.
        self._idle: list[Worker] = []
        self._waiters: deque[tuple[WorkerRun, asyncio.Future[Worker]]] = deque()
        self._workers: set[Worker] = set()
        self._busy: set[Worker] = set()
        self._spawning: set[asyncio.Task[None]] = set()
        # Killed, not yet reaped: what they hold (a uid, a cgroup) is given back once gone
        self._dying: set[Worker] = set()
        # Warm workers waiting for a session (imports done, no config yet), those being
        # started, and workers bound to a session
        self._spares: list[Worker] = []
        self._spare_tasks: set[asyncio.Task[None]] = set()
        self._bound: set[Worker] = set()
        # The process that forks spares (conch.sandbox.zygote), started with the first
        # spares; where it cannot start, spares are started as any worker is
        self._zygote: Zygote | None = None
        self._zygote_start: asyncio.Task[Zygote | None] | None = None
        self._zygote_failed = False
        # How a session's worker is configured (and a spare's, before it knows its session)
        self._sessions = SessionConfigs(settings)
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.config.records = self.recorder is not None
        self.layers = await asyncio.to_thread(self._prepare_layers)
        workers = await asyncio.gather(*(self._spawn() for _ in range(self.size)))
        for w in workers:
            self._release(w)
        log.info("sandbox (%s): %s", self.settings.sandbox, self.describe_layers())

    def _prepare_layers(self) -> dict[str, Layer]:
        """Decide the worker user, namespaces and cgroups (conch.sandbox.setup)."""
        got = prepare(self.settings, self.config, self.workspace, self.size)
        self.user, self.delegation, self.ids, self.group = got.user, got.delegation, got.ids, got.group
        self.stack, self.relay, self.pid_namespaces = got.stack, got.relay, got.pid_namespaces
        return got.layers

    def describe_layers(self) -> str:
        return "; ".join(
            f"{name} {'on' if layer.active else 'MISSING'} ({layer.detail})"
            for name, layer in self.layers.items()
        )

    async def close(self) -> None:
        self._closed = True
        for task in list(self._spawning) + list(self._spare_tasks):
            task.cancel()
        for w in list(self._workers) + self._spares + list(self._bound):
            w.kill()
        if self._zygote_start is not None:
            self._zygote_start.cancel()
        zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.kill()
            await asyncio.to_thread(zygote.reap)
        ending = self._workers | self._dying | set(self._spares) | self._bound
        self._spares.clear()
        self._bound.clear()
        await asyncio.gather(*(asyncio.to_thread(reap, w.process) for w in ending))
        for w in ending:
            await asyncio.to_thread(self._gone, w)
        self._workers.clear()
        self._idle.clear()
        if self.group is not None:
            self.group.release()
            self.group = None

    def _gone(self, worker: Worker) -> None:
        """What a reaped worker held: its cgroup (and whatever is left in it), its uid."""
        self._dying.discard(worker)
        if worker.cgroup is not None:
            worker.cgroup.remove()
            worker.cgroup = None
        lease, worker.lease = worker.lease, None
        if lease is not None:
            if not self.pid_namespaces:
                # Without a PID namespace a command may have left the worker's group
                # (setsid): nothing of this uid may run when another worker gets it.
                uids.sweep(lease.id)
            lease.release()

    def _reap_later(self, worker: Worker, delay: float = 0.01) -> None:
        """Collect a killed worker's exit status without a thread: SIGKILL takes effect within
        milliseconds, so a few polls from the loop suffice. Its cgroup and uid go with it."""
        loop = asyncio.get_running_loop()
        if worker.process.poll() is None:
            if delay < 5.0:
                loop.call_later(delay, self._reap_later, worker, delay * 2)
            return  # not gone after 5 s: its uid is not given to another (close() waits for it)
        if worker.lease is not None and not self.pid_namespaces:
            # The sweep of its uid reads /proc: not on the loop.
            loop.run_in_executor(None, self._gone, worker)
        else:
            self._gone(worker)

    def worker_pids(self) -> list[int]:
        return sorted(w.pid for w in self._workers)

    def session_pids(self) -> list[int]:
        """Workers bound to a session now."""
        return sorted(w.pid for w in self._bound)

    @property
    def spare_count(self) -> int:
        """Warm workers waiting for a session."""
        return len(self._spares)

    @property
    def namespaced(self) -> bool:
        """Whether workers enter mount namespaces of their own (a session's workspace is then
        the only directory of ``sessions_dir`` its worker sees)."""
        return self.config.namespaces is not None

    def busy_pids(self) -> list[int]:
        """Workers running a program now."""
        return sorted(w.pid for w in self._busy)

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def _spawn(self, *, configure: bool = True) -> Worker:
        """A started worker: given the pool's config and greeted (``configure``), or warm
        and waiting for a session's (a spare: its imports done, nothing else)."""
        config = self.config
        lease = None
        if self.ids is not None and self.group is not None:
            lease = await asyncio.to_thread(self.ids.lease)
            if lease is None:
                raise WorkerError(f"no id of sandbox_uids {self.settings.sandbox_uids} is free")
            config = dataclasses.replace(config, user=[lease.id, self.group.id], own_uid=True)
        parent_sock, child_sock = socket.socketpair()
        try:
            zygote = await self._zygote_for_spares() if not configure else None
            process: Process
            if zygote is not None:
                process = await zygote.fork(child_sock.fileno())
            else:
                process = await asyncio.to_thread(self._popen, child_sock.fileno())
        except BaseException:
            parent_sock.close()
            if lease is not None:
                lease.release()
            raise
        finally:
            child_sock.close()
        worker = Worker(process, parent_sock, asyncio.get_running_loop(), self)
        worker.lease = lease
        greeting = worker.greeting
        assert greeting is not None
        try:
            try:
                if self.delegation is not None:
                    # Before the config: the worker runs nothing until it has it.
                    worker.cgroup = self.delegation.worker_group(
                        f"worker-{worker.pid}", memory_mb=self.settings.worker_memory_mb,
                        pids_max=self.settings.worker_pids_max)
                    worker.cgroup.add(worker.pid)
                if not configure:
                    worker.spare = True
                    frame = encode_exact(["prepare", self._sessions.staged(self.config, lease)])
                    await asyncio.get_running_loop().sock_sendall(parent_sock, frame)
                    warm = await asyncio.wait_for(asyncio.shield(worker.warm), timeout=60)
                    if warm is None:
                        raise WorkerError("the worker exited while it started")
                    if warm[0] == "refused":
                        raise WorkerError(f"a spare worker could not prepare: {warm[1]}")
                    worker.pid = serving_pid(process, warm[1])
                    await self._connect(worker, stack=False)  # the relay, if any
                    return worker
                frame = encode_exact(["config", dataclasses.asdict(config)])
                await asyncio.get_running_loop().sock_sendall(parent_sock, frame)
                ready = await asyncio.wait_for(greeting, timeout=60)
            except (TimeoutError, WorkerError, OSError) as exc:
                raise WorkerError(f"a sandbox worker failed to start: {exc}") from exc
            if isinstance(ready, list) and ready and ready[0] == "refused":
                raise SandboxUnavailable(str(ready[1]))
            if not (isinstance(ready, list) and len(ready) > 2 and ready[0] == "ready"):
                raise WorkerError("a sandbox worker sent an unexpected greeting")
            worker.pid = serving_pid(process, ready[1])
            await self._connect(worker)
        except BaseException:
            worker.kill()
            self._dying.add(worker)
            self._reap_later(worker)
            raise
        for name, layer in ready[2].items():
            self.layers[name] = Layer(**layer)
        self._workers.add(worker)
        return worker

    async def _connect(self, worker: Worker, stack: bool | None = None,
                       model: bool = True) -> None:
        """Give a worker in a network namespace of its own what reaches out of it: the
        user-mode stack (``allow_network``; ``stack``: whether this one gets it) and the
        relay of the inference server's port (``allow_model``; ``model``: whether to give
        it now). ``WorkerError`` where either cannot be had."""
        try:
            if self.stack if stack is None else stack:
                worker.stack = await asyncio.to_thread(slirp.attach, worker.pid)
            if self.relay is not None and model:
                target = self.relay
                for host in target.listen:
                    try:
                        listener = await asyncio.to_thread(netns.listen_inside, worker.pid,
                                                           host, target.port)
                    except OSError:
                        if host != target.listen[0]:
                            continue  # ::1 where the namespace has no IPv6
                        raise
                    worker.relays.append(await relay.serve(listener, *target.upstream))
        except OSError as exc:
            raise WorkerError(f"a sandbox worker's network could not be set up: {exc}") from exc

    def _popen(self, fd: int, *extra: str) -> subprocess.Popen[bytes]:
        env = worker_environment(self.settings)
        if self.user is not None:
            env["HOME"] = str(self.workspace)  # not root's home, which it cannot read
        return subprocess.Popen(
            [sys.executable, "-P", "-m", "conch.worker_process", str(fd), *extra],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            cwd=str(self.workspace.parent),
            # A Ctrl-C on the server's terminal is the server's to handle, and the worker's
            # process group holds what it starts, for kill().
            start_new_session=True,
        )

    def worker_closed(self, worker: Worker) -> None:
        # A worker that dies while idle (the OOM killer, say) is replaced at once, so that
        # no run is handed to it; a busy worker's run notices the closed channel itself.
        if worker in self._spares:
            self._spares.remove(worker)
            self._retire(worker)
            self.keep_spares()
            return
        if worker.bound and worker.run is None:
            self._retire(worker)  # its session binds another at its next run
            return
        if worker in self._idle:
            self._idle.remove(worker)
            self._replace(worker, "crash" if worker.fault is None else "protocol")

    def _replace(self, worker: Worker, reason: str) -> None:
        """Kill ``worker`` and start its successor in the background (once per worker); a
        session's worker has none (its session binds another when it next runs)."""
        if worker.bound:
            if worker in self._bound:
                self.restarts[reason] += 1
            self._retire(worker)
            return
        worker.kill()
        self._busy.discard(worker)
        if worker not in self._workers:
            return
        self._workers.discard(worker)
        self.restarts[reason] += 1
        self._dying.add(worker)
        self._reap_later(worker)
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
                self._release(fresh)
                return

        task = asyncio.get_running_loop().create_task(respawn())
        self._spawning.add(task)
        task.add_done_callback(self._spawning.discard)

    # -- workers for sessions -------------------------------------------------------------

    def _retire(self, worker: Worker) -> None:
        """Kill a spare or a session's worker (it has no successor) and reap it."""
        worker.kill()
        self._busy.discard(worker)
        self._bound.discard(worker)
        if worker in self._spares:
            self._spares.remove(worker)
        if worker not in self._dying:
            self._dying.add(worker)
            self._reap_later(worker)

    def keep_spares(self) -> None:
        """Start spares in the background until ``spares`` are warm or on their way (the
        sessions' runtime asks once it has started; each bind asks again)."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        for _ in range(self.spares - len(self._spares) - len(self._spare_tasks)):
            task = loop.create_task(self._new_spare())
            self._spare_tasks.add(task)
            task.add_done_callback(self._spare_tasks.discard)

    async def _zygote_for_spares(self) -> Zygote | None:
        """The zygote (started on first use), or None where it cannot be had: spares are
        then started as any worker is."""
        if self._zygote is not None and not self._zygote.closed:
            return self._zygote
        if self._zygote_failed or self._closed:
            return None
        if self._zygote_start is None or self._zygote_start.done():
            self._zygote_start = asyncio.get_running_loop().create_task(self._start_zygote())
        return await asyncio.shield(self._zygote_start)

    async def _start_zygote(self) -> Zygote | None:
        try:
            zygote = await Zygote.start(lambda fd: self._popen(fd, "zygote"),
                                        self._zygote_config())
        except (ZygoteError, OSError) as exc:
            log.warning("sandbox: no zygote (%s); spares start as other workers do", exc)
            self._zygote_failed = True
            return None
        if self._closed:
            zygote.kill()
            return None
        self._zygote = zygote
        return zygote

    def _zygote_config(self) -> dict[str, Any]:
        """What the zygote prepares for all its children: the imports a sandbox uid must
        reach (as a session's worker, with what its mount namespace will cover), libseccomp,
        the settings, a session compiled once."""
        user = self.config.user
        if self.ids is not None:
            user = [self.ids.ids[0], self.ids.ids[0]]  # any of the range: none owns a thing
        hidden = hidden_for_sessions(self.settings, self.config, user)
        return {"user": user, "hidden": hidden, "settings_json": self.config.settings_json}

    async def _new_spare(self) -> None:
        for attempt in range(5):
            try:
                worker = await self._spawn(configure=False)
            except (WorkerError, SandboxUnavailable, OSError) as exc:
                log.warning("sandbox: a spare worker failed to start: %s", exc)
                await asyncio.sleep(0.2 * (attempt + 1))
                continue
            if self._closed or worker.closed:
                self._retire(worker)
                return
            self._spares.append(worker)
            return

    async def bind(
        self, place: Placement, *, hand_over: Callable[[int | None, int | None], None] | None = None,
        inline: bool = False,
    ) -> Worker:
        """A worker of a session's own: a warm spare (or, where none is left, a new one)
        confined to ``place``'s workspace with its permissions, and with a ``conch.lang``
        Session kept from run to run. ``hand_over(uid, gid)`` is called (in a thread, or on
        the loop when ``inline``: a workspace known to be all but empty) with the user the
        worker will run as (None: the server's own) before the worker reaches the workspace,
        to make the session's files theirs. The worker runs nothing but what
        :meth:`run_on`, :meth:`events_on` and :meth:`restore_on` give it; :meth:`unbind`
        ends it. ``WorkerError`` if it cannot be had."""
        if self._closed:
            raise WorkerError("the sandbox is closing")
        worker = None
        while self._spares:
            candidate = self._spares.pop()
            if not candidate.closed:
                worker = candidate
                break
            self._retire(candidate)
        if worker is None:
            worker = await self._spawn(configure=False)  # no spare left: a cold start
        try:
            config = self._sessions.for_session(self.config, self.user, place, worker.lease)
            if hand_over is not None:
                uid, gid = (config.user[0], config.user[1]) if config.user else (None, None)
                if inline:
                    hand_over(uid, gid)
                else:
                    await asyncio.to_thread(hand_over, uid, gid)
            greeting = worker.greeting
            assert greeting is not None
            frame = encode_exact(["config", dataclasses.asdict(config)])
            await asyncio.get_running_loop().sock_sendall(worker.sock, frame)
            try:
                ready = await asyncio.wait_for(greeting, timeout=60)
            except (TimeoutError, WorkerError, OSError) as exc:
                raise WorkerError(f"a session's worker failed to start: {exc}") from exc
            if isinstance(ready, list) and ready and ready[0] == "refused":
                raise WorkerError(f"a session's worker refused its confinement: {ready[1]}")
            if not (isinstance(ready, list) and len(ready) > 2 and ready[0] == "ready"):
                raise WorkerError("a session's worker sent an unexpected greeting")
            worker.pid = serving_pid(worker.process, ready[1])
            if self.stack and place.allow_network:
                await self._connect(worker, stack=True, model=False)  # the relay: as a spare
        except BaseException:
            self._retire(worker)
            raise
        finally:
            # A spare to replace this one, once the session's first run has had the CPU.
            asyncio.get_running_loop().call_later(SPARE_REFILL_S, self.keep_spares)
        worker.bound = True
        self._bound.add(worker)
        return worker

    def unbind(self, worker: Worker) -> None:
        """End a session's worker (paused, deleted, or taken over elsewhere)."""
        if worker.bound:
            self._retire(worker)

    async def run_on(self, worker: Worker, job: Job) -> tuple[RunEnvelope, dict[str, Any] | None]:
        """Run ``job`` on a session's worker: its envelope and what it changed of the
        session's bindings (the ``state`` frame; None where the worker was lost).
        ``WorkerGone`` when the worker could not be given the job."""
        begun = await self._begin(job, on=worker)
        assert isinstance(begun, _Started)
        try:
            while True:
                event = await self._next(job, begun)
                if event.kind == "done":
                    assert event.result is not None
                    return event.result, event.state
        finally:
            self._end(begun)

    async def events_on(self, worker: Worker, job: Job) -> AsyncGenerator[Event, None]:
        """:meth:`events` of ``job`` on a session's worker (the ``done`` event carries its
        ``state``). ``WorkerGone`` before the first event when the worker could not take it."""
        begun = await self._begin(job, on=worker)
        assert isinstance(begun, _Started)
        try:
            while True:
                event = await self._next(job, begun)
                yield event
                if event.kind == "done":
                    return
        finally:
            self._end(begun)

    async def restore_on(self, worker: Worker, docs: list[bytes]) -> list[dict[str, str]]:
        """Restore a session's saved bindings (their documents, as the JSON bytes they were
        saved as) into its worker; the names that could not be, with why."""
        job = Job("restore")
        limits = self._limits(job)
        head = encode(job.payload(limits))[HEADER_BYTES:-1]  # the payload without its "}"
        body = head + b',"docs":[' + b",".join(docs) + b"]}"
        begun = await self._begin(job, on=worker, frame=encode_raw(body))
        assert isinstance(begun, _Started)
        try:
            while True:
                event = await self._next(job, begun)
                if event.kind == "done":
                    break
        finally:
            self._end(begun)
        done = event.result
        assert done is not None
        if not done.success:
            assert done.error is not None
            raise WorkerError(f"restoring the session's bindings failed: {done.error.message}")
        damaged = done.value if isinstance(done.value, list) else []
        return [{"name": str(d.get("name", "?")), "reason": str(d.get("reason", ""))}
                for d in damaged if isinstance(d, dict)]

    # -- handing out workers --------------------------------------------------------------

    def worker_finished(self, worker: Worker, recycle: bool) -> None:
        """A run's ``done`` frame arrived (called from the reader): recycle the worker (when
        it asked to be, after a limit) or give it the next queued run."""
        self._busy.discard(worker)
        if worker.bound:
            if recycle or worker.jobs >= RECYCLE_AFTER_JOBS:
                self.restarts["limit" if recycle else "recycle"] += 1
                self._retire(worker)
            return
        if recycle or worker.jobs >= RECYCLE_AFTER_JOBS:
            self._replace(worker, "limit" if recycle else "recycle")
        else:
            self._release(worker)

    def _release(self, worker: Worker) -> None:
        while self._waiters:
            run, waiter = self._waiters.popleft()
            if not waiter.done():
                self._busy.add(worker)
                worker.start(run)
                waiter.set_result(worker)
                return
        self._idle.append(worker)

    async def _dispatch(self, run: WorkerRun) -> Worker:
        """A worker that has been given ``run`` (see ``run.undelivered``)."""
        if self._idle:
            worker = self._idle.pop()
            self._busy.add(worker)
            worker.start(run)
        else:
            waiter: asyncio.Future[Worker] = asyncio.get_running_loop().create_future()
            self._waiters.append((run, waiter))
            try:
                async with asyncio.timeout(QUEUE_TIMEOUT_S):
                    worker = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    # Handed the job just as the wait ended: abandoned once started.
                    self._replace(waiter.result(), "cancelled")
                else:
                    waiter.cancel()
                raise
        await self._send_rest(worker, run)
        return worker

    async def _send_rest(self, worker: Worker, run: WorkerRun) -> None:
        """Send what of ``run``'s frame the socket did not take at once."""
        if run.unsent is not None and not run.undelivered:
            try:
                await worker.loop.sock_sendall(worker.sock, run.unsent)
            except OSError:
                run.undelivered = True
            except BaseException:
                # Cancelled halfway through a frame: the worker cannot be reused.
                self._replace(worker, "cancelled")
                raise
            run.unsent = None

    async def _begin(
        self, job: Job, payload: dict[str, Any] | None = None, first_wall: float | None = None,
        *, on: Worker | None = None, frame: bytes | None = None,
    ) -> _Started | Event:
        """The job started on a worker (counted in ``active`` until :meth:`_end`), or the
        answer when no worker could take it. ``payload`` replaces the job's own (a batch);
        ``first_wall`` is the wall time the watchdog allows before the first frame back;
        ``on``: the worker bound to a session that must run it (``WorkerGone`` if it cannot);
        ``frame``: the job already encoded.

        A worker found dead before the job reached it (it died while idle) never started
        the job, so the job is retried once on another worker instead of failing.
        """
        limits = self._limits(job)
        if on is not None:
            run = WorkerRun(frame if frame is not None else self._frame(job, limits, payload))
            await self._dispatch_to(on, run)
            wall = limits.wall_time_s or 0.0
            deadline = time.monotonic() + wall + GRACE_S if wall > 0 else None
            self.active += 1
            return _Started(on, run, wall, deadline)
        frame = self._frame(job, limits, payload)
        for _attempt in range(2):
            run = WorkerRun(frame)
            try:
                worker = await self._dispatch(run)
            except TimeoutError:
                return _done_error(
                    job,
                    "TimeoutError",
                    f"no sandbox worker became free within {QUEUE_TIMEOUT_S:g} s",
                )
            if run.undelivered:
                self._replace(worker, "crash")
                continue
            wall = (limits.wall_time_s if first_wall is None else first_wall) or 0.0
            deadline = time.monotonic() + wall + GRACE_S if wall > 0 else None
            self.active += 1
            return _Started(worker, run, wall, deadline)
        return _done_error(job, "LimitError", "the sandbox worker exited unexpectedly")

    @staticmethod
    def _frame(job: Job, limits: Limits, payload: dict[str, Any] | None) -> bytes:
        # What a client sent is sent exactly (NaN, big integers), and its own bytes are
        # passed on rather than decoded and encoded again (a pipeline's input). A job that
        # carries no client values (a program's source, finite limits) is exact in orjson,
        # which takes a fifth of the time: on ``execute 1 + 1`` that was a tenth of the
        # server's work per request.
        if payload is None and not job.carries_values:
            frame = encode(job.payload(limits))
        else:
            frame = encode_exact(payload if payload is not None else job.payload(limits))
        if job.input_json is not None and payload is None:
            frame += encode_raw(job.input_json)
        return frame

    async def _dispatch_to(self, worker: Worker, run: WorkerRun) -> None:
        """Give ``run`` to ``worker``, a session's (whose session lets one run at a time)."""
        if worker.closed or worker.run is not None or worker not in self._bound:
            raise WorkerGone("the session's worker is gone")
        self._busy.add(worker)
        worker.start(run)
        await self._send_rest(worker, run)
        if run.undelivered:
            self._replace(worker, "crash")
            raise WorkerGone("the session's worker exited before it got the job")

    # -- running --------------------------------------------------------------------------

    def new_run_id(self) -> str:
        return uuid.uuid4().hex

    def _limits(self, job: Job) -> Limits:
        base = self.stream_limits if job.stream else self.limits
        return effective_limits(base, job.limits) if job.limits else base

    async def run(self, job: Job) -> RunEnvelope:
        """Run ``job`` to completion and return its envelope (a :class:`PipelineEnvelope`,
        with ``steps``, for a pipeline)."""
        # The same protocol as :meth:`events`, without an async generator in between: this
        # is the path of every non-streaming request.
        begun = await self._begin(job)
        if isinstance(begun, Event):
            assert begun.result is not None
            return begun.result
        try:
            while True:
                event = await self._next(job, begun)
                if event.kind == "done":
                    assert event.result is not None
                    return event.result
        finally:
            self._end(begun)

    async def run_batch(self, jobs: list[Job]) -> list[RunEnvelope]:
        """Run several non-streaming jobs one after the other on one worker, in one round
        trip: the answers are those each job would have had alone, in order.

        The worker reports each job's envelope as it finishes, so the watchdog gives every
        job its own wall time, and a worker lost in the middle costs only the job it was
        running: the ones after it had not started and run again, on their own."""
        if len(jobs) == 1:
            return [await self.run(jobs[0])]
        subs = [j.payload(self._limits(j)) for j in jobs]
        walls = [float(p["limits"]["wall_time_s"] or 0.0) for p in subs]
        payload = {
            "mode": "batch",
            "jobs": subs,
            "stream": False,
            "limits": {},
            "cpu_s": sum(p["cpu_s"] for p in subs),
        }
        batch = Job("batch")
        begun = await self._begin(batch, payload, first_wall=walls[0])
        if isinstance(begun, Event):
            assert begun.result is not None
            return [begun.result for _ in jobs]
        answers: list[RunEnvelope] = []
        try:
            while True:
                event = await self._next(jobs[min(len(answers), len(jobs) - 1)], begun)
                if event.kind == "data" and isinstance(event.text, dict):
                    answers.append(RunEnvelope.from_wire(event.text))
                    if len(answers) < len(jobs):
                        wall = walls[len(answers)]
                        deadline = time.monotonic() + wall + GRACE_S if wall > 0 else None
                        begun = begun._replace(wall=wall, deadline=deadline)
                    continue
                if event.kind == "done":
                    assert event.result is not None
                    if not event.result.success and len(answers) < len(jobs):
                        # The worker was lost during a job: that job's answer is the error;
                        # the jobs after it never started.
                        answers.append(event.result)
                    break
        finally:
            self._end(begun)
        rest = jobs[len(answers) :]
        if rest:
            answers += await self.run_batch(rest)
        return answers

    async def events(self, job: Job) -> AsyncGenerator[Event, None]:
        """Run ``job`` and yield its events as the worker reports them; the last is ``done``.

        Closing the iterator before ``done`` (a client went away) kills the worker.
        """
        begun = await self._begin(job)
        if isinstance(begun, Event):
            yield begun
            return
        try:
            while True:
                event = await self._next(job, begun)
                yield event
                if event.kind == "done":
                    return
        finally:
            self._end(begun)

    def _end(self, started: _Started) -> None:
        self.active -= 1
        if started.worker.run is started.run:
            # Abandoned mid-run (client disconnect, server shutdown): stop the program.
            self._replace(started.worker, "cancelled")

    async def _next(self, job: Job, started: _Started) -> Event:
        """The run's next event. By the time a ``done`` frame is read, the reader has
        already given the worker back (or replaced it)."""
        worker, run, wall, deadline = started
        try:
            message = await worker.recv(
                run, None if deadline is None else max(0.0, deadline - time.monotonic())
            )
        except TimeoutError:
            self._replace(worker, "timeout")
            return _done_error(job, "TimeoutError", f"wall time limit of {wall:g} s exceeded")
        except WorkerError:
            if worker.fault is not None:
                self._replace(worker, "protocol")
                return _done_error(job, "LimitError", "the sandbox worker misbehaved")
            return await self._crashed(job, worker)
        kind = message[0]
        if kind == "done":
            return Event("done", result=message[1], state=message[2])
        if kind == "data":
            return Event("data", text=message[1])
        return Event("progress", step=message[1], total=message[2], message=message[3])

    async def _crashed(self, job: Job, worker: Worker) -> Event:
        # The channel closed: wait briefly for the exit status to tell why.
        until = time.monotonic() + 2.0
        while worker.process.poll() is None and time.monotonic() < until:
            await asyncio.sleep(0.005)
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


def _done_error(job: Job, kind: str, message: str) -> Event:
    envelope = PipelineEnvelope if job.mode == "pipeline" else RunEnvelope
    return Event("done", result=envelope.failure(RunError(kind, message)))
