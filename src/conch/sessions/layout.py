"""Where a session lives on disk, and making and removing that place.

::

    sessions_dir/                   0711: the sandbox user may pass, not list
      <id>/                         0711, the server's
        workspace/                  0700, the session's user's: its files (what its programs
                                    see, the files API's root)
        state/                      0700, the server's: its saved bindings (conch.sessions.state),
                                    never inside the workspace, so no program can touch them
        tmp/                        0700, the server's: uploads in flight, renamed into the
                                    workspace when whole (same file system, so atomically)

A session id names a directory, so only ids of the shape :func:`check_id` accepts are turned
into paths (an id from a URL never climbs out of ``sessions_dir``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

from conch.sessions.errors import SessionNotFound
from conch.sessions.files import remove_tree_at

Owner = tuple[int, int]
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
PASS_MODE = 0o711
PRIVATE_MODE = 0o700


def check_id(id: str) -> str:
    """``id`` if it can name a session's directory; ``SessionNotFound`` otherwise (no session
    has such an id)."""
    if not isinstance(id, str) or not _ID.fullmatch(id):
        raise SessionNotFound(f"no session {id!r}", where="session")
    return id


class SessionDirs:
    """The directories of every session under ``sessions_dir``. ``owner``: the ``(uid, gid)``
    the sessions' programs run as, who is given each workspace (``None``: the server's own
    user, nothing to give)."""

    def __init__(self, sessions_dir: Path, *, owner: Owner | None = None) -> None:
        self.base = Path(sessions_dir)
        self.owner = owner

    def root(self, id: str) -> Path:
        return self.base / check_id(id)

    def workspace(self, id: str) -> Path:
        return self.root(id) / "workspace"

    def state(self, id: str) -> Path:
        return self.root(id) / "state"

    def tmp(self, id: str) -> Path:
        return self.root(id) / "tmp"

    def exists(self, id: str) -> bool:
        return self.root(id).is_dir()

    def create(self, id: str) -> Path:
        """Make the session's directories (its workspace given to ``owner``); the root."""
        if not self.base.exists():
            self.base.mkdir(mode=PASS_MODE, parents=True, exist_ok=True)
            os.chmod(self.base, PASS_MODE)  # whatever the umask made of it
        root = self.root(id)
        root.mkdir(mode=PASS_MODE)
        os.chmod(root, PASS_MODE)
        for name in ("workspace", "state", "tmp"):
            (root / name).mkdir(mode=PRIVATE_MODE)
        if self.owner is not None:
            os.chown(root / "workspace", *self.owner, follow_symlinks=False)
        return root

    def owner_of(self, id: str) -> Owner | None:
        """Who the session's files belong to now: ``owner`` where it is fixed, else the user
        its workspace was last handed to (:meth:`hand_over`); None where that is the server's
        own user (nothing to give)."""
        if self.owner is not None:
            return self.owner
        try:
            st = os.lstat(self.workspace(id))
        except FileNotFoundError:
            return None
        if st.st_uid == os.geteuid():
            return None
        return st.st_uid, st.st_gid

    def hand_over(self, id: str, uid: int | None, gid: int | None, *,
                  others: range | None = None) -> None:
        """Give the session's files to the user its next worker runs as (``uid``, ``gid``;
        None: the server's own user, nothing to give).

        Every entry of the workspace owned by its previous user (the workspace's owner) or by
        a uid of ``others`` (the sandbox's range: a hand-over cut short) is changed, without
        following a link, and the workspace itself last: its owner says the hand-over is
        complete, so one cut short is finished by the next. Entries of anyone else (which no
        worker could have made) are left as they are."""
        if uid is None or gid is None:
            return
        workspace = self.workspace(id)
        top = os.lstat(workspace)
        if top.st_uid == uid and top.st_gid == gid:
            return
        old = top.st_uid

        def theirs(st: os.stat_result) -> bool:
            return st.st_uid == old or (others is not None and st.st_uid in others)

        try:
            for _root, dirs, files, fd in os.fwalk(workspace, follow_symlinks=False):
                for name in dirs + files:
                    try:
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        if theirs(st) and (st.st_uid, st.st_gid) != (uid, gid):
                            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
        except RecursionError:
            # Nested deeper than Python recurses: chown(1) walks any depth, never following
            # a link (-P), changing links themselves (-h).
            subprocess.run(["chown", "-R", "-h", "-P", f"{uid}:{gid}", "--", "."],
                           cwd=workspace, check=True, capture_output=True)
        os.chown(workspace, uid, gid, follow_symlinks=False)

    def copy_workspace(self, source: str, target: str) -> None:
        """Copy the files of ``source``'s workspace into ``target``'s (made by the server,
        so the server's until ``target``'s first worker is handed them): directories and
        regular files, symbolic links as links (never followed); fifos, sockets and devices
        are left out."""
        src_top, dst_top = self.workspace(source), self.workspace(target)
        for root, dirs, files, root_fd in os.fwalk(src_top, follow_symlinks=False):
            below = os.path.relpath(root, src_top)
            dst_dir = dst_top if below == "." else dst_top / below
            for name in dirs + files:
                try:
                    st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                target_path = dst_dir / name
                if stat.S_ISDIR(st.st_mode):
                    target_path.mkdir(mode=PRIVATE_MODE, exist_ok=True)
                elif stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(name, dir_fd=root_fd), target_path)
                elif stat.S_ISREG(st.st_mode):
                    _copy_file(root_fd, name, target_path)

    def remove(self, id: str) -> None:
        """Remove the session's directories and all in them (links removed, never followed);
        nothing to do when they are gone already."""
        root = self.root(id)
        if not os.path.lexists(root):
            return
        fd = os.open(self.base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            remove_tree_at(fd, root.name)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def ids(self) -> list[str]:
        """The session ids that have a directory (orphans included: see the service's sweep)."""
        with contextlib.suppress(FileNotFoundError), os.scandir(self.base) as it:
            return sorted(
                e.name for e in it if _ID.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
            )
        return []


def _copy_file(dir_fd: int, name: str, target: Path) -> None:
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):  # swapped for something else meanwhile
            return
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600)
        with open(src, "rb", closefd=False) as reader, open(dst, "wb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 20)
    finally:
        os.close(src)
