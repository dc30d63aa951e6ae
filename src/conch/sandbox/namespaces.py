"""A worker's own namespaces: mount, network and PID, entered once, as root, before the
kernel layers that forbid them (Landlock, seccomp) and before the drop to the sandbox user.

- **mount** (:mod:`conch.sandbox.mountns`): the directories where the host keeps its sockets
  (``/tmp``, ``/run`` …) and a directory the sandbox user cannot search are covered by
  empty tmpfs (the latter holding only the way to the workspace).
- **network** (:mod:`conch.sandbox.netns`): a loopback of the worker's own, and with
  ``allow_network`` the routes that refuse private and loopback ranges before the server
  attaches a user-mode stack.
- **PID**: the worker forks once more; the child is PID 1 of a new PID namespace and serves
  jobs, so that when it ends — killed by the server, replaced, or its server gone — the kernel
  kills everything it started, ``setsid`` or not. The parent stays outside, as the process
  the server started, waits for the child and leaves as it did (the same exit status or
  signal), so that the server's view of a worker does not change.

:func:`check` tries all of it in a child process, for the server to decide before it starts
workers what they will apply.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1

_libc: ctypes.CDLL | None = None


def _unshare(flags: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.unshare(ctypes.c_int(flags)) != 0:
        err = ctypes.get_errno()
        names = "|".join(name for name, bit in (("CLONE_NEWNS", CLONE_NEWNS),
                                                ("CLONE_NEWPID", CLONE_NEWPID),
                                                ("CLONE_NEWNET", CLONE_NEWNET)) if flags & bit)
        raise OSError(err, f"unshare({names}): {os.strerror(err)}")


@dataclass
class Plan:
    """What a worker enters (plain data: it crosses the process boundary in the config).

    ``net`` is ``""`` (the host's network namespace), ``"none"`` (its own, loopback only) or
    ``"stack"`` (its own, with ``prohibit`` routes, for a user-mode stack the server attaches).
    ``covers`` are the directories to cover (none beneath another); ``files`` the name
    resolver's files to put in place (path: text)."""

    pid: bool = False
    net: str = ""
    covers: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    prohibit: list[str] = field(default_factory=list)


def enter(plan: Plan | dict[str, Any], workspace: str) -> None:
    """Enter the namespaces of ``plan`` (this process must be root and single-threaded).
    With a PID namespace this returns in a new process, PID 1 of it; the one that called
    it waits outside and exits with it. Raises ``OSError`` naming the step that failed."""
    if isinstance(plan, dict):
        plan = Plan(**plan)
    from conch.sandbox import mountns, netns

    flags = CLONE_NEWNS | (CLONE_NEWNET if plan.net else 0) | (CLONE_NEWPID if plan.pid else 0)
    _unshare(flags)
    mountns.setup(workspace, plan.covers, plan.files)
    if plan.net:
        netns.loopback_up()
        if plan.prohibit:
            netns.prohibit(plan.prohibit)
    if plan.pid:
        _fork_into_pid_namespace()


def enter_processes(plan: Plan | dict[str, Any]) -> None:
    """The first half of :func:`enter`, for a spare worker that does not know its workspace
    yet: the network namespace (its loopback, its routes) and the PID namespace (this
    returns in PID 1 of it). :func:`enter_mounts` does the rest once the workspace is known."""
    if isinstance(plan, dict):
        plan = Plan(**plan)
    from conch.sandbox import netns

    flags = (CLONE_NEWNET if plan.net else 0) | (CLONE_NEWPID if plan.pid else 0)
    if flags:
        _unshare(flags)
    if plan.net:
        netns.loopback_up()
        if plan.prohibit:
            netns.prohibit(plan.prohibit)
    if plan.pid:
        _fork_into_pid_namespace()


def enter_mounts(plan: Plan | dict[str, Any], workspace: str) -> None:
    """The second half of :func:`enter`: a mount namespace of this process's own, set up for
    ``workspace`` (:func:`conch.sandbox.mountns.setup`)."""
    if isinstance(plan, dict):
        plan = Plan(**plan)
    from conch.sandbox import mountns

    _unshare(CLONE_NEWNS)
    mountns.setup(workspace, plan.covers, plan.files)


def _fork_into_pid_namespace() -> None:
    child = os.fork()
    if child == 0:
        # PID 1 of the new namespace. Should the process outside die first (the server
        # killed it alone), this one goes too, and with it the namespace.
        global _libc
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        return
    _wait_outside(child)


def _wait_outside(child: int) -> None:
    """The process the server started, once its child serves: hold nothing (the channel's
    other end must close when the child ends), wait, and end as the child ended."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):
                os.close(fd)
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    while True:
        try:
            _pid, status = os.waitpid(child, 0)
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        break
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


def reap_orphans() -> None:
    """In PID 1 of a worker's namespace, between jobs: kill whatever the last job left
    running (a command put in the background, ``setsid`` or not) and collect what has
    exited. ``kill(-1)`` from the namespace's first process reaches exactly the processes of
    its namespace; nothing outside. A process that takes longer to die is collected next
    time."""
    try:
        pid, _status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return  # nothing was started, or all of it is collected: the common case
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    for _ in range(200):
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            import time

            time.sleep(0.001)


def end_own_processes() -> None:
    """Between jobs, in a worker with a uid of its own but no PID namespace: kill every
    other process of that uid (what the last job left running, which left the worker's
    process group with ``setsid`` or was orphaned), and collect the worker's own children.
    Never as root, nor as a uid other processes share (the caller's to ensure: the pool
    gives it only to a worker running as a uid leased for it alone)."""
    if os.geteuid() == 0 or os.getuid() == 0:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)  # every process this uid may signal, but this one
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


# -- asking the kernel first ---------------------------------------------------------------


def check(workspace: str, covers: list[str], net: bool, pid: bool) -> str | None:
    """Why a worker could not enter these namespaces here; ``None`` where it can. Done for
    real, in a child process whose namespaces go with it."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); "
            "from conch.sandbox.namespaces import _check_here; _check_here(*sys.argv[2:])")
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", code, package, workspace, ":".join(covers),
             "1" if net else "", "1" if pid else ""],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the check could not run: {exc}"
    if done.returncode == 0:
        return None
    lines = (done.stdout.strip() or done.stderr.strip() or f"exit status {done.returncode}")
    return lines.splitlines()[-1]


def _check_here(workspace: str, covers: str, net: str, pid: str) -> None:
    try:
        enter(Plan(pid=bool(pid), net="none" if net else "",
                   covers=[c for c in covers.split(":") if c]), workspace)
    except OSError as exc:
        print(exc.strerror if exc.filename is None else f"{exc.filename}: {exc.strerror}")
        raise SystemExit(1) from None
    if pid and os.getpid() != 1:
        print("the worker is not PID 1 of its namespace")
        raise SystemExit(1)
