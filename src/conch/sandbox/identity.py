"""Who a worker runs as: never root.

A worker of a server started as root is started as ``sandbox_user`` (default ``nobody``)
with that user's group and no supplementary groups, so the file permissions of the machine
apply to it, whatever a program finds in the workspace: a hard link planted there that
points at ``/etc/shadow`` reads as ``PermissionError``, which no path check can see.

A worker starts as root, imports what it needs, and then drops for good
(:func:`become`) before its first job. The sandbox user must be able to reach the workspace;
whether it can is worked out from the permission bits of each directory on the way (as the
kernel will check them). Where it cannot, typically because the workspace is beneath root's
0700 home directory, each worker covers the outermost directory in the way in a mount
namespace of its own (:mod:`conch.sandbox.mountns`), or, where the kernel refuses that,
stays root, which the layer's report says with both causes
(:func:`conch.sandbox.probe.user`). The interpreter's own files need not be reachable
(:func:`reroot_imports`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SandboxUser:
    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class Drop:
    """How the workers of a server running as root stop being root: as ``user``, and where
    ``cover`` is set, in a mount namespace of their own in which that directory (the
    outermost above the workspace that ``user`` cannot search) holds only the way down to
    the workspace. With ``ids``, each worker runs as an id of its own from that range."""

    user: SandboxUser
    cover: str | None = None
    # A uid of its own per worker from this range (``user`` then stands for all of them)
    ids: range | None = None


def resolve(name: str) -> SandboxUser:
    """The user named (or numbered) ``name``; ``LookupError`` when there is none."""
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError):
        raise LookupError(f"sandbox_user {name!r} does not exist on this machine") from None
    if entry.pw_uid == 0:
        raise LookupError(f"sandbox_user {name!r} is root")
    return SandboxUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _may(st: os.stat_result, user: SandboxUser, bits: int) -> bool:
    """Whether ``user`` (with no supplementary groups) has ``bits`` (of r=4 w=2 x=1) on a
    file with ``st``, by owner, group and other permission bits as the kernel picks them."""
    if st.st_uid == user.uid:
        mode = (st.st_mode >> 6) & 7
    elif st.st_gid == user.gid:
        mode = (st.st_mode >> 3) & 7
    else:
        mode = st.st_mode & 7
    return mode & bits == bits


def unreachable(path: str | Path, user: SandboxUser, *, read: bool = True) -> str | None:
    """Why ``user`` cannot reach (and, with ``read``, read) ``path``; ``None`` when it can."""
    real = Path(os.path.realpath(path))
    for parent in reversed(real.parents):
        try:
            st = os.stat(parent)
        except OSError as exc:
            return f"{parent}: {exc.strerror}"
        if not _may(st, user, 1):
            return f"{parent} is mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}"
    if read:
        try:
            st = os.stat(real)
        except OSError as exc:
            return f"{real}: {exc.strerror}"
        bits = 5 if stat.S_ISDIR(st.st_mode) else 4
        if not _may(st, user, bits):
            return f"{real} is mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}"
    return None


def first_blocked(workspace: str | Path, user: SandboxUser) -> tuple[str, str] | None:
    """The outermost directory above ``workspace`` that ``user`` cannot search, and why;
    ``None`` when it can search its way down. The workspace itself is not judged (it is
    handed to the user) and need not exist yet: the walk stops where the path does, since
    what is missing from there down the server makes."""
    real = Path(os.path.realpath(workspace))
    for parent in reversed(real.parents):
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return str(parent), f"{parent}: {exc.strerror}"
        if not _may(st, user, 1):
            return str(parent), (f"{parent} is mode {stat.S_IMODE(st.st_mode):04o}, "
                                 f"owner uid {st.st_uid}")
    return None


# A workspace shared by the workers of one server, each with a uid of its own: owned by the
# server's group, group-writable, and new entries keep that group (setgid directories).
SHARED_DIR_BITS = stat.S_ISGID | 0o070
SHARED_FILE_BITS = 0o060
SHARED_TOP_MODE = stat.S_ISGID | 0o770


def hand_over(workspace: Path, user: SandboxUser, *, shared: bool = False) -> None:
    """Make ``user`` the owner of the workspace and what is in it; with ``shared`` (the
    workers of a server, each with a uid of its own, sharing ``user.gid``) also make it
    writable by that group, and the workspace itself reachable by nobody else.

    Each entry is opened without following links and changed through its descriptor, and a
    regular file with more than one link is left alone: a hard link planted in the
    workspace must not make the server give away the file it points to.
    """
    st = os.lstat(workspace)
    if st.st_uid == user.uid and st.st_gid == user.gid and (
            not shared or stat.S_IMODE(st.st_mode) == SHARED_TOP_MODE):
        return  # handed over before; what the workers wrote since is theirs already
    top = os.path.realpath(workspace)
    for root, _dirs, files, root_fd in os.fwalk(top, follow_symlinks=False):
        if root != top:
            os.fchown(root_fd, user.uid, user.gid)
            if shared:
                os.fchmod(root_fd, stat.S_IMODE(os.fstat(root_fd).st_mode) | SHARED_DIR_BITS)
        for name in files:
            with contextlib.suppress(OSError):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=root_fd)
                try:
                    st = os.fstat(fd)
                    if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                        os.fchown(fd, user.uid, user.gid)
                        if shared:
                            os.fchmod(fd, stat.S_IMODE(st.st_mode) | SHARED_FILE_BITS)
                finally:
                    os.close(fd)
    # The top last: its owner (and mode) is what says that the hand-over is complete.
    os.chown(top, user.uid, user.gid, follow_symlinks=False)
    if shared:
        os.chmod(top, SHARED_TOP_MODE)


def reroot_imports(user: SandboxUser | tuple[int, int],
                   hidden: Iterable[str] = ()) -> dict[str, str]:
    """Keep the import path readable by ``user`` after the process becomes it.

    An interpreter installed beneath a directory the user cannot search (pyenv in root's
    0700 home, say), or beneath one the worker's mount namespace is about to cover
    (``hidden``: a virtual environment in /tmp), would make every later ``import`` fail.
    Each such import directory is opened now, while the process is root, and named from
    then on through its descriptor (``/proc/self/fd/N``): the kernel follows that link
    straight to the directory without searching the ones above it, and the files inside
    keep their own permissions. The import path and the search paths of the packages
    already imported are rewritten; returns the mapping."""
    if not isinstance(user, SandboxUser):
        user = SandboxUser("", *user)
    covered = tuple(h.rstrip("/") + "/" for h in hidden)
    mapping: dict[str, str] = {}
    for entry in sys.path:
        if not entry or entry in mapping or not os.path.isdir(entry):
            continue
        beneath = os.path.realpath(entry).startswith(covered) if covered else False
        if beneath or unreachable(entry, user) is not None:
            fd = os.open(entry, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            mapping[entry] = f"/proc/self/fd/{fd}"
    if not mapping:
        return mapping
    # Longest first, so that lib-dynload maps to its own descriptor, not beneath its parent's.
    order = sorted(mapping, key=len, reverse=True)

    def moved(path: str) -> str:
        for old in order:
            if path == old or path.startswith(old + "/"):
                return mapping[old] + path[len(old):]
        return path

    sys.path[:] = [moved(p) for p in sys.path]
    for module in list(sys.modules.values()):
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            search[:] = [moved(p) for p in search]
    sys.path_importer_cache.clear()
    return mapping


def become(uid: int, gid: int) -> None:
    """Drop this process (a worker, started as root) to ``uid``/``gid`` for good: real,
    effective and saved ids, no supplementary groups; verified, since a half-done drop
    must not serve a single job."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getgroups() not in ([], [gid]):
        raise PermissionError("the worker could not drop its privileges")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise PermissionError("the worker could regain root after dropping it")
