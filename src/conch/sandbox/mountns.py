"""A worker's own view of the file system, for a workspace its user could not reach.

A server run as root keeps its data, by default, beneath root's home: the workspace is
``/root/.local/share/conch/workspace`` and ``/root`` is mode 0700, so ``sandbox_user``
cannot search its way to it. Rather than leave such workers root, each one, while still
root and before Landlock and seccomp (which forbid both from then on), enters a mount
namespace of its own and covers the outermost directory its user cannot search with a
small read-only tmpfs that holds nothing but the path down to the workspace, and at its
end the real workspace, bind-mounted. For that worker and whatever it starts, the rest of
the covered directory (the data directory with its database, ``conch.toml`` with provider
keys, root's other files) does not exist.

Only the worker's view changes: ``/`` is made private in its namespace first, so nothing
mounted there reaches the server or any other process. Where the kernel refuses a mount
namespace (no ``CAP_SYS_ADMIN``, as in a default Docker container) :func:`check` says
why, and the workers stay root as before.

Standard library only (as is :mod:`conch.sandbox.identity`, which it uses): :func:`check`
runs it in a fresh interpreter without site-packages.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

_CLONE_NEWNS = 0x00020000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18

# Directories only, a handful of them: the tmpfs needs no room for data.
_TMPFS_OPTIONS = b"mode=0755,size=16k,nr_inodes=256"

_libc: ctypes.CDLL | None = None


def _call(name: str, *args: object) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if getattr(_libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: bytes | None = None) -> None:
    def c(text: str | None) -> bytes | None:
        return None if text is None else os.fsencode(text)

    try:
        _call("mount", c(source), c(target), c(fstype), ctypes.c_ulong(flags), data)
    except OSError as exc:
        what = fstype or ("bind" if flags & _MS_BIND else "propagation" if flags & _MS_PRIVATE
                          else "remount")
        raise OSError(exc.errno, f"mount ({what}) on {target}: {exc.strerror}") from None


class CoverError(Exception):
    """The kernel refused a step of :func:`cover` (``step`` names it, with the reason)."""

    def __init__(self, hidden: str, step: str) -> None:
        super().__init__(f"cannot cover {hidden} to reach the workspace: {step}")
        self.step = step


def cover(workspace: str, hidden: str) -> None:
    """Enter a mount namespace of this process's own in which ``hidden`` (a directory above
    ``workspace``; both real paths) holds only the path down to ``workspace``, which is the
    real one; then move into it. Raises :class:`CoverError`.

    ``workspace`` may be ``hidden`` itself where nothing of its path exists beneath it yet
    (:func:`check` before the server made the workspace): then only the namespace and the
    tmpfs are tried."""
    below = os.path.relpath(workspace, hidden)
    if below.startswith("..") or hidden == "/":
        raise CoverError(hidden, f"{workspace} is not beneath it")
    try:
        try:
            _call("unshare", ctypes.c_int(_CLONE_NEWNS))
        except OSError as exc:
            raise OSError(exc.errno, f"unshare(CLONE_NEWNS): {exc.strerror}") from None
        setup(workspace, [hidden])
    except OSError as exc:
        step = exc.strerror if exc.filename is None else f"{exc.filename}: {exc.strerror}"
        raise CoverError(hidden, str(step)) from None


# Where the host keeps its sockets (and other processes' temporary files): a connect() to a
# socket file there is not a file access Landlock (ABI 7) can refuse, so a worker's own
# mount namespace covers each with an empty tmpfs. A directory that holds the workspace is
# left as it is (covering it would hide the workspace's neighbours behind the namespace
# rather than Landlock); the worker's seccomp filter then refuses AF_UNIX sockets instead.
SOCKET_DIRS = ("/tmp", "/var/tmp", "/run", "/var/run", "/dev/shm")


def socket_covers(workspace: str) -> tuple[list[str], list[str]]:
    """The directories of :data:`SOCKET_DIRS` that exist here (real paths, each once), split
    into those a worker can cover and those it cannot (they hold the workspace)."""
    real_ws = os.path.realpath(workspace)
    covered: list[str] = []
    kept: list[str] = []
    for path in SOCKET_DIRS:
        if not os.path.isdir(path):
            continue
        real = os.path.realpath(path)
        if real in covered or real in kept or real == "/":
            continue
        inside = real_ws == real or real_ws.startswith(real.rstrip("/") + "/")
        (kept if inside else covered).append(real)
    return covered, kept


def setup(workspace: str, covers: list[str], files: dict[str, str] | None = None) -> None:
    """In a mount namespace this process has just entered (as root): make ``/`` private,
    cover each directory of ``covers`` with a small read-only tmpfs that holds, where the
    workspace is beneath it, only the path down to the real workspace (bind-mounted), and
    put each of ``files`` (path: text; a name resolver's file) in place, read-only. Raises
    ``OSError`` naming the step that failed.

    ``covers`` must not nest; ``workspace`` is a real path. A file whose real path lies
    beneath a covered directory is made in that tmpfs; any other is bind-mounted over
    its path from the first tmpfs."""
    # The copy of a shared mount would pass what is mounted here back to the host.
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    files = dict(files or {})
    # Opened in the new namespace (a bind mount's source must be one of its mounts) and
    # before a tmpfs hides it. A workspace not made yet (check) is not bound.
    source = None
    if os.path.isdir(workspace):
        source = os.open(workspace, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    binds: list[tuple[str, str]] = []
    try:
        for index, hidden in enumerate(covers):
            _mount("tmpfs", hidden, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                   _TMPFS_OPTIONS)
            below = os.path.relpath(workspace, hidden)
            if not below.startswith("..") and source is not None:
                target = hidden
                if below != ".":
                    for part in below.split(os.sep):
                        target = os.path.join(target, part)
                        os.mkdir(target)
                        os.chmod(target, 0o755)  # whatever the umask: the user must search it
                _mount(f"/proc/self/fd/{source}", target, None, _MS_BIND | _MS_REC)
            for path in list(files):
                real = os.path.realpath(path)
                if real.startswith(hidden.rstrip("/") + "/"):
                    _write(real, files.pop(path))
                elif index == 0:
                    holder = os.path.join(hidden, f".conch-{len(binds)}")
                    _write(holder, files[path])
                    binds.append((holder, real))
            # Nothing may be planted beside the workspace; the bind mount keeps its own flags.
            _mount(None, hidden, None,
                   _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        for holder, target in binds:
            if not os.path.exists(target):
                continue  # nothing to stand in for (no /etc/hosts): the resolver goes on
            _mount(holder, target, None, _MS_BIND)
            _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID
                   | _MS_NODEV | _MS_NOEXEC)
    finally:
        if source is not None:
            os.close(source)
    # The old working directory may be on a mount now hidden.
    if source is not None:
        os.chdir(workspace)


def _write(path: str, text: str) -> None:
    parent = os.path.dirname(path)
    os.makedirs(parent, mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o644)
        fh.write(text)


def check(workspace: str, hidden: str, uid: int, gid: int) -> str | None:
    """Why a worker could not reach ``workspace`` by covering ``hidden``; ``None`` where
    it can. Done for real, in a child process whose namespace goes with it: covered, and
    then every directory on the way searchable by ``uid``/``gid``."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from conch.sandbox.mountns import _check_here; _check_here(*sys.argv[2:])")
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", code, package, workspace, hidden, str(uid),
             str(gid)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the check could not run: {exc}"
    if done.returncode == 0:
        return None
    lines = (done.stdout.strip() or done.stderr.strip() or f"exit status {done.returncode}")
    return lines.splitlines()[-1]


def _check_here(workspace: str, hidden: str, uid: str, gid: str) -> None:
    from conch.sandbox.identity import SandboxUser, unreachable

    try:
        cover(workspace, hidden)
    except CoverError as exc:
        print(exc.step)
        raise SystemExit(1) from None
    blocked = unreachable(workspace, SandboxUser("", int(uid), int(gid)), read=False)
    if blocked is not None:
        print(f"covered, but still {blocked}")
        raise SystemExit(1)
