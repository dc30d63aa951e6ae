"""The server's end of one sandbox worker: its socket, the frames read off it as they arrive,
the run it is doing, and killing it. The pool (:mod:`conch.sandbox.pool`) owns the workers
and decides what each does next; a worker tells its owner when a run is done or its channel
closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from conch.sandbox import cgroups, relay, slirp, uids
from conch.sandbox.envelope import RunEnvelope
from conch.sandbox.frames import MAX_FRAME, decode, split_header

log = logging.getLogger("conch.sandbox")


class Process(Protocol):
    """A worker's process as the pool uses it: one it started (``subprocess.Popen``) or a
    child of the zygote (:class:`conch.sandbox.zygote.ForkedProcess`)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class WorkerError(Exception):
    """A worker did not behave (died, sent garbage, did not start)."""


class WorkerGone(WorkerError):
    """The worker bound to a session is gone (killed, crashed, retired after a limit): the
    job never reached it, and the session needs another."""


class WorkerOwner(Protocol):
    """What a worker tells and asks of the pool that owns it."""

    # Who keeps what a run sends to be recorded (worker pid, kind, data)
    recorder: Callable[[int, str, Any], None] | None

    def worker_finished(self, worker: Worker, recycle: bool) -> None:
        """A run's ``done`` frame arrived (``recycle``: the worker asked to be replaced)."""

    def worker_closed(self, worker: Worker) -> None:
        """The worker's channel closed (it died, or broke the protocol)."""


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class WorkerRun:
    """One job's place on a worker: its encoded frame and the frames that came back."""

    __slots__ = ("frame", "inbox", "state", "undelivered", "unsent", "waiter")

    def __init__(self, frame: bytes) -> None:
        self.frame = frame
        # A session's run: the ``state`` frame that came before ``done``
        self.state: dict[str, Any] | None = None
        self.inbox: deque[list[Any]] = deque()
        self.waiter: asyncio.Future[None] | None = None
        # The tail of a frame too large for one write, for the run's task to send.
        self.unsent: memoryview | None = None
        # The frame could not be written: the worker never started the job.
        self.undelivered = False

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


_KINDS = frozenset({"data", "progress", "done"})
# What a session's run that changed no binding reports (shared: its readers never change it)
_NO_CHANGE: dict[str, Any] = {}


class Worker:
    """The server's end of one worker's channel.

    A reader callback on the event loop takes frames off the socket as they arrive and
    routes them to the worker's current run. When a run's ``done`` frame arrives the worker
    goes straight back to the pool, which writes the next queued job to it from that same
    callback: the worker finds its next job waiting as it finishes the last one instead of
    sleeping until the server's loop comes round to it (on a small VM each such wake-up of a
    sleeping process costs tens of microseconds). A worker that dies while idle is noticed
    here too, and replaced before a run is handed to it.
    """

    def __init__(
        self,
        process: Process,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        pool: WorkerOwner,
    ) -> None:
        self.process = process
        self.sock = sock
        self.pid = process.pid
        self.loop = loop
        self.pool = pool
        self.jobs = 0
        self.closed = False
        self.cgroup: cgroups.WorkerGroup | None = None
        # Its uid (given back once it and all it started are gone), network stack and the
        # relay of the inference server's port into its namespace
        self.lease: uids.Lease | None = None
        self.stack: slirp.Stack | None = None
        self.relays: list[relay.Relay] = []
        # Why the channel is unusable when the worker broke the protocol (not when it died).
        self.fault: str | None = None
        self.run: WorkerRun | None = None
        # Bound to a session (SandboxPool.bind): never handed a run of the shared pool
        self.bound = False
        # A spare (SandboxPool.bind): sent ``prepare``, not the pool's config; ``warm`` is
        # its answer (``["warm", pid]`` or ``["refused", why]``; None: it died first)
        self.spare = False
        self.warm: asyncio.Future[list[Any] | None] = loop.create_future()
        self.greeting: asyncio.Future[Any] | None = loop.create_future()
        self._buf = bytearray()
        self._need = 4
        self._frame_bytes = 0
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._readable)

    # -- receiving ------------------------------------------------------------------------

    def _readable(self) -> None:
        try:
            data: bytes | bytearray = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._shut(None)
            return
        buf = self._buf
        if buf:
            # The rest of a frame that did not fit in one read: parse only once it is whole
            # (re-scanning a large frame on every read would be quadratic).
            buf += data
            if len(buf) < self._need:
                return
            data = buf
        pos = self._parse(data)
        if pos < 0:
            return
        if data is buf:
            del buf[:pos]
        elif pos < len(data):
            buf += memoryview(data)[pos:]
        self._need = 4 + split_header(int.from_bytes(buf[:4], "big"))[0] if len(buf) >= 4 else 4

    def _parse(self, data: bytes | bytearray) -> int:
        """Deliver every whole frame in ``data``; the offset of the first incomplete one,
        or -1 if the worker broke the protocol (the channel is then shut)."""
        pos = 0
        end = len(data)
        while end - pos >= 4:
            size, exact = split_header(int.from_bytes(data[pos : pos + 4], "big"))
            if size > MAX_FRAME:
                self._shut(f"worker sent an oversized frame ({size} bytes)")
                return -1
            stop = pos + 4 + size
            if stop > end:
                break
            self._frame_bytes = size
            try:
                message = decode(data[pos + 4 : stop], exact)
            except (ValueError, RecursionError):
                self._shut("worker sent an undecodable frame")
                return -1
            pos = stop
            if not self._deliver(message):
                return -1
        return pos

    def _deliver(self, message: Any) -> bool:
        greeting = self.greeting
        if greeting is not None:
            if self.spare and not self.warm.done():
                ok = type(message) is list and len(message) == 2 and message[0] in ("warm",
                                                                                     "refused")
                self.warm.set_result(message if ok else None)
                if not ok:
                    self._shut("a spare sandbox worker sent an unexpected greeting")
                    return False
                return True
            self.greeting = None
            if not greeting.done():
                greeting.set_result(message)
            return True
        run = self.run
        kind = message[0] if type(message) is list and message else None
        if kind == "state" and self.bound and run is not None and len(message) == 2 \
                and type(message[1]) is dict and run.state is None:
            run.state = message[1]
            run.state["bytes"] = self._frame_bytes  # the server's count, not the worker's
            return True
        if kind == "record" and run is not None and len(message) == 3:
            # ["record", kind, data]: something the server keeps for the run (an agent
            # builtin's task), handed to the pool's recorder; never a reason to stop the run.
            recorder = self.pool.recorder
            if recorder is not None:
                try:
                    recorder(self.pid, message[1], message[2])
                except Exception:
                    log.exception("sandbox: a worker's record was refused")
            return True
        if run is None or kind not in _KINDS:
            self._shut("the sandbox worker misbehaved")
            return False
        if kind == "done":
            # ["done", envelope, recycle]: read once here, so a malformed envelope is a
            # protocol fault like any other and nothing downstream sees a raw frame.
            try:
                envelope = RunEnvelope.from_wire(message[1])
            except (ValueError, IndexError):
                self._shut("the sandbox worker misbehaved")
                return False
            # A session's worker sends no state frame for a run that changed nothing.
            state = run.state if run.state is not None or not self.bound else _NO_CHANGE
            run.inbox.append(["done", envelope, state])
            self.run = None
            self.pool.worker_finished(self, len(message) > 2 and message[2] is True)
        else:
            run.inbox.append(message)
        run.wake()
        return True

    def _shut(self, fault: str | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.fault = fault
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.sock.fileno())
        if not self.warm.done():
            self.warm.set_result(None)
        if self.greeting is not None and not self.greeting.done():
            self.greeting.set_exception(WorkerError(fault or "worker closed its channel"))
        if self.run is not None:
            self.run.wake()
        self.pool.worker_closed(self)

    async def recv(self, run: WorkerRun, timeout: float | None = None) -> list[Any]:
        """``run``'s next frame; ``TimeoutError`` after ``timeout`` seconds, ``WorkerError``
        once the channel closed before the run finished."""
        if run.inbox:
            return run.inbox.popleft()
        if not self.closed:
            waiter = self.loop.create_future()
            run.waiter = waiter
            timer = self.loop.call_later(timeout, _expire, waiter) if timeout is not None else None
            try:
                await waiter
            except TimeoutError:
                if not run.inbox:  # a frame that came in with the deadline still counts
                    raise
            finally:
                run.waiter = None
                if timer is not None:
                    timer.cancel()
            if run.inbox:
                return run.inbox.popleft()
        raise WorkerError(self.fault or "worker closed its channel")

    # -- sending --------------------------------------------------------------------------

    def start(self, run: WorkerRun) -> None:
        """Write as much of ``run``'s frame as the socket takes now; the run's task sends
        any rest. A failed write means the worker never got the job."""
        self.run = run
        self.jobs += 1
        if self.closed:
            run.undelivered = True
            return
        frame = run.frame
        try:
            sent = self.sock.send(frame)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            run.undelivered = True
            return
        if sent < len(frame):
            run.unsent = memoryview(frame)[sent:]

    def kill(self) -> None:
        # The worker leads its own process group: whatever it started goes with it (and in
        # a PID namespace of its own, what left the group too).
        with contextlib.suppress(ProcessLookupError, OSError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for pid in {self.pid, self.process.pid}:
            with contextlib.suppress(ProcessLookupError, OSError):
                os.kill(pid, signal.SIGKILL)
        for served in self.relays:
            served.close()
        self.relays = []
        if self.stack is not None:
            self.stack.stop()
            self.stack = None
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self.loop.remove_reader(self.sock.fileno())
            if self.run is not None:
                self.run.wake()
            if not self.warm.done():
                self.warm.set_result(None)
        with contextlib.suppress(Exception):
            self.sock.close()

    def exit_signal(self) -> int | None:
        code = self.process.poll()
        return -code if code is not None and code < 0 else None


def serving_pid(process: Process, reported: Any) -> int:
    """The pid of the process that serves jobs: the one started, or (a worker that is PID 1
    of a namespace of its own) its child, which its greeting names. Read before the worker
    ran anything of a client's, and checked against the kernel's view all the same."""
    if type(reported) is int and reported != process.pid:
        try:
            with open(f"/proc/{reported}/stat", "rb") as stat:
                parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return process.pid
        if parent == process.pid:
            return reported
    return process.pid


def reap(process: Process, timeout: float = 5.0) -> None:
    """Wait for a killed worker's process to end (at most ``timeout`` s)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout)
