"""Per-worker resource limits by cgroup v2, where the machine delegates one to the server.

With a delegated cgroup (systemd's ``Delegate=yes``, a container's own namespace) each
worker gets a child cgroup with ``memory.max`` (the worker's whole memory, page cache and
what its commands use included), ``pids.max`` (a fork bomb through ``allow_process`` stops
there) and ``cpu.max`` (one CPU), and a worker that is replaced takes every process it
started with it (``cgroup.kill``). The server moves itself into a ``server`` leaf first:
cgroup v2 lets a cgroup hand controllers to its children only while it holds no process.

Where no cgroup is delegated (a hybrid hierarchy whose controllers are on v1, a cgroup the
server may not write), the worker's rlimits stand in: ``RLIMIT_AS``, ``RLIMIT_CPU`` and,
for a worker running as the sandbox user, ``RLIMIT_NPROC``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu")


def _cgroup2_mount() -> Path | None:
    with contextlib.suppress(OSError), open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return Path(fields[1])
    return None


def _own_cgroup() -> str | None:
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as groups:
        for line in groups:
            if line.startswith("0::"):
                return line[3:].strip()
    return None


@dataclass
class Delegation:
    """The cgroup the server may divide among its workers."""

    base: Path

    def worker_group(self, name: str, *, memory_mb: int, pids_max: int) -> WorkerGroup:
        path = self.base / name
        path.mkdir(exist_ok=True)
        if memory_mb > 0:
            (path / "memory.max").write_text(str(memory_mb * 1024 * 1024))
            with contextlib.suppress(OSError):  # absent where swap accounting is off
                (path / "memory.swap.max").write_text("0")
        if pids_max > 0:
            (path / "pids.max").write_text(str(pids_max))
        (path / "cpu.max").write_text("100000 100000")
        return WorkerGroup(path)


@dataclass
class WorkerGroup:
    path: Path

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Kill whatever is left in it (a command a worker started) and delete it."""
        with contextlib.suppress(OSError):
            (self.path / "cgroup.kill").write_text("1")
        with contextlib.suppress(OSError):
            self.path.rmdir()


def inspect() -> tuple[Path | None, str]:
    """The cgroup the server could divide among workers, or ``None`` and why not; changes
    nothing."""
    mount = _cgroup2_mount()
    if mount is None:
        return None, "no cgroup v2 hierarchy is mounted"
    own = _own_cgroup()
    if own is None:
        return None, "this process is in no cgroup v2 group"
    if own == "/":
        return None, "the server runs in the root cgroup, which it must not divide"
    base = mount / own.lstrip("/")
    try:
        available = (base / "cgroup.controllers").read_text().split()
    except OSError as exc:
        return None, f"cannot read {base}/cgroup.controllers: {exc.strerror}"
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        return None, (f"the {', '.join(missing)} controller(s) are not available in {base}"
                      " (on cgroup v1 in a hybrid hierarchy, or not delegated)")
    if not os.access(base / "cgroup.subtree_control", os.W_OK) or not os.access(base, os.W_OK):
        return None, f"{base} is not delegated to this user"
    return base, f"cgroup v2 at {base}"


def delegate() -> tuple[Delegation | None, str]:
    """The delegated cgroup set up for workers, or ``None`` and why the rlimits stand in."""
    base, why = inspect()
    if base is None:
        return None, why
    try:
        others = set((base / "cgroup.procs").read_text().split()) - {str(os.getpid())}
        if others:
            return None, f"other processes share the server's cgroup {base}"
        leaf = base / "server"
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        (base / "cgroup.subtree_control").write_text(" ".join("+" + c for c in CONTROLLERS))
    except OSError as exc:
        return None, f"cannot enable {', '.join(CONTROLLERS)} in {base}: {exc.strerror}"
    return Delegation(base), why
