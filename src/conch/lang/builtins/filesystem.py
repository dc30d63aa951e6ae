"""Filesystem builtins: the category's path policy and the helpers its modules share, with
the builtins that look at the tree (``ls``, ``stat``, ``exists``, ``glob``, ``find``, ``du``,
``pwd``, ``cd``).

The category's other builtins are in a module per job: ``filesystem_contents`` (``cat``,
``open``, ``write``, ``append``), ``filesystem_edit`` (``mkdir``, ``touch``, ``rm``, ``mv``,
``cp``) and ``filesystem_text`` (``head``, ``tail``, ``wc``, ``grep``).

Every path goes through ``context.current().resolve_path``, which refuses, when the run has
a workspace, any path whose real location (symlinks resolved) is outside it. Destinations of
writes are resolved the same way, so writing through a symlink that leaves the workspace is
refused. Recursive walks (``glob``, ``find``, ``grep``, ``du``, ``cp``, ``rm``) never descend
into symlinks, and skip symlinks that point outside the workspace.

Paths returned to the program (``ls`` names, ``glob``/``find`` results) are spelled relative
to the path the program gave, so they can be passed straight back (``ls("src") | .name``
gives ``"src/a.py"``).

Decisions where a shell leaves room:

- ``head``, ``tail``, ``wc`` and ``grep`` take a path or text. A String containing a newline
  is text; any other String is a path; an Array is a list of lines.
- ``grep(pattern, input=".")`` searches a file, a directory (recursively) or text; piped text
  (``cat("f") | grep("x")``) works because a first argument that is an Array or contains a
  newline is the text and the second one the pattern.
- ``write`` replaces the file atomically (temporary file, then rename). A String is written
  as is; other values are serialised by the file's extension (.yaml/.yml, .toml, .csv), JSON
  otherwise. ``open`` is the inverse.
- ``ls`` sizes of directories are 0; ``modified`` is ISO-8601 UTC with a ``Z``.
"""

from __future__ import annotations

import os
import posixpath
import stat as _stat

from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Array, Bool, Record, String, Table
from conch.lang.context import Context, current
from conch.lang.errors import ConchError

# pathlib, json, re, fnmatch, shutil, tempfile, csv, datetime and the like are imported
# where used, and typing only by type checkers: a program naming one filesystem builtin
# imports this module (``find`` is also a collection builtin, ``append`` imports it through
# filesystem_contents), and together they would be most of its start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from collections.abc import Callable, Iterator
    from pathlib import Path
    from typing import Any

CAT = "filesystem"


# -- errors ------------------------------------------------------------------------------


def os_error(exc: OSError, shown: str | None = None) -> ConchError:
    """A conch error for an OSError, naming the path as the program spelled it."""
    if shown is None:
        from pathlib import Path

        filename = exc.filename
        shown = current().display_path(Path(os.fsdecode(filename))) if filename else "?"
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return ConchError("FileNotFoundError", f"no such file or directory: {shown}")
    if isinstance(exc, PermissionError):
        return ConchError("PermissionError", f"permission denied: {shown}")
    reason = exc.strerror or str(exc) or type(exc).__name__
    return ConchError("IOError", f"{reason}: {shown}")


def translate_os_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Translate stray OSErrors (the path is then taken from the exception)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            raise os_error(exc) from None

    # what functools.wraps does, without importing functools
    for attr in ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__"):
        setattr(wrapper, attr, getattr(fn, attr))
    wrapper.__dict__.update(fn.__dict__)
    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def not_found(path: str) -> ConchError:
    """The error for a path that does not exist, spelled as the program gave it."""
    return ConchError("FileNotFoundError", f"no such file or directory: {path}")


# -- paths -------------------------------------------------------------------------------


def resolve(path: str) -> Path:
    """Where ``path`` is on disk, refused outside the workspace (see the module's text)."""
    return current().resolve_path(path)


def resolve_entry(path: str) -> Path:
    """The path of the entry itself, without following a final symlink (for ``rm``, ``mv``,
    ``stat``): the parent is resolved and checked, the last component is kept as is."""
    ctx = current()
    name = posixpath.basename(path.rstrip("/")) if path.strip("/") else ""
    if name in ("", ".", "..") or name.startswith("~"):
        return ctx.resolve_path(path)
    parent = posixpath.dirname(path.rstrip("/")) or "."
    return ctx.resolve_path(parent) / name


def _escapes(path: str | os.PathLike[str], ctx: Context | None = None) -> bool:
    """Whether the real location of ``path`` is outside the workspace (never without one)."""
    ctx = ctx or current()
    root = ctx.workspace
    if root is None:
        return False
    from pathlib import Path

    real = Path(os.path.realpath(path))
    return real != root and root not in real.parents


def join_shown(shown: str, name: str) -> str:
    """How an entry under ``shown`` is spelled back to the program."""
    if shown in ("", "."):
        return name
    return posixpath.join(shown, name)


def _scandir(directory: Path | str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def is_real_dir(entry: os.DirEntry[str]) -> bool:
    """Whether an entry is a directory itself, not a symlink to one."""
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def walk(directory: Path, shown: str, ctx: Context) -> Iterator[tuple[str, os.DirEntry[str], int]]:
    """Every entry below ``directory``, depth first in name order, as (shown path, entry,
    depth). Symlinked directories are yielded but not entered; symlinks pointing outside the
    workspace are left out."""
    stack: list[tuple[Path | str, str, int]] = [(directory, shown, 1)]
    while stack:
        ctx.check_cancelled()
        d, s, depth = stack.pop()
        below: list[tuple[Path | str, str, int]] = []
        for entry in _scandir(d):
            if entry.is_symlink() and _escapes(entry.path, ctx):
                continue
            child = join_shown(s, entry.name)
            yield child, entry, depth
            if is_real_dir(entry):
                below.append((entry.path, child, depth + 1))
        stack.extend(reversed(below))


# -- entries -----------------------------------------------------------------------------


def _iso(ts: float) -> str:
    import datetime as _dt

    moment = _dt.datetime.fromtimestamp(ts, _dt.UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _kind(mode: int) -> str:
    if _stat.S_ISLNK(mode):
        return "symlink"
    if _stat.S_ISDIR(mode):
        return "dir"
    return "file"


def _entry(name: str, st: os.stat_result) -> dict[str, Any]:
    kind = _kind(st.st_mode)
    return {
        "name": name,
        "type": kind,
        "size": 0 if kind == "dir" else st.st_size,
        "modified": _iso(st.st_mtime),
    }


# -- glob --------------------------------------------------------------------------------

def _has_magic(text: str) -> bool:
    return "*" in text or "?" in text or "[" in text


def _expand_braces(pattern: str) -> list[str]:
    """``a.{py,txt}`` -> ``a.py``, ``a.txt`` (nested braces work; a lone brace is literal)."""
    depth = 0
    start = -1
    for i, ch in enumerate(pattern):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                body = pattern[start + 1 : i]
                parts: list[str] = []
                level = 0
                last = 0
                for j, c in enumerate(body):
                    if c == "{":
                        level += 1
                    elif c == "}":
                        level -= 1
                    elif c == "," and level == 0:
                        parts.append(body[last:j])
                        last = j + 1
                if not parts:
                    continue
                parts.append(body[last:])
                head, tail = pattern[:start], pattern[i + 1 :]
                return [x for p in parts for x in _expand_braces(head + p + tail)]
    return [pattern]


_SEGMENT_REGEXES: dict[str, re.Pattern[str]] = {}


def _segment_regex(segment: str) -> re.Pattern[str]:
    regex = _SEGMENT_REGEXES.get(segment)
    if regex is None:
        import fnmatch
        import re

        if len(_SEGMENT_REGEXES) >= 256:
            _SEGMENT_REGEXES.clear()
        regex = _SEGMENT_REGEXES[segment] = re.compile(fnmatch.translate(segment))
    return regex


def _glob_in(
    directory: Path, shown: str, segs: list[str], ctx: Context
) -> Iterator[tuple[str, Path]]:
    from pathlib import Path

    ctx.check_cancelled()
    seg, rest = segs[0], segs[1:]
    if seg == "**":
        if rest:
            yield from _glob_in(directory, shown, rest, ctx)
        for entry in _scandir(directory):
            if entry.name.startswith("."):
                continue
            child = join_shown(shown, entry.name)
            if not rest and not (entry.is_symlink() and _escapes(entry.path, ctx)):
                yield child, Path(entry.path)
            if is_real_dir(entry):
                yield from _glob_in(Path(entry.path), child, segs, ctx)
        return
    if not _has_magic(seg):
        path = directory / seg
        child = join_shown(shown, seg) if seg else shown
        if rest:
            if path.is_dir() and not path.is_symlink():
                yield from _glob_in(path, child, rest, ctx)
        elif os.path.lexists(path) and not (path.is_symlink() and _escapes(path, ctx)):
            yield child, path
        return
    regex = _segment_regex(seg)
    for entry in _scandir(directory):
        if entry.name.startswith(".") and not seg.startswith("."):
            continue
        if not regex.match(entry.name):
            continue
        child = join_shown(shown, entry.name)
        if rest:
            if is_real_dir(entry):
                yield from _glob_in(Path(entry.path), child, rest, ctx)
        elif not (entry.is_symlink() and _escapes(entry.path, ctx)):
            yield child, Path(entry.path)


def _glob(pattern: str) -> list[tuple[str, Path]]:
    """Matches of a glob pattern (``*``, ``?``, ``[...]``, ``**``, ``{a,b}``) as (path as
    the program would spell it, path on disk), sorted. The literal leading directories are
    resolved against the workspace; below them symlinks are never followed."""
    ctx = current()
    found: dict[str, Path] = {}
    for pat in _expand_braces(pattern):
        if not _has_magic(pat):
            real = ctx.resolve_path(pat)
            if os.path.lexists(real):
                found[pat] = real
            continue
        segs = pat.split("/")
        prefix: list[str] = []
        while segs and not _has_magic(segs[0]):
            prefix.append(segs.pop(0))
        if prefix == [""]:
            base_shown = "/"
        else:
            base_shown = "/".join(prefix)
        base = ctx.resolve_path(base_shown or ".")
        for shown, path in _glob_in(base, base_shown, segs, ctx):
            found.setdefault(shown, path)
    return sorted(found.items())


# -- builtins ----------------------------------------------------------------------------


@builtin(
    "ls",
    category=CAT,
    effect="read",
    description=(
        "List a directory (or the matches of a glob pattern) as a Table of "
        "{name, type, size, modified}, sorted by name. Hidden entries appear with all=true. "
        "Names are spelled relative to the given path; a directory's size is 0."
    ),
    examples=[
        Example('write("b.txt", "hello"); mkdir("a"); ls() | .name', ["a", "b.txt"]),
        Example('write("b.txt", "hello"); ls() | .size', [5]),
        Example('mkdir("src"); write("src/x.py", ""); ls("src") | .name', ["src/x.py"]),
        Example('write("a.txt", ""); write("b.md", ""); ls("*.txt") | .name', ["a.txt"]),
        Example('write(".hidden", ""); [len(ls()), len(ls(all=true))]', [0, 1]),
    ],
)
@translate_os_errors
def ls(path: String = ".", all: Bool = False) -> Table:
    if _has_magic(path) or "{" in path:
        matches = _glob(path)
        return [_entry(shown, os.lstat(real)) for shown, real in matches]
    real = resolve(path)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise os_error(exc, path) from None
    if not _stat.S_ISDIR(st.st_mode):
        return [_entry(path, os.lstat(real))]
    try:
        # The directory asked for: a refused listing is an error, not an empty directory
        # (_scandir's leniency is for the directories a walk passes through).
        with os.scandir(real) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise os_error(exc, path) from None
    out = []
    for entry in entries:
        if not all and entry.name.startswith("."):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        out.append(_entry(join_shown(path, entry.name), st))
    return out


@builtin(
    "exists",
    category=CAT,
    effect="read",
    description="Whether a file or directory exists.",
    examples=[Example('write("a.txt", ""); [exists("a.txt"), exists("nope")]', [True, False])],
)
def exists(path: String) -> Bool:
    return resolve(path).exists()


@builtin(
    "stat",
    category=CAT,
    effect="read",
    description=(
        "Details of a file, directory or symlink (not followed): "
        "{name, path, type, size, modified, accessed, mode, permissions}."
    ),
    examples=[
        Example(
            'write("a.txt", "abc"); let s = stat("a.txt"); [s.name, s.type, s.size]',
            ["a.txt", "file", 3],
        ),
        Example('mkdir("d"); stat("d").type', "dir"),
    ],
)
def stat(path: String) -> Record:
    real = resolve_entry(path)
    try:
        st = os.lstat(real)
    except OSError as exc:
        raise os_error(exc, path) from None
    entry = _entry(posixpath.basename(path.rstrip("/")) or real.name, st)
    return {
        "name": entry["name"],
        "path": path,
        "type": entry["type"],
        "size": st.st_size,
        "modified": entry["modified"],
        "accessed": _iso(st.st_atime),
        "mode": f"{_stat.S_IMODE(st.st_mode):04o}",
        "permissions": _stat.filemode(st.st_mode),
    }


@builtin(
    "glob",
    category=CAT,
    effect="read",
    description=(
        "Paths matching a glob pattern, sorted: * and ? within a name, [abc], {a,b} "
        "alternatives and ** for any depth. Hidden names match only a pattern starting with a "
        "dot; symlinked directories are not entered."
    ),
    examples=[
        Example('write("a.txt", ""); write("b.md", ""); glob("*.txt")', ["a.txt"]),
        Example(
            'mkdir("s/t"); write("s/t/x.py", ""); write("y.py", ""); glob("**/*.py")',
            ["s/t/x.py", "y.py"],
        ),
        Example('write("a.txt", ""); write("b.md", ""); glob("*.{md,txt}")', ["a.txt", "b.md"]),
    ],
)
@translate_os_errors
def glob(pattern: String) -> Array:
    return [shown for shown, _ in _glob(pattern)]


_TYPES = ("file", "dir", "symlink")


@builtin(
    "find",
    category=CAT,
    effect="read",
    description=(
        "Paths below a directory whose name matches a glob pattern, at any depth, sorted; "
        'type filters on "file", "dir" or "symlink". find("*.py") searches the '
        "current directory. Symlinks are not followed."
    ),
    examples=[
        Example(
            'mkdir("a/b"); write("a/b/x.py", ""); write("a/y.txt", ""); find("a", "*.py")',
            ["a/b/x.py"],
        ),
        Example('mkdir("a/b"); write("a/b/x.py", ""); find(".", type="dir")', ["a", "a/b"]),
        Example('mkdir("a"); write("a/x.py", ""); find("*.py")', ["a/x.py"]),
    ],
)
@translate_os_errors
def find(path: String = ".", name: String = "*", type: String | None = None) -> Array:
    if type is not None and type not in _TYPES:
        raise ConchError(
            "ValueError", f"find: type must be one of {', '.join(_TYPES)}, got {type!r}"
        )
    if name == "*" and _has_magic(path) and "/" not in path:
        path, name = ".", path
    import fnmatch

    ctx = current()
    real = ctx.resolve_path(path)
    if not real.is_dir():
        if not real.exists():
            raise not_found(path)
        raise ConchError("IOError", f"find: not a directory: {path}")
    out = []
    for shown, entry, _depth in walk(real, path, ctx):
        if not fnmatch.fnmatchcase(entry.name, name):
            continue
        if type is not None:
            kind = "symlink" if entry.is_symlink() else ("dir" if is_real_dir(entry) else "file")
            if kind != type:
                continue
        out.append(shown)
    return sorted(out)


@builtin(
    "pwd",
    category=CAT,
    effect="read",
    description="The current directory of the run (an absolute path).",
    examples=[
        Example("pwd()", type="String"),
        Example('mkdir("d"); cd("d"); pwd() == cd(".")', True),
    ],
)
def pwd() -> String:
    return current().cwd.as_posix()


@builtin(
    "cd",
    category=CAT,
    effect="read",
    description=(
        "Change the current directory of the run (it must stay in the workspace) and return "
        "it; with no argument, go to the workspace root (the home directory in the shell)."
    ),
    examples=[
        Example('mkdir("sub"); cd("sub"); write("f.txt", "x"); cd(".."); cat("sub/f.txt")', "x")
    ],
)
def cd(path: String | None = None) -> String:
    ctx = current()
    if path is None:
        from pathlib import Path

        real = ctx.workspace or Path.home()
        shown = "~"
    else:
        real = ctx.resolve_path(path)
        shown = path
    if not real.is_dir():
        if not real.exists():
            raise not_found(shown)
        raise ConchError("IOError", f"cd: not a directory: {shown}")
    ctx.cwd = real
    return real.as_posix()


@builtin(
    "du",
    category=CAT,
    effect="read",
    description=(
        "Disk usage of a file or directory tree: {path, bytes, files, dirs}, bytes being the "
        "sum of file sizes. Symlinks are neither followed nor counted."
    ),
    examples=[
        Example(
            'mkdir("d/e"); write("d/a.txt", "abc"); write("d/e/b.txt", "de"); du("d")',
            {"path": "d", "bytes": 5, "files": 2, "dirs": 1},
        )
    ],
)
@translate_os_errors
def du(path: String = ".") -> Record:
    ctx = current()
    real = ctx.resolve_path(path)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise os_error(exc, path) from None
    if not _stat.S_ISDIR(st.st_mode):
        return {"path": path, "bytes": st.st_size, "files": 1, "dirs": 0}
    total = files = dirs = 0
    for _shown, entry, _depth in walk(real, "", ctx):
        if entry.is_symlink():
            continue
        if is_real_dir(entry):
            dirs += 1
            continue
        try:
            total += entry.stat(follow_symlinks=False).st_size
            files += 1
        except OSError:
            continue
    return {"path": path, "bytes": total, "files": files, "dirs": dirs}
