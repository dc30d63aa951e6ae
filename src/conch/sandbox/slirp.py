"""The user-mode network stack of a worker allowed the network: ``slirp4netns``.

A worker with ``allow_network`` has a network namespace of its own (:mod:`conch.sandbox.netns`)
and no interface but its loopback until the server attaches ``slirp4netns`` to it: a tap
device inside, a TCP/IP stack in a process outside that opens ordinary sockets on the host
for each connection the worker makes. So the worker's traffic leaves as the server's own
would, but: nothing can be bound on the host (UDP included: a socket bound inside is bound in
the worker's namespace only, and no port is forwarded in), the host's loopback is not
reachable (``--disable-host-loopback``), and the namespace's routes refuse private ranges
and the host's addresses before a packet reaches the stack. The stack runs sandboxed itself
(``--enable-sandbox``: its own mount namespace and no capabilities; ``--enable-seccomp``), and
ends with its worker (``--exit-fd``: the server holds the other end).

Debian packages it (``apt-get install slirp4netns``; ``make`` installs it where it can).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import IO

from conch.sandbox.netns import SLIRP_DNS

# slirp4netns's default addressing: the worker is 10.0.2.100, its gateway 10.0.2.2 (the
# host, refused), the DNS forwarder 10.0.2.3.
RESOLV_CONF = f"# conch: the sandbox's name resolver (slirp4netns's DNS forwarder)\nnameserver {SLIRP_DNS}\n"
_READY_TIMEOUT_S = 10.0


@lru_cache(maxsize=1)
def find() -> tuple[str | None, str]:
    """The slirp4netns binary and its version, or ``None`` and why there is none."""
    path = shutil.which("slirp4netns") or next(
        (p for p in ("/usr/bin/slirp4netns", "/usr/local/bin/slirp4netns") if os.access(p, os.X_OK)),
        None)
    if path is None:
        return None, ("slirp4netns is not installed (apt-get install slirp4netns; `make` "
                      "installs it as root)")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{path} does not run: {exc}"
    version = out.split("\n", 1)[0].replace("slirp4netns version", "").strip() or "?"
    return path, f"slirp4netns {version}"


def unavailable() -> str | None:
    """Why no worker can have a stack here (no slirp4netns, no TUN device); ``None`` where
    it can."""
    path, version = find()
    if path is None:
        return version
    if not os.path.exists("/dev/net/tun"):
        return f"{version} needs /dev/net/tun, which this machine lacks"
    return None


@dataclass
class Stack:
    """One worker's slirp4netns: the process, and the descriptor whose closing ends it."""

    process: subprocess.Popen[bytes]
    exit_fd: int | None

    def stop(self) -> None:
        if self.exit_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.exit_fd)
            self.exit_fd = None
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.kill()  # collected by subprocess's own bookkeeping later


def attach(pid: int) -> Stack:
    """Start slirp4netns for the network namespace of process ``pid`` and wait until its
    interface is configured; ``OSError`` saying why not."""
    path, why = find()
    if path is None:
        raise OSError(why)
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    exit_r, exit_w = os.pipe2(os.O_CLOEXEC)
    # Its messages go to a file of its own (unlinked): read if it fails to start, never a
    # pipe that could fill up and stop it.
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed below, on every path)
    try:
        process = subprocess.Popen(
            [path, "--configure", "--mtu=65520", "--disable-host-loopback",
             "--enable-sandbox", "--enable-seccomp", f"--ready-fd={ready_w}",
             f"--exit-fd={exit_r}", str(pid), "tap0"],
            pass_fds=(ready_w, exit_r), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=log, start_new_session=True)
    except OSError:
        for fd in (ready_r, ready_w, exit_r, exit_w):
            os.close(fd)
        log.close()
        raise
    os.close(ready_w)
    os.close(exit_r)
    stack = Stack(process, exit_w)
    try:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            readable, _, _ = select.select([ready_r], [], [], max(0.0, left))
            if readable:
                if os.read(ready_r, 1) == b"1":
                    break
                raise OSError(f"slirp4netns for worker {pid} exited: {_stderr(process, log)}")
            if left <= 0:
                raise OSError(f"slirp4netns for worker {pid} was not ready within "
                              f"{_READY_TIMEOUT_S:g} s")
    except BaseException:
        stack.stop()
        raise
    finally:
        os.close(ready_r)
        log.close()
    return stack


def _stderr(process: subprocess.Popen[bytes], log: IO[bytes]) -> str:
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(2)
    log.seek(0)
    err = log.read().decode("utf-8", "replace").strip()
    return err.splitlines()[-1] if err else f"status {process.returncode}"
