"""The files of a session: put, get, list and delete paths in its workspace, safely.

The server (root, when it runs sandboxes) handles a directory that a program in the session
may have shaped at will: planted symbolic links to ``/etc``, fifos, hard links. So no path is
ever handed to the kernel whole. A path is first normalised by the rules of the filesystem
builtins (relative to the workspace root; a leading ``/`` means that root, as the builtins
display paths; ``.`` and empty components dropped; ``..`` allowed only while it stays inside
the root), then walked one component at a time from a descriptor of the workspace, each
directory opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent (openat). A
component that is a symbolic link is refused, never followed, wherever it points: the walk is
lexical and physical at once, so ``..`` cannot escape either. A file to read is opened with
``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file (a fifo would block, a device is not
a file of the session), owned by the session's user: a hard link a program made to a file of
another user (``/etc/shadow``, where the kernel lets it) is not served.

Writes go to a temporary file in the session's ``tmp/`` directory (beside, not inside, the
workspace: a program never sees a half upload) and are renamed into place, so a file is
either the old one or the whole new one. The upload limit and the disk quota are checked as
the bytes arrive: an upload that crosses either stops there with ``UploadTooLarge`` or
``QuotaExceeded`` (both ``413``) and its temporary file is removed. The quota counts the
workspace as measured when the upload starts (the file it replaces excluded) plus every
upload in flight (the files in ``tmp/``, measured again each MiB), so concurrent uploads on
any server see each other.

Ownership. ``owner`` is the ``(uid, gid)`` the session's programs run as (the sandbox user,
when the server runs as root; ``None`` when they run as the server's own user). Whatever the
server creates in the workspace is made theirs (directories ``0700``, files ``0600``), so the
next run can read and write it: the sandbox's hand-over (``conch.sandbox.identity.hand_over``)
only runs once per workspace.

Listing gives the entries the ``ls`` builtin gives (``name, type, size, modified``), names
spelled as paths from the workspace root, hidden files included unless ``all=False``.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import mimetypes
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import AsyncIterable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from conch.sessions.errors import (
    FileConflict,
    FileNotFound,
    InvalidPath,
    QuotaExceeded,
    SessionError,
    UploadTooLarge,
)

Owner = tuple[int, int]
Chunk = bytes | bytearray | memoryview

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
# Deeper directory trees are not measured (each level holds a descriptor while it is walked).
MAX_DEPTH = 256
DIR_MODE = 0o700
FILE_MODE = 0o600
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_RECHECK_BYTES = 1 << 20
_TMP_PREFIX = ".upload-"

# The built-in table only (not /etc/mime.types): the same answer on every machine.
_TYPES = mimetypes.MimeTypes()
for _type, _ext in [
    ("text/markdown", ".md"),
    ("application/yaml", ".yaml"),
    ("application/yaml", ".yml"),
    ("application/toml", ".toml"),
    ("application/jsonl", ".jsonl"),
    ("application/vnd.apache.parquet", ".parquet"),
    ("text/x-conch", ".conch"),
]:
    _TYPES.add_type(_type, _ext)


def content_type(name: str) -> str:
    """The content type a file's name suggests (``application/octet-stream`` when none)."""
    return _TYPES.guess_type(name, strict=False)[0] or "application/octet-stream"


def split_path(path: str) -> tuple[str, ...]:
    """The components of ``path`` below the workspace root (``()``: the root itself).

    ``InvalidPath`` for a path that is not text, holds a NUL, is too long, or climbs out of
    the root with ``..``. Lexical ``..`` is sound here because the walk refuses symbolic
    links: no component can lead anywhere but where its name says."""
    if not isinstance(path, str):
        raise InvalidPath(f"path must be a string, not {type(path).__name__}")
    try:
        raw = path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPath(f"path {path!r} is not valid UTF-8") from None
    if b"\0" in raw:
        raise InvalidPath("path contains a NUL byte")
    if len(raw) > MAX_PATH_BYTES:
        raise InvalidPath(f"path is longer than {MAX_PATH_BYTES} bytes")
    parts: list[str] = []
    for name in path.split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            if not parts:
                raise InvalidPath(
                    f"path {path!r} is outside the session's workspace: paths must stay "
                    "inside the workspace root"
                )
            parts.pop()
            continue
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise InvalidPath(f"path {path!r}: a name is longer than {MAX_NAME_BYTES} bytes")
        parts.append(name)
    return tuple(parts)


def _shown(parts: tuple[str, ...] | list[str]) -> str:
    return "/".join(parts) if parts else "."


def _iso(ts: float) -> str:
    moment = datetime.fromtimestamp(ts, UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _kind(mode: int) -> str:
    # The ``ls`` builtin's three types: a fifo or socket reads as a file there too.
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file"


def entry(name: str, st: os.stat_result) -> dict[str, Any]:
    """An ``ls`` entry: ``{name, type, size, modified}`` (directories have size 0)."""
    kind = _kind(st.st_mode)
    return {
        "name": name,
        "type": kind,
        "size": 0 if kind == "dir" else st.st_size,
        "modified": _iso(st.st_mtime),
    }


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _open_dir_at(dir_fd: int, name: str, shown: str) -> int:
    """Open the directory ``name`` under ``dir_fd`` without following a link; a precise
    error for whatever else is there."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        st = _lstat_at(dir_fd, name)
        if st is None:
            raise FileNotFound(f"no such file or directory: {shown}", where="path") from None
        if stat.S_ISLNK(st.st_mode):
            raise InvalidPath(
                f"{shown} is a symbolic link; the files API never follows links"
            ) from None
        if not stat.S_ISDIR(st.st_mode):
            raise FileConflict(f"not a directory: {shown}", where="path") from None
        raise SessionError(f"cannot open {shown}: {exc.strerror}") from None


@dataclass
class OpenedFile:
    """A file of the workspace opened for reading: stream it with :meth:`chunks` (which
    closes it at the end) or read ``file`` and :meth:`close` it. ``size`` is its size when
    opened; :meth:`chunks` stops there, so a length sent ahead stays true while a program
    appends to the file."""

    path: str
    name: str
    size: int
    modified: str
    content_type: str
    file: BinaryIO

    def chunks(self, chunk_size: int = 1 << 16) -> Iterator[bytes]:
        try:
            left = self.size
            while left > 0:
                data = self.file.read(min(chunk_size, left))
                if not data:
                    break
                left -= len(data)
                yield data
        finally:
            self.close()

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> OpenedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class SessionFiles:
    """The workspace of one session (``workspace``), with ``tmp`` beside it for uploads in
    flight. ``quota_bytes``: what the workspace may hold (``session_disk_mb``);
    ``upload_bytes``: the longest upload (``session_upload_mb``); ``None``: no limit.
    ``owner``: see the module doc."""

    workspace: Path
    tmp: Path
    quota_bytes: int | None = None
    upload_bytes: int | None = None
    owner: Owner | None = None
    _allowed_uid: int = field(init=False)

    def __post_init__(self) -> None:
        self._allowed_uid = self.owner[0] if self.owner is not None else os.geteuid()

    # -- walking ----------------------------------------------------------------------------

    def _root(self) -> int:
        try:
            return os.open(self.workspace, _DIR_FLAGS)
        except FileNotFoundError:
            raise FileNotFound("the session's workspace is gone", where="session") from None

    def _walk(self, parts: tuple[str, ...] | list[str], *, create: bool = False) -> int:
        """A descriptor of the directory ``parts`` (from the root, links refused); with
        ``create``, missing directories are made (the owner's, mode 0700)."""
        fd = self._root()
        try:
            for i, name in enumerate(parts):
                shown = _shown(parts[: i + 1])
                if create:
                    try:
                        os.mkdir(name, DIR_MODE, dir_fd=fd)
                        made = True
                    except FileExistsError:
                        made = False
                    child = _open_dir_at(fd, name, shown)
                    if made and self.owner is not None:
                        os.fchown(child, *self.owner)
                else:
                    child = _open_dir_at(fd, name, shown)
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    # -- reading ----------------------------------------------------------------------------

    def get(self, path: str) -> OpenedFile:
        """Open a regular file of the workspace to stream it back."""
        parts = split_path(path)
        shown = _shown(parts)
        if not parts:
            raise FileConflict("the workspace root is a directory, not a file", where="path")
        parent = self._walk(parts[:-1])
        try:
            st = _lstat_at(parent, parts[-1])
            if st is None:
                raise FileNotFound(f"no such file or directory: {shown}", where="path")
            self._check_readable(shown, st)
            try:
                fd = os.open(parts[-1], _READ_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                raise FileNotFound(f"no such file or directory: {shown}", where="path") from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # replaced by a link since the lstat
                    raise InvalidPath(
                        f"{shown} is a symbolic link; the files API never follows links"
                    ) from None
                raise SessionError(f"cannot open {shown}: {exc.strerror}") from None
        finally:
            os.close(parent)
        try:
            st = os.fstat(fd)  # what was opened, whatever the name pointed at before
            self._check_readable(shown, st)
            os.set_blocking(fd, True)
            f = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        return OpenedFile(
            path=shown,
            name=parts[-1],
            size=st.st_size,
            modified=_iso(st.st_mtime),
            content_type=content_type(parts[-1]),
            file=f,
        )

    def _check_readable(self, shown: str, st: os.stat_result) -> None:
        if stat.S_ISLNK(st.st_mode):
            raise InvalidPath(f"{shown} is a symbolic link; the files API never follows links")
        if stat.S_ISDIR(st.st_mode):
            raise FileConflict(f"{shown} is a directory: list it instead", where="path")
        if not stat.S_ISREG(st.st_mode):
            raise InvalidPath(f"{shown} is not a regular file (a fifo, socket or device)")
        if st.st_uid != self._allowed_uid:
            raise InvalidPath(
                f"{shown} belongs to uid {st.st_uid}, not to the session's user: the files API "
                "serves only the session's own files (a hard link to another user's file is not)"
            )

    def stat(self, path: str) -> dict[str, Any]:
        """The ``ls`` entry of one path (a final symbolic link described, not followed)."""
        parts = split_path(path)
        if not parts:
            fd = self._root()
            try:
                return entry(".", os.fstat(fd))
            finally:
                os.close(fd)
        parent = self._walk(parts[:-1])
        try:
            st = _lstat_at(parent, parts[-1])
        finally:
            os.close(parent)
        if st is None:
            raise FileNotFound(f"no such file or directory: {_shown(parts)}", where="path")
        return entry(_shown(parts), st)

    def list(self, dir: str = ".", *, all: bool = True) -> list[dict[str, Any]]:
        """The entries of directory ``dir`` in name order, as ``ls`` gives them (a file: its
        own entry). ``all=False`` leaves out names starting with a dot, as ``ls`` does.
        Errors name ``dir`` as the field at fault."""
        try:
            return self._list(dir, all)
        except (InvalidPath, FileNotFound, FileConflict) as exc:
            exc.where = "dir"
            raise

    def _list(self, dir: str, all: bool) -> builtins.list[dict[str, Any]]:
        parts = split_path(dir)
        if parts:
            parent = self._walk(parts[:-1])
            try:
                st = _lstat_at(parent, parts[-1])
                if st is None:
                    raise FileNotFound(f"no such file or directory: {_shown(parts)}")
                if not stat.S_ISDIR(st.st_mode):
                    if stat.S_ISLNK(st.st_mode):
                        raise InvalidPath(
                            f"{_shown(parts)} is a symbolic link; the files API never follows "
                            "links", where="dir",
                        )  # fmt: skip
                    return [entry(_shown(parts), st)]
                fd = _open_dir_at(parent, parts[-1], _shown(parts))
            finally:
                os.close(parent)
        else:
            fd = self._root()
        try:
            with os.scandir(fd) as it:
                found = sorted(it, key=lambda e: e.name)
            out = []
            for e in found:
                if not all and e.name.startswith("."):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed while listed
                out.append(entry(_shown([*parts, e.name]), st))
            return out
        finally:
            os.close(fd)

    # -- size -------------------------------------------------------------------------------

    def usage(self) -> int:
        """Bytes the workspace holds: the sizes of its files and links (a file with several
        links once), directories 0, never following a link."""
        fd = self._root()
        return _tree_bytes(fd, "workspace")

    def _in_flight(self) -> int:
        """Bytes of the uploads in flight (the files in ``tmp/``), on any server."""
        total = 0
        try:
            with os.scandir(self.tmp) as it:
                for e in it:
                    try:
                        total += e.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except FileNotFoundError:
            pass
        return total

    # -- writing ----------------------------------------------------------------------------

    def begin_put(self, path: str, *, size_hint: int | None = None) -> Upload:
        """Start an upload to ``path``: refused at once if the path is refused, or if the
        announced ``size_hint`` (a ``Content-Length``) is over a limit."""
        return Upload(self, path, size_hint)

    def put(
        self, path: str, chunks: Iterable[Chunk], *, size_hint: int | None = None
    ) -> dict[str, Any]:
        """Write ``path`` from ``chunks`` (parents made as needed); its new ``ls`` entry."""
        up = self.begin_put(path, size_hint=size_hint)
        try:
            for chunk in chunks:
                up.write(chunk)
            return up.commit()
        finally:
            up.abort()

    async def aput(
        self, path: str, chunks: AsyncIterable[Chunk], *, size_hint: int | None = None
    ) -> dict[str, Any]:
        """:meth:`put` from an async iterator (a request body), the file work off the event
        loop: chunks are gathered to a MiB before each write."""
        up = await asyncio.to_thread(self.begin_put, path, size_hint=size_hint)
        try:
            batch: list[bytes] = []
            held = 0
            async for chunk in chunks:
                up.count(len(chunk))  # refuse as soon as a limit is crossed, before writing
                batch.append(bytes(chunk))
                held += len(chunk)
                if held >= _RECHECK_BYTES:
                    await asyncio.to_thread(up.write_counted, b"".join(batch))
                    batch, held = [], 0
            if batch:
                await asyncio.to_thread(up.write_counted, b"".join(batch))
            return await asyncio.to_thread(up.commit)
        finally:
            await asyncio.to_thread(up.abort)

    def delete(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, link or empty directory (``recursive``: a directory and everything
        in it, links removed and never followed), as the ``rm`` builtin does."""
        parts = split_path(path)
        if not parts:
            raise InvalidPath("refusing to remove the workspace root")
        shown = _shown(parts)
        parent = self._walk(parts[:-1])
        try:
            name = parts[-1]
            st = _lstat_at(parent, name)
            if st is None:
                raise FileNotFound(f"no such file or directory: {shown}", where="path")
            if not stat.S_ISDIR(st.st_mode):
                # Unlinking a link or a hard link removes the name only: nothing it points
                # at is touched.
                os.unlink(name, dir_fd=parent)
                return
            if recursive:
                remove_tree_at(parent, name)
                return
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError as exc:
                if exc.errno == errno.ENOTEMPTY:
                    raise FileConflict(
                        f"directory not empty: {shown} (delete it with recursive=true)",
                        where="path",
                    ) from None
                raise
        except FileNotFoundError:
            raise FileNotFound(f"no such file or directory: {shown}", where="path") from None
        finally:
            os.close(parent)


def remove_tree_at(dir_fd: int, name: str) -> None:
    """Remove the directory ``name`` under ``dir_fd`` and all in it, never following a link.

    ``shutil.rmtree`` works relative to descriptors and refuses links
    (``shutil.rmtree.avoids_symlink_attacks``), but recurses: a program can nest directories
    deeper than Python's recursion limit. Such a tree goes to ``rm -rf``, run from the
    parent's descriptor (its ``/proc/self/fd`` entry, in the child), which walks any depth
    and never follows a link either."""
    try:
        shutil.rmtree(name, dir_fd=dir_fd)
    except RecursionError:
        subprocess.run(
            ["rm", "-rf", "--one-file-system", "--", name],
            cwd=f"/proc/self/fd/{dir_fd}",
            pass_fds=(dir_fd,),
            check=True,
            capture_output=True,
        )


def _entries(fd: int) -> Iterator[os.DirEntry[str]]:
    # Read whole, so that no directory stream stays open while the walk goes deeper.
    with os.scandir(fd) as it:
        return iter(list(it))


def _tree_bytes(fd: int, shown: str) -> int:
    """The bytes below the open directory ``fd`` (closed here), walked depth first."""
    total = 0
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[int, Iterator[os.DirEntry[str]]]] = []
    try:
        stack.append((fd, _entries(fd)))
        while stack:
            top, entries = stack[-1]
            e = next(entries, None)
            if e is None:
                os.close(top)
                stack.pop()
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if len(stack) >= MAX_DEPTH:
                    raise FileConflict(
                        f"the workspace nests directories more than {MAX_DEPTH} deep; its size "
                        "is not measured"
                    )
                try:
                    child = os.open(e.name, _DIR_FLAGS, dir_fd=top)
                except OSError:
                    continue  # replaced or removed while walked
                stack.append((child, _entries(child)))
                continue
            if st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            total += st.st_size
        return total
    finally:
        for top, _ in stack:
            os.close(top)


class Upload:
    """One upload in progress (see :meth:`SessionFiles.begin_put`): :meth:`write` chunks,
    then :meth:`commit`; :meth:`abort` (idempotent, a no-op after a commit) removes what was
    written."""

    def __init__(self, files: SessionFiles, path: str, size_hint: int | None) -> None:
        self.files = files
        self.parts = split_path(path)
        self.shown = _shown(self.parts)
        if not self.parts:
            raise FileConflict("the workspace root is a directory, not a file", where="path")
        self.limit = files.upload_bytes
        if size_hint is not None and self.limit is not None and size_hint > self.limit:
            raise self._too_large(size_hint)
        # The path is checked now, so that a refused one costs the client no upload.
        replaced = self._existing_size()
        self.base = files.usage() - replaced if files.quota_bytes is not None else 0
        self.others = files._in_flight() if files.quota_bytes is not None else 0
        self.counted = 0  # bytes announced to count(), written or not
        self.written = 0
        self.since_check = 0
        if size_hint is not None:
            self._check_quota(size_hint)
        tmp_dir = files.tmp
        tmp_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        self.tmp_name = f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        self.tmp_fd: int | None = os.open(tmp_dir, _DIR_FLAGS)
        try:
            self.fd: int | None = os.open(
                self.tmp_name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                FILE_MODE,
                dir_fd=self.tmp_fd,
            )
        except BaseException:
            os.close(self.tmp_fd)
            self.tmp_fd = None
            raise
        self.done = False

    def _existing_size(self) -> int:
        """The size of the file the upload replaces (0 if none); refuses a path through a
        link or a file, and a target that is a link or a directory."""
        try:
            parent = self.files._walk(self.parts[:-1])
        except FileNotFound:
            return 0  # parents are made at the commit
        try:
            st = _lstat_at(parent, self.parts[-1])
        finally:
            os.close(parent)
        if st is None:
            return 0
        self._check_target(st)
        return st.st_size

    def _check_target(self, st: os.stat_result) -> None:
        if stat.S_ISLNK(st.st_mode):
            raise InvalidPath(f"{self.shown} is a symbolic link; the files API never follows links")
        if stat.S_ISDIR(st.st_mode):
            raise FileConflict(f"{self.shown} is a directory", where="path")

    def _too_large(self, n: int) -> UploadTooLarge:
        assert self.limit is not None
        return UploadTooLarge(
            f"upload of {self.shown} is larger than the server's limit of {self.limit} bytes "
            f"(session_upload_mb); {n} bytes sent or announced",
            where="body",
        )

    def _check_quota(self, extra: int) -> None:
        quota = self.files.quota_bytes
        if quota is None:
            return
        if self.base + self.others + extra > quota:
            raise QuotaExceeded(
                f"upload of {self.shown} would take the session's files past its disk quota of "
                f"{quota} bytes (session_disk_mb): {self.base} bytes in the workspace, "
                f"{self.others} in other uploads in flight, and this upload is past {extra}",
                where="body",
            )

    def count(self, n: int) -> None:
        """Account for ``n`` more bytes: refuses (and aborts) once a limit is crossed."""
        self.counted += n
        try:
            if self.limit is not None and self.counted > self.limit:
                raise self._too_large(self.counted)
            self._check_quota(self.counted)
        except BaseException:
            self.abort()
            raise

    def write(self, chunk: Chunk) -> None:
        """Count and write one chunk."""
        self.count(len(chunk))
        self.write_counted(chunk)

    def write_counted(self, data: Chunk) -> None:
        """Write bytes already counted with :meth:`count`."""
        if self.fd is None:
            raise SessionError("the upload was aborted")
        try:
            view = memoryview(data)
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
            self.written += len(data)
            self.since_check += len(data)
            if self.since_check >= _RECHECK_BYTES and self.files.quota_bytes is not None:
                self.since_check = 0
                # Other uploads in flight, measured again (this one's own file excluded).
                self.others = self.files._in_flight() - self.written
                self._check_quota(self.counted)
        except OSError as exc:
            self.abort()
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise QuotaExceeded(
                    f"the server's disk is full while writing {self.shown}"
                ) from None
            raise
        except BaseException:
            self.abort()
            raise

    def commit(self) -> dict[str, Any]:
        """Move the upload into place (its parents made as needed); its ``ls`` entry."""
        if self.fd is None or self.tmp_fd is None:
            raise SessionError("the upload was aborted")
        try:
            if self.files.quota_bytes is not None:
                self.others = self.files._in_flight() - self.written
                self._check_quota(self.counted)
            if self.files.owner is not None:
                os.fchown(self.fd, *self.files.owner)
            os.close(self.fd)
            self.fd = None
            parent = self.files._walk(self.parts[:-1], create=True)
            try:
                name = self.parts[-1]
                st = _lstat_at(parent, name)
                if st is not None:
                    self._check_target(st)
                # rename never follows a link at either end: if a program swapped the target
                # for a link meanwhile, the link is what gets replaced.
                os.rename(self.tmp_name, name, src_dir_fd=self.tmp_fd, dst_dir_fd=parent)
                self.done = True
                return entry(self.shown, os.stat(name, dir_fd=parent, follow_symlinks=False))
            finally:
                os.close(parent)
        except IsADirectoryError:
            raise FileConflict(f"{self.shown} is a directory", where="path") from None
        finally:
            self.abort()

    def abort(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.tmp_fd is not None:
            if not self.done:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.tmp_name, dir_fd=self.tmp_fd)
            os.close(self.tmp_fd)
            self.tmp_fd = None
