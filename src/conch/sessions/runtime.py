"""Running a session's programs: a sandbox worker of its own while it is active, its bindings
saved after every run, its lease held across servers, paused when idle.

**A worker per active session.** The kernel layers (a uid, a mount namespace, Landlock) are
applied once per worker process, so a session needs a worker of its own: on its first run
(or its first after a pause) the server takes its lease, binds a warm spare to the session's
workspace (:meth:`conch.sandbox.pool.SandboxPool.bind`: its files handed to the worker's uid
first) and restores the bindings saved last into the worker's ``conch.lang.Session``. Its
next runs go to that worker, one at a time in arrival order (an ``asyncio.Lock``, which
wakes its waiters in order), and find their bindings in its memory.

**Saved before answering.** A run's ``done`` frame is preceded by what it changed of the
session's bindings (their documents); they are written with :class:`SessionState` before the
run is answered, so a server killed after answering has lost nothing. What could not be saved
is named in the answer (``unsaved``) and its older saved value forgotten, so that a resumed
session never brings back a value its last run had replaced.

**Leases.** The lease (:mod:`conch.sessions.store`) is taken when a session starts running on
this server and renewed by a heartbeat while it runs; a session idle for ``HOLD_S`` gives it
back (its worker stays warm), so that another server may run it. A server that takes the
lease back compares the session's saved state and its workspace's owner with what its worker
has: if another server ran the session meanwhile, the worker is replaced and the state
restored. A run on a session another server holds waits up to ``BUSY_WAIT_S`` for the lease,
then answers ``409`` with ``Retry-After``.

**Counting runs.** A run's bindings are saved before it is answered; its row (``runs``,
``last_used_at``, ``expires_at``) is updated by the heartbeat, for all the runs of the last
second at once: writing the row on every run would cost more than the run itself. So after a
SIGKILL the row may count up to a second of runs fewer than were made; their bindings and
files are all there.

**Idle.** A session idle ``session_idle_s`` is paused: its worker exits, the row says
``paused``, and no process is left for it. The heartbeat also expires sessions past their TTL
(:meth:`SessionService.sweep`) and marks paused what a dead server left active.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conch.config import parse_id_range
from conch.sandbox.channel import Worker, WorkerError, WorkerGone
from conch.sandbox.envelope import RunEnvelope
from conch.sandbox.jobs import Event, Job, Placement
from conch.sandbox.pool import SandboxPool
from conch.sessions.errors import (
    LeaseLost,
    NoWorker,
    SessionBusy,
    SessionError,
    SessionMisplaced,
    SessionNotFound,
)
from conch.sessions.instance import Instance
from conch.sessions.layout import check_id
from conch.sessions.limits import server_limits
from conch.sessions.records import Session
from conch.sessions.service import SessionService
from conch.sessions.state import SessionState, Snapshot

log = logging.getLogger("conch.sessions")

# How often the heartbeat writes the runs of the last tick, gives back idle leases and
# pauses idle sessions; leases are renewed every third of their length.
TICK_S = 1.0
# A session idle this long gives its lease back (its worker stays warm until
# session_idle_s): another server may then run it.
HOLD_S = 2.0
# How long a run waits for a session another server holds before it is answered 409.
BUSY_WAIT_S = 5.0
# How often expired sessions are deleted and abandoned ones marked paused.
SWEEP_S = 60.0
# A state frame larger than this is saved off the event loop.
INLINE_SAVE_BYTES = 64 * 1024

Unsaved = list[dict[str, str]]


@dataclass(eq=False)
class _Live:
    """A session this server runs (or ran lately): its worker, lease and unrecorded runs."""

    id: str
    state: SessionState
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    worker: Worker | None = None
    # Who the worker runs as (the workspace's owner), and the saved state's version its
    # bindings are: either differing on disk means the session ran elsewhere since.
    uid: int | None = None
    version: int = 0
    tenant: str | None = None
    held: bool = False
    lease_until: float = 0.0
    epoch: int = 0  # counts the leases taken, so a renewal's answer is read against its own
    limits: dict[str, Any] = field(default_factory=dict)
    allow_network: bool = False
    allow_process: bool = False
    last_used: float = field(default_factory=time.monotonic)
    users: int = 0  # runs waiting for or holding the lock
    pending_runs: int = 0
    pending_saves: int = 0
    last_run_at: float = 0.0
    # Bindings the last resume could not restore, for the next answer's ``unsaved``
    notes: Unsaved = field(default_factory=list)


class SessionRuntime:
    """The sessions this server runs: a worker each while active (see the module doc)."""

    def __init__(
        self, service: SessionService, pool: SandboxPool, *, instance: Instance | None = None
    ) -> None:
        self.service = service
        self.store = service.store
        self.pool = pool
        self.settings = service.settings
        self.instance = instance if instance is not None else Instance.claim(
            self.settings.data_dir)
        self.owner = self.instance.id
        self.lease_s = float(self.settings.orchestration_lease_s)
        self._others = (parse_id_range(self.settings.sandbox_uids)
                        if self.settings.sandbox_uids else None)
        # SQLite calls take well under a millisecond: on the loop (as the orchestrator's).
        self._inline_db = self.store.engine.dialect.name == "sqlite"
        self._threads = ThreadPoolExecutor(4, thread_name_prefix="sessions")
        self._live: dict[str, _Live] = {}
        self._heart: asyncio.Task[None] | None = None
        self._closing = False

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """After the pool has started: ``sessions_dir`` made private where workers reach
        their workspace through a mount namespace of their own, leases of this server's
        previous life given back, spares started, the heartbeat."""
        await asyncio.to_thread(self._prepare_dir)
        stale = await self.db(self.store.renew_all, self.owner, self.lease_s)
        for id in stale:  # held by this server's predecessor, which is dead: nothing runs it
            with contextlib.suppress(SessionError):
                await self.db(self.store.mark_paused, id, owner=self.owner)
        self.pool.keep_spares()
        self._heart = asyncio.get_running_loop().create_task(self._heartbeat())

    def _prepare_dir(self) -> None:
        base = self.settings.sessions_dir
        base.mkdir(parents=True, exist_ok=True)
        # With mount namespaces, a worker sees its own workspace bound into a tmpfs over
        # sessions_dir, and no sandbox uid needs to pass through sessions_dir at all.
        private = os.geteuid() == 0 and self.pool.namespaced
        os.chmod(base, 0o700 if private else 0o711)

    async def close(self) -> None:
        """Stop every session's worker, record their runs, and pause them (their state is
        on disk already)."""
        self._closing = True
        if self._heart is not None:
            self._heart.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heart
        for live in list(self._live.values()):
            warm = live.worker is not None
            self._unbind(live)
            with contextlib.suppress(SessionError):
                await self._flush(live)
                if live.held or warm:  # no process holds it any more
                    await self.db(self.store.mark_paused, live.id, owner=self.owner)
            live.held = False
        self._live.clear()
        self._threads.shutdown(wait=False)
        self.instance.close()

    async def db(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """A store call: inline on SQLite, in a thread on PostgreSQL."""
        if self._inline_db:
            return fn(*args, **kw)
        call = functools.partial(fn, *args, **kw)
        return await asyncio.get_running_loop().run_in_executor(self._threads, call)

    # -- running ----------------------------------------------------------------------------

    async def run(
        self, id: str, job: Job, *, tenant: str | None = None
    ) -> tuple[RunEnvelope, Unsaved]:
        """Run ``job`` in session ``id``, after the runs before it; its envelope and the
        bindings it could not save. ``SessionNotFound``, ``SessionBusy`` (another server
        runs it), ``NoWorker``."""
        async with self._turn(id, tenant) as live:
            self._prepare(live, job)
            for attempt in (0, 1):
                assert live.worker is not None
                try:
                    envelope, state = await self.pool.run_on(live.worker, job)
                    break
                except WorkerGone:
                    if attempt:
                        raise NoWorker("the session's sandbox worker could not be kept") from None
                    await self._bind(live)
            return envelope, await self._after(live, state)

    async def events(
        self, id: str, job: Job, *, tenant: str | None = None
    ) -> AsyncGenerator[Event, None]:
        """:meth:`run` as the run's events (:meth:`SandboxPool.events`); the ``done`` event's
        ``unsaved`` holds the bindings it could not save. Closing it before ``done`` stops
        the run (its worker is replaced, its bindings resumed from the last save)."""
        async with self._turn(id, tenant) as live:
            self._prepare(live, job)
            first, stream = await self._start_events(live, job)
            async with contextlib.aclosing(stream):
                event: Event | None = first
                while event is not None:
                    if event.kind == "done":
                        event.unsaved = await self._after(live, event.state)
                    yield event
                    if event.kind == "done":
                        return
                    event = await anext(stream, None)

    async def _start_events(
        self, live: _Live, job: Job
    ) -> tuple[Event, AsyncGenerator[Event, None]]:
        for attempt in (0, 1):
            assert live.worker is not None
            stream = self.pool.events_on(live.worker, job)
            try:
                return await anext(stream), stream
            except WorkerGone:
                await stream.aclose()
                if attempt:
                    raise NoWorker("the session's sandbox worker could not be kept") from None
                await self._bind(live)
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def _turn(self, id: str, tenant: str | None) -> AsyncIterator[_Live]:
        """The session's turn: its lock (runs go one at a time, in arrival order), its lease
        and a worker bound to it."""
        if self._closing:
            raise NoWorker("the server is shutting down")
        check_id(id)
        live = self._live.get(id)
        if live is None:
            live = self._live[id] = _Live(id, self.service.state(id))
        live.users += 1
        try:
            async with live.lock:
                await self._ready(live, tenant)
                try:
                    yield live
                finally:
                    live.last_used = time.monotonic()
        finally:
            live.users -= 1
            self._forget_if_idle(live)

    async def _ready(self, live: _Live, tenant: str | None) -> None:
        if live.worker is not None and live.worker.closed:
            live.worker = None  # lost (a crash, a limit): the next worker resumes from disk
        if live.held and not os.path.isdir(live.state.dir):
            # Deleted, by another server perhaps, since this one last asked: ask again.
            self._unbind(live)
            live.held = False
        now = time.time()
        if not live.held or now > live.lease_until - self.lease_s / 3:
            session = await self._acquire(live, tenant)
            live.held = True
            live.epoch += 1
            live.lease_until = now + self.lease_s
            live.tenant = session.tenant
            live.limits = self._lowered(session)
            live.allow_network = session.allow_network
            live.allow_process = session.allow_process
            if live.worker is not None and self._stale(live):  # a stat and two small reads
                self._unbind(live)
        elif tenant is not None and live.tenant != tenant:
            raise SessionNotFound(f"no session {live.id!r}", where="session")
        if live.worker is None:
            await self._make_room()
            await self._bind(live)

    async def _make_room(self) -> None:
        """Pause the sessions idle longest while this server keeps ``session_workers_max``
        workers or more (one is about to be bound)."""
        warm = [live for live in self._live.values() if live.worker is not None]
        excess = len(warm) + 1 - max(1, self.settings.session_workers_max)
        if excess <= 0:
            return
        idle = sorted((live for live in warm if not live.users and not live.lock.locked()),
                      key=lambda live: live.last_used)
        for live in idle[:excess]:
            async with live.lock:
                with contextlib.suppress(SessionError):
                    await self._pause(live)
            self._forget_if_idle(live)

    async def _acquire(self, live: _Live, tenant: str | None) -> Session:
        """The session's lease; waits up to ``BUSY_WAIT_S`` while another server holds it."""
        give_up = time.monotonic() + BUSY_WAIT_S
        delay = 0.05
        while True:
            try:
                session: Session = await self.db(
                    self.store.acquire, live.id, self.owner, self.lease_s, tenant=tenant)
                return session
            except SessionBusy:
                if time.monotonic() + delay > give_up:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _lowered(self, session: Session) -> dict[str, Any]:
        """The limits the session lowers below the server's now (the pool applies the
        server's own, or a stream's, to the rest)."""
        server = server_limits(self.settings)
        return {key: value for key, value in session.limits.items()
                if key in server and isinstance(value, int | float) and value < server[key]}

    def _stale(self, live: _Live) -> bool:
        """Whether the session ran on another server since this worker's last run."""
        try:
            owner = os.lstat(self.service.dirs.workspace(live.id)).st_uid
        except FileNotFoundError:
            return True
        if live.uid is not None and owner != live.uid:
            return True
        return live.state.version() != live.version

    async def _bind(self, live: _Live) -> None:
        """A worker for the session: a spare bound to its workspace, its files handed to the
        worker's user, its saved bindings restored."""
        self._unbind(live)
        self._present(live.id)
        if live.state.version() == 0:
            snapshot = Snapshot(0, {})  # nothing saved yet (a new session): nothing to read
        else:
            snapshot = await asyncio.to_thread(live.state.load, raw=True, collect=True)
        given: dict[str, int | None] = {}

        def hand_over(uid: int | None, gid: int | None) -> None:
            self.service.dirs.hand_over(live.id, uid, gid, others=self._others)
            given["uid"] = uid

        place = Placement(self.service.dirs.workspace(live.id), live.allow_network,
                          live.allow_process)
        try:
            worker = await self.pool.bind(place, hand_over=hand_over,
                                          inline=self._small(place.workspace))
        except (WorkerError, OSError) as exc:
            raise NoWorker(f"no sandbox worker could be started for the session: {exc}") from exc
        damaged = list(snapshot.damaged)
        if snapshot.bindings:
            try:
                damaged += await self.pool.restore_on(worker, list(snapshot.bindings.values()))
            except WorkerError as exc:
                self.pool.unbind(worker)
                raise NoWorker(f"the session's bindings could not be restored: {exc}") from exc
        live.worker = worker
        live.uid = given.get("uid")
        live.version = snapshot.version
        if damaged:
            # Named once, in the next answer, and forgotten: a document that cannot be read
            # now will not be read later either.
            names = [d["name"] for d in damaged]
            live.version = await asyncio.to_thread(live.state.save, (), names)
            live.notes += [{"name": d["name"],
                            "reason": f"its saved value could not be restored ({d['reason']})"}
                           for d in damaged]

    @staticmethod
    def _small(workspace: Path) -> bool:
        """Whether the workspace holds a few plain files at most (handed over on the loop:
        a thread would cost more than the few ``chown`` calls)."""
        try:
            with os.scandir(workspace) as it:
                for n, entry in enumerate(it):
                    if n >= 16 or entry.is_dir(follow_symlinks=False):
                        return False
        except OSError:
            return False
        return True

    def _present(self, id: str) -> None:
        if not self.service.dirs.exists(id):
            raise SessionMisplaced(
                f"session {id!r} is in the database, but its files are not under this "
                f"server's sessions_dir ({self.settings.sessions_dir}): servers that share a "
                "database must share sessions_dir too", where="session")

    def _unbind(self, live: _Live) -> None:
        if live.worker is not None:
            self.pool.unbind(live.worker)
            live.worker = None

    def _prepare(self, live: _Live, job: Job) -> None:
        """The job's limits: the request's, lowered to the session's."""
        if not live.limits:
            return
        limits = dict(live.limits)
        for key, value in (job.limits or {}).items():
            if value is not None:
                limits[key] = min(limits[key], value) if key in limits else value
        job.limits = limits

    async def _after(self, live: _Live, state: dict[str, Any] | None) -> Unsaved:
        """Save what the run changed (before it is answered); what could not be saved."""
        notes, live.notes = live.notes, []
        live.pending_runs += 1
        live.last_run_at = time.time()
        if state is None:
            # The worker was lost during the run (a crash, the wall time): what the run bound
            # went with it, and the next run resumes from the last save.
            if live.worker is not None and live.worker.closed:
                live.worker = None
            return notes
        docs, removed, unsaved = _checked(state)
        quota = self.settings.session_disk_mb * 1024 * 1024
        if docs and live.state.size_bytes() + int(state.get("bytes") or 0) > quota:
            # The saved state is bounded as the files are: a session cannot fill the disk
            # with bindings either.
            unsaved += [{"name": str(d["name"]), "reason": (
                f"the session's saved bindings would take more than session_disk_mb "
                f"({self.settings.session_disk_mb} MiB)")} for d in docs]
            docs = []
        # A binding whose new value cannot be saved must not come back with its old one.
        removed += [u["name"] for u in unsaved]
        if docs or removed:
            try:
                if int(state.get("bytes") or 0) > INLINE_SAVE_BYTES:
                    version = await asyncio.to_thread(live.state.save, docs, removed)
                else:
                    version = live.state.save(docs, removed)
            except (ValueError, OSError) as exc:
                unsaved += [{"name": str(d.get("name")), "reason": f"saving it failed: {exc}"}
                            for d in docs]
            else:
                if version != live.version:
                    live.pending_saves += 1
                live.version = version
        return notes + unsaved

    # -- the resource's other uses ----------------------------------------------------------

    async def pause(self, id: str, *, tenant: str | None = None) -> Session:
        """Pause the session now: its worker ends, its state is on disk. ``SessionBusy`` if
        another server is running it."""
        await self.db(self.service.get, id, tenant=tenant)
        live = self._live.get(id)
        if live is not None:
            live.users += 1
            try:
                async with live.lock:
                    await self._pause(live)
            finally:
                live.users -= 1
                self._forget_if_idle(live)
        else:
            await self.db(self.store.mark_paused, id, owner=self.owner)
        session: Session = await self.db(self.store.get, id, tenant=tenant)
        return session

    async def delete(self, id: str, *, tenant: str | None = None) -> None:
        """Delete the session: a run of it in progress is stopped, its worker ended, its
        files, state and row removed."""
        await self.db(self.service.get, id, tenant=tenant)
        live = self._live.pop(id, None)
        if live is not None:
            self._unbind(live)
            live.held = False
            live.pending_runs = 0
        await asyncio.to_thread(self.service.delete, id, tenant=tenant)

    async def flush(self, id: str | None = None) -> None:
        """Record the runs not yet written to the sessions' rows (of ``id``, or all)."""
        lives = [self._live[id]] if id is not None and id in self._live else (
            list(self._live.values()) if id is None else [])
        for live in lives:
            with contextlib.suppress(SessionError):
                await self._flush(live)

    def worker_pid(self, id: str) -> int | None:
        """The pid of the worker this server keeps for the session (None: none now)."""
        live = self._live.get(id)
        if live is None or live.worker is None or live.worker.closed:
            return None
        return live.worker.pid

    # -- the heartbeat ----------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        renewed = swept = time.monotonic()
        while True:
            await asyncio.sleep(TICK_S)
            try:
                now = time.monotonic()
                for live in list(self._live.values()):
                    if live.pending_runs and live.held:
                        with contextlib.suppress(SessionError):
                            await self._flush(live)
                if now - renewed >= self.lease_s / 3:
                    renewed = now
                    await self._renew()
                await self._idle(now)
                if now - swept >= SWEEP_S:
                    swept = now
                    await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sessions: the heartbeat failed; it goes on")

    async def _flush(self, live: _Live) -> None:
        n, k, at = live.pending_runs, live.pending_saves, live.last_run_at
        if not n:
            return
        live.pending_runs = live.pending_saves = 0
        try:
            await self.db(self.store.record_run, live.id, self.owner, runs=n, saves=k,
                          now=at)
        except (LeaseLost, SessionNotFound):
            self._lose(live)
            raise

    async def _renew(self) -> None:
        held = {id: live.epoch for id, live in self._live.items() if live.held}
        renewed: set[str] = await self.db(self.store.renew_all, self.owner, self.lease_s)
        now = time.time()
        for id in renewed:
            live = self._live.get(id)
            if live is None:
                # A lease of this server's that nothing here runs (a release that failed).
                with contextlib.suppress(SessionError):
                    await self.db(self.store.release, id, self.owner)
            elif live.held:
                live.lease_until = now + self.lease_s
        for id, epoch in held.items():
            live = self._live.get(id)
            if id not in renewed and live is not None and live.held and live.epoch == epoch:
                log.info("sessions: %s was deleted or taken over elsewhere; its worker ends", id)
                self._lose(live)

    async def _idle(self, now: float) -> None:
        for live in list(self._live.values()):
            if live.users or live.lock.locked():
                continue
            idle = now - live.last_used
            if idle >= self.settings.session_idle_s and (live.worker is not None or live.held):
                async with live.lock:
                    with contextlib.suppress(SessionError):
                        await self._pause(live)
                self._forget_if_idle(live)
            elif live.held and idle >= HOLD_S:
                async with live.lock:
                    with contextlib.suppress(SessionError):
                        await self._flush(live)
                        await self.db(self.store.release, live.id, self.owner)
                    live.held = False

    async def _pause(self, live: _Live) -> None:
        """(Its lock held.) End the session's worker and mark it paused."""
        self._unbind(live)
        try:
            await self._flush(live)
        finally:
            live.held = False
            with contextlib.suppress(SessionNotFound):
                await self.db(self.store.mark_paused, live.id, owner=self.owner)
        # No program can change its files while paused: the figure lists show stays true.
        with contextlib.suppress(SessionError, OSError):
            await self.db(self.service.measure, live.id)

    def _lose(self, live: _Live) -> None:
        """The session was deleted, expired or taken over elsewhere: stop running it here."""
        self._unbind(live)
        live.held = False
        live.pending_runs = live.pending_saves = 0
        self._forget_if_idle(live)

    def _forget_if_idle(self, live: _Live) -> None:
        if (live.users == 0 and live.worker is None and not live.held and not live.pending_runs
                and self._live.get(live.id) is live):
            del self._live[live.id]

    async def sweep(self) -> dict[str, list[str]]:
        """Delete expired sessions (SessionService.sweep) and stop running them here; mark
        paused what a dead server left active."""
        done = await asyncio.to_thread(self.service.sweep)
        for id in done["expired"] + done["deleted"]:
            live = self._live.get(id)
            if live is not None:
                self._lose(live)
        await self.db(self.store.pause_abandoned, self.settings.session_idle_s)
        return done


def _checked(state: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str], Unsaved]:
    """A worker's ``state`` frame, kept to what it should hold (a worker is not trusted)."""
    raw = state.get("saved")
    docs = [d for d in raw if isinstance(d, dict) and isinstance(d.get("name"), str)
            and isinstance(d.get("type"), str)] if isinstance(raw, list) else []
    raw = state.get("removed")
    removed = [n for n in raw if isinstance(n, str)] if isinstance(raw, list) else []
    raw = state.get("unsaved")
    unsaved = [{"name": str(u.get("name")), "reason": str(u.get("reason"))}
               for u in raw if isinstance(u, dict)] if isinstance(raw, list) else []
    return docs, removed, unsaved
