"""The zygote: one warm, unconfined worker process that forks the spares sessions bind.

A session needs a worker of its own (the kernel layers are applied once per process), and a
worker started from scratch spends about half a second of CPU importing conch before it can
be confined: a server making sessions at any rate would spend its CPU starting interpreters.
So the pool starts one more worker, the zygote, as it starts every worker (``python -P -m
conch.worker_process FD zygote``: a fresh interpreter that inherits none of the server's
state), which imports everything, does what every session's worker would do before knowing
its session (:func:`conch.sandbox.worker._stage`), and then only forks: each child is a
spare, warm from its first instruction, at the cost of a ``fork``.

The zygote never runs a program, never drops root nor enters a namespace, and holds nothing
a program could want (the worker's scrubbed environment, settings without secrets). Each
child closes the zygote's channel, leads a process group of its own (``setsid``, so the
server kills it and what it starts as one) and dies with the zygote (``PR_SET_PDEATHSIG``),
then goes on as any spare: its namespaces, its config, its confinement.

The channel is a ``SOCK_SEQPACKET`` socket pair, one JSON message per packet:
``{"prepare": {...}}`` (first; answered ``["ready"]`` or ``["refused", why]``), ``{"fork":
n}`` with the child's own socket passed alongside (``SCM_RIGHTS``; answered ``["forked", n,
pid]``), and, from the zygote, ``["exited", pid, status]`` when it reaps a child (the server
is not the children's parent, so it learns their exit status here).

:func:`serve` is the zygote's side; :class:`Zygote` and :class:`ForkedProcess` the server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import Any

_PR_SET_PDEATHSIG = 1
_MAX_MESSAGE = 1 << 16


# -- the zygote's side ----------------------------------------------------------------------


def _send(sock: socket.socket, message: Any) -> None:
    sock.send(json.dumps(message).encode())


def serve(sock: socket.socket, prepare: Callable[[dict[str, Any]], None]) -> socket.socket:
    """Prepare (``prepare`` with the first message's ``prepare``), then fork a child for each
    request. Never returns in the zygote (it exits when the server closes the channel);
    returns in each child, with the socket the server passed for it."""
    try:
        first = json.loads(sock.recv(_MAX_MESSAGE))
        prepare(first["prepare"])
    except Exception as exc:
        with contextlib.suppress(OSError):
            _send(sock, ["refused", f"{type(exc).__name__}: {exc}"])
        os._exit(1)
    _send(sock, ["ready"])
    zygote = os.getpid()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    signal.set_wakeup_fd(wake_w)
    channel = sock.fileno()
    while True:
        try:
            readable, _, _ = select.select([channel, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
            _reap_children(sock)
        if channel not in readable:
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, 1)
        except InterruptedError:
            continue
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)  # the server is gone: the children follow (PR_SET_PDEATHSIG)
        try:
            number = int(json.loads(data)["fork"])
        except (ValueError, KeyError, TypeError):
            number = -1
        if number < 0 or not fds:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(wake_r)
            os.close(wake_w)
            sock.close()
            os.setsid()
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != zygote:  # the zygote died before the line above
                os._exit(1)
            return socket.socket(fileno=fds[0])
        for fd in fds:
            os.close(fd)
        _send(sock, ["forked", number, pid])


def _reap_children(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):
            _send(sock, ["exited", pid, status])


# -- the server's side ----------------------------------------------------------------------


class ForkedProcess:
    """A child of the zygote as the pool sees a worker's process (``pid``, ``poll``,
    ``wait``, as ``subprocess.Popen``): its exit status arrives from the zygote."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._done = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._done.set()


class ZygoteError(Exception):
    """The zygote could not start, refused to prepare, or is gone."""


class Zygote:
    """The server's end of the zygote (see the module doc)."""

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.process = process
        self.sock = sock
        self.loop = loop
        self.closed = False
        self.children: dict[int, ForkedProcess] = {}
        self.ready: asyncio.Future[list[Any]] = loop.create_future()
        self._forks: dict[int, asyncio.Future[ForkedProcess]] = {}
        self._next = 0
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._readable)

    @classmethod
    async def start(cls, popen: Callable[[int], subprocess.Popen[bytes]],
                    prepare: dict[str, Any], timeout: float = 120.0) -> Zygote:
        """Start the zygote (``popen(fd)`` starts the interpreter with its end of the
        channel) and wait until it has prepared. ``ZygoteError`` if it does not."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = await asyncio.to_thread(popen, child.fileno())
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        zygote = cls(process, parent, asyncio.get_running_loop())
        try:
            parent.send(json.dumps({"prepare": prepare}).encode())
            answer = await asyncio.wait_for(asyncio.shield(zygote.ready), timeout)
        except (OSError, TimeoutError, ZygoteError) as exc:
            zygote.kill()
            raise ZygoteError(f"the zygote did not start: {exc}") from exc
        if answer[:1] != ["ready"]:
            zygote.kill()
            raise ZygoteError(f"the zygote refused to prepare: {answer[1:]}")
        return zygote

    async def fork(self, fd: int, timeout: float = 30.0) -> ForkedProcess:
        """A new child serving on ``fd`` (the caller's to close once this returns)."""
        if self.closed:
            raise ZygoteError("the zygote is gone")
        number = self._next
        self._next += 1
        answer = self.loop.create_future()
        self._forks[number] = answer
        try:
            socket.send_fds(self.sock, [json.dumps({"fork": number}).encode()], [fd])
            return await asyncio.wait_for(asyncio.shield(answer), timeout)
        except (OSError, TimeoutError) as exc:
            raise ZygoteError(f"the zygote did not fork: {exc}") from exc
        finally:
            self._forks.pop(number, None)

    def _readable(self) -> None:
        try:
            data = self.sock.recv(_MAX_MESSAGE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._gone()
            return
        try:
            message = json.loads(data)
            kind = message[0]
        except (ValueError, IndexError, KeyError, TypeError):
            self._gone()
            return
        if kind in ("ready", "refused"):
            if not self.ready.done():
                self.ready.set_result(message)
        elif kind == "forked" and len(message) == 3:
            child = ForkedProcess(int(message[2]))
            self.children[child.pid] = child
            answer = self._forks.get(int(message[1]))
            if answer is not None and not answer.done():
                answer.set_result(child)
        elif kind == "exited" and len(message) == 3:
            gone = self.children.get(int(message[1]))
            if gone is not None:
                del self.children[gone.pid]
                gone.exited(os.waitstatus_to_exitcode(int(message[2])))

    def _gone(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.sock.fileno())
        # Its children die with it (PR_SET_PDEATHSIG); their statuses are not known.
        for child in self.children.values():
            child.exited(-signal.SIGKILL)
        self.children.clear()
        for answer in self._forks.values():
            if not answer.done():
                answer.set_exception(ZygoteError("the zygote is gone"))
        if not self.ready.done():
            self.ready.set_exception(ZygoteError("the zygote exited"))
        with contextlib.suppress(OSError):
            self.sock.close()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self._gone()

    def reap(self, timeout: float = 5.0) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
