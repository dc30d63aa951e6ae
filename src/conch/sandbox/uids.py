"""Ids of their own for workers: a uid per worker and a group per server, leased from
``sandbox_uids`` (as ``isolate`` gives each box its own uid).

A uid shared by the workers of every server on a machine (``nobody``) makes every limit
counted per user shared too: ``RLIMIT_NPROC`` counts all of that user's processes, so one
server's fork bomb stops another's commands; signals and file ownership do not tell the
workers apart either. So a server running as root leases, for each worker it starts, a uid
no other process on the machine holds, and for itself one group that all its workers share
(they write one workspace, group-writable).

A lease is a ``flock`` on a lock file named after the id in a directory every conch server
on the machine uses (``/run/conch/sandbox-ids``): held by the server for as long as the
worker (or the server, for its group) lives, and released by the kernel if the server dies,
so no uid is ever held twice and none leaks. A worker's lock is exclusive; a group's is
shared, so that two servers given the same workspace keep sharing its group. Ids that name a user or group in
the system's databases are skipped: the range is for ids nobody else uses.

A worker's uid is released only once every process that ran as it is gone: the worker's PID
namespace guarantees that when the worker is reaped; without one, :func:`sweep` kills what
is left by uid first.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

LOCK_DIR = Path("/run/conch/sandbox-ids")


def _lock_dir() -> Path:
    # /run is the machine's own (a tmpfs, cleared at boot), which is what a lease wants;
    # a system without it uses the temporary directory instead.
    base = LOCK_DIR if Path("/run").is_dir() else Path("/tmp/conch-sandbox-ids")
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    return base


def _named(uid: int) -> bool:
    """Whether ``uid`` is a user or group the system's databases know."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
        except KeyError:
            continue
        return True
    return False


@dataclass
class Lease:
    """One id held: the lock file's descriptor keeps it until :meth:`release`."""

    id: int
    fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)  # the lock goes with the descriptor
            self.fd = None


class Ids:
    """The range ``ids`` of one server: what it leases, starting after the last one leased
    (so that an id just given back is the last to be reused)."""

    def __init__(self, ids: range) -> None:
        self.ids = ids
        self._next = 0

    def lease(self, prefer: int | None = None, *, group: bool = False) -> Lease | None:
        """An id of the range no other process holds (``prefer`` first), or ``None`` where
        every id is held or named. A ``group`` lease is shared: ``prefer`` (the workspace's
        group) is taken even where another server holds it as the group of the same
        workspace, never where a worker holds it as its uid; any other id only where no
        process holds it at all."""
        directory = _lock_dir()
        count = len(self.ids)
        order = ([prefer] if prefer is not None and prefer in self.ids else []) + [
            self.ids[(self._next + i) % count] for i in range(count)]
        for index, candidate in enumerate(order):
            if _named(candidate):
                continue
            fd = os.open(directory / str(candidate), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            shared_preferred = group and index == 0 and candidate == prefer
            try:
                if shared_preferred:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                else:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    if group:  # free: now shared with whichever server shares the workspace
                        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self._next = (self.ids.index(candidate) + 1) % count
            return Lease(candidate, fd)
        return None

    def free(self) -> int:
        """How many ids could be leased now (for the probe; holds none)."""
        lease = []
        try:
            while (held := self.lease()) is not None:
                lease.append(held)
                if len(lease) >= 2:  # enough to know a server gets a group and a worker
                    break
            return len(lease)
        finally:
            for held in lease:
                held.release()


def sweep(uid: int, attempts: int = 20) -> bool:
    """Kill every process whose real or effective uid is ``uid`` (what a worker without a
    PID namespace of its own left behind: a command started with ``setsid``), until none is
    left; whether none is. Never for an id other processes may hold (``nobody``)."""
    for _ in range(attempts):
        found = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/status", "rb") as status:
                    for line in status:
                        if line.startswith(b"Uid:"):
                            ids = [int(x) for x in line.split()[1:3]]
                            break
                    else:
                        continue
            except OSError:
                continue
            if uid in ids:
                found = True
                with contextlib.suppress(OSError):
                    os.kill(int(entry.name), signal.SIGKILL)
        if not found:
            return True
        time.sleep(0.01)
    return False
