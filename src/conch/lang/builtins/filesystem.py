"""Filesystem builtins: listing, reading, writing and searching files.

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

import io
import itertools
import os
import posixpath
import stat as _stat

from conch.lang import values
from conch.lang.builtins.registry import REGISTRY, Example, builtin
from conch.lang.builtins.types import Array, Bool, Int, Record, String, Table
from conch.lang.context import Context, current
from conch.lang.errors import ConchError, check_at_least

# pathlib, json, re, fnmatch, shutil, tempfile, csv, datetime and the like are imported
# where used, and typing only by type checkers: a program naming one builtin imports this
# module (``append`` and ``find`` are also collection builtins), and together they would be
# most of its start-up.
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


# -- text helpers --------------------------------------------------------------------------


def _read_text(path: str) -> str:
    real = resolve(path)
    try:
        with open(real, encoding="utf-8", errors="replace", newline="") as fh:
            return fh.read()
    except IsADirectoryError:
        raise ConchError("IOError", f"is a directory: {path}", hint=f'ls("{path}") lists it')
    except OSError as exc:
        raise os_error(exc, path) from None


def _is_text(value: Any) -> bool:
    return type(value) is str and "\n" in value


def _text_input(value: Any) -> tuple[str | None, list[str] | None]:
    """(path, None) for a path, (None, lines) for text or an Array of lines."""
    if values.is_array(value):
        return None, [values.render(x) for x in values.as_list(value)]
    if _is_text(value):
        return None, value.splitlines()
    return value, None


_NO_TEXT_HINT = "a String without a newline is taken as a path; pass text as `text | lines`"


def _open_lines(path: str) -> io.TextIOWrapper:
    real = resolve(path)
    try:
        return open(real, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise ConchError(
            "FileNotFoundError", f"no such file or directory: {path}", hint=_NO_TEXT_HINT
        ) from None
    except IsADirectoryError:
        raise ConchError("IOError", f"is a directory: {path}") from None
    except OSError as exc:
        raise os_error(exc, path) from None


# -- parsing and serialising by extension ------------------------------------------------


def _format_of(path: str) -> str | None:
    ext = posixpath.splitext(path)[1].lower()
    return {
        ".json": "json",
        ".csv": "csv",
        ".yaml": "yaml",
        ".yml": "yaml",
        ".toml": "toml",
        ".jsonl": "jsonl",
        ".ndjson": "jsonl",
    }.get(ext)


def _parse(fmt: str, text: str, path: str) -> Any:
    # The data builtins (from_csv, ...) decide how values are typed, so `open("x.csv")` and
    # `cat("x.csv") | from_csv` agree; JSON Lines has no builtin of its own.
    try:
        if fmt == "jsonl":
            import json

            return [json.loads(line) for line in text.splitlines() if line.strip()]
        return REGISTRY[f"from_{fmt}"].fn(text)
    except ConchError as exc:
        raise ConchError(exc.kind, f"{path}: {exc.message}", hint=exc.hint) from None
    except ValueError as exc:
        raise ConchError("ValueError", f"{path}: not valid {fmt}: {exc}") from None


def _serialise(content: Any, path: str) -> str:
    if type(content) is str:
        return content
    import json

    fmt = _format_of(path)
    if fmt in ("yaml", "toml", "csv"):
        return str(REGISTRY[f"to_{fmt}"].fn(content))
    if fmt == "jsonl" and values.is_array(content):
        return "".join(
            json.dumps(values.to_json_value(x), ensure_ascii=False) + "\n"
            for x in values.as_list(content)
        )
    return json.dumps(values.to_json_value(content), ensure_ascii=False, indent=2) + "\n"


def _umask() -> int:
    # Read rather than set-and-restore: os.umask() is process-wide and racy under threads.
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


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
    "cat",
    category=CAT,
    effect="read",
    description="The contents of a text file as a String (invalid UTF-8 is replaced).",
    examples=[Example('write("a.txt", "hi"); cat("a.txt")', "hi")],
)
def cat(path: String) -> String:
    return _read_text(path)


@builtin(
    "open",
    category=CAT,
    effect="read",
    description=(
        "Read a file and parse it by extension: .json, .jsonl, .csv (a Table), .yaml/.yml, "
        ".toml; any other file is returned as text. raw=true returns the text unparsed."
    ),
    examples=[
        Example('write("d.json", {a: 1, b: [true]}); open("d.json")', {"a": 1, "b": [True]}),
        Example('write("p.toml", "name = \\"x\\"\\n"); open("p.toml").name', "x"),
        Example('write("c.yaml", "k: v\\n"); open("c.yaml")', {"k": "v"}),
        Example('write("notes.md", "# hi"); open("notes.md")', "# hi"),
        Example('write("d.json", "[1]"); open("d.json", raw=true)', "[1]"),
    ],
)
def open_(path: String, raw: Bool = False) -> Any:
    text = _read_text(path)
    fmt = None if raw else _format_of(path)
    if fmt is None:
        return text
    return _parse(fmt, text, path)


@builtin(
    "write",
    category=CAT,
    effect="write",
    description=(
        "Replace a file's contents atomically (temporary file, then rename). A String is "
        "written as is; other values as .yaml/.toml/.csv by extension, JSON otherwise. "
        "Returns {path, bytes}."
    ),
    examples=[
        Example('write("a.txt", "héllo")', {"path": "a.txt", "bytes": 6}),
        Example('write("a.json", [1, 2]); open("a.json")', [1, 2]),
        Example('write("t.csv", [{a: "x"}, {a: "y"}]); open("t.csv") | .a', ["x", "y"]),
    ],
)
@translate_os_errors
def write(path: String, content: Any) -> Record:
    ctx = current()
    real = ctx.resolve_path(path)
    data = _serialise(content, path).encode("utf-8")
    if os.path.isdir(real):
        raise ConchError("IOError", f"is a directory: {path}")
    parent = real.parent
    if not parent.is_dir():
        raise ConchError(
            "FileNotFoundError",
            f"no such directory: {posixpath.dirname(path) or '.'}",
            hint="create it first with mkdir",
        )
    try:
        mode = _stat.S_IMODE(os.stat(real).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{real.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException:
        import contextlib

        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return {"path": path, "bytes": len(data)}


@builtin(
    "append",
    category=CAT,
    effect="write",
    description=(
        "Append to a file, creating it if needed. A String is appended as is; any other value "
        "as one line of JSON. Returns {path, bytes} with the bytes appended."
    ),
    examples=[
        Example('append("log.txt", "a\\n"); append("log.txt", "b\\n"); cat("log.txt")', "a\nb\n"),
        Example('append("e.jsonl", {n: 1})', {"path": "e.jsonl", "bytes": 9}),
    ],
)
@translate_os_errors
def append(path: String, content: Any) -> Record:
    real = resolve(path)
    if type(content) is str:
        text = content
    else:
        import json

        text = json.dumps(values.to_json_value(content), ensure_ascii=False) + "\n"
    data = text.encode("utf-8")
    try:
        with open(real, "ab") as fh:
            fh.write(data)
    except IsADirectoryError:
        raise ConchError("IOError", f"is a directory: {path}") from None
    except OSError as exc:
        raise os_error(exc, path) from None
    return {"path": path, "bytes": len(data)}


@builtin(
    "mkdir",
    category=CAT,
    effect="write",
    description="Create a directory and any missing parents (no error if it exists). Returns the path.",
    examples=[Example('mkdir("a/b/c"); exists("a/b/c")', True), Example('mkdir("d")', "d")],
)
@translate_os_errors
def mkdir(path: String) -> String:
    real = resolve(path)
    try:
        real.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConchError("IOError", f"exists and is not a directory: {path}") from None
    return path


@builtin(
    "rm",
    category=CAT,
    effect="write",
    description=(
        "Remove a file, a symlink (not what it points to) or an empty directory; "
        "recursive=true removes a directory and everything in it."
    ),
    examples=[
        Example('write("a.txt", "x"); rm("a.txt"); exists("a.txt")', False),
        Example(
            'mkdir("d/e"); write("d/e/f.txt", "x"); rm("d", recursive=true); exists("d")', False
        ),
    ],
)
@translate_os_errors
def rm(path: String, recursive: Bool = False) -> None:
    ctx = current()
    target = resolve_entry(path)
    if ctx.workspace is not None and target == ctx.workspace:
        raise ConchError("PermissionError", "rm: refusing to remove the workspace root")
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        raise not_found(path) from None
    if not _stat.S_ISDIR(st.st_mode):
        os.unlink(target)
        return None
    if recursive:
        import shutil

        # rmtree removes symlinks it meets without following them.
        shutil.rmtree(target)
        return None
    try:
        os.rmdir(target)
    except OSError as exc:
        if exc.errno in (39, 66):  # ENOTEMPTY (Linux, BSD)
            raise ConchError(
                "IOError", f"directory not empty: {path}", hint="rm(path, recursive=true)"
            ) from None
        raise
    return None


def _into(dst: str, src_name: str) -> tuple[Path, str]:
    """The destination of mv/cp: inside ``dst`` when it is a directory. Both the directory
    and the final path are checked against the workspace."""
    ctx = current()
    real = ctx.resolve_path(dst)
    if real.is_dir():
        shown = join_shown(dst, src_name)
        return ctx.resolve_path(real / src_name), shown
    return real, dst


def _source_name(path: str, real: Path) -> str:
    name = posixpath.basename(path.rstrip("/"))
    return real.name if name in ("", ".", "..") else name


@builtin(
    "mv",
    category=CAT,
    effect="write",
    description="Move or rename a file or directory; into a directory when the destination is one. Returns the new path.",
    examples=[
        Example(
            'write("a.txt", "x"); mv("a.txt", "b.txt"); [exists("a.txt"), cat("b.txt")]',
            [False, "x"],
        ),
        Example('write("a.txt", "x"); mkdir("d"); mv("a.txt", "d")', "d/a.txt"),
    ],
)
@translate_os_errors
def mv(src: String, dst: String) -> String:
    ctx = current()
    source = resolve_entry(src)
    if not os.path.lexists(source):
        raise not_found(src)
    if ctx.workspace is not None and source == ctx.workspace:
        raise ConchError("PermissionError", "mv: refusing to move the workspace root")
    target, shown = _into(dst, _source_name(src, source))
    if (
        source.is_dir()
        and not source.is_symlink()
        and (target == source or source in target.parents)
    ):
        raise ConchError("IOError", f"mv: cannot move {src} into itself")
    if target.is_dir():
        raise ConchError("IOError", f"mv: destination exists and is a directory: {shown}")
    import shutil

    shutil.move(os.fspath(source), os.fspath(target))
    return shown


def _copy_tree(src: Path, dst: Path, ctx: Context) -> None:
    import shutil

    dst.mkdir(exist_ok=True)
    for shown, entry, _depth in walk(src, "", ctx):
        if entry.is_symlink():
            # Links pointing outside were skipped by walk; the others are kept as links.
            link = ctx.resolve_path((dst / shown).parent) / entry.name
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(os.readlink(entry.path), link)
            continue
        target = ctx.resolve_path(dst / shown)
        if is_real_dir(entry):
            target.mkdir(exist_ok=True)
        else:
            shutil.copy2(entry.path, target)


@builtin(
    "cp",
    category=CAT,
    effect="write",
    description=(
        "Copy a file, or a directory recursively; into a directory when the destination is "
        "one. Symlinks inside a copied tree stay symlinks; those pointing outside the "
        "workspace are skipped. Returns the new path."
    ),
    examples=[
        Example('write("a.txt", "x"); cp("a.txt", "b.txt"); cat("b.txt")', "x"),
        Example('mkdir("d/e"); write("d/e/f.txt", "y"); cp("d", "d2"); cat("d2/e/f.txt")', "y"),
    ],
)
@translate_os_errors
def cp(src: String, dst: String) -> String:
    ctx = current()
    source = resolve(src)
    if not source.exists():
        raise not_found(src)
    target, shown = _into(dst, _source_name(src, source))
    if source.is_dir():
        if target == source or source in target.parents:
            raise ConchError("IOError", f"cp: cannot copy {src} into itself")
        if target.exists() and not target.is_dir():
            raise ConchError("IOError", f"cp: destination is a file: {shown}")
        _copy_tree(source, target, ctx)
    else:
        if target == source:
            raise ConchError("IOError", f"cp: {src} and {shown} are the same file")
        import shutil

        shutil.copy2(source, target)
    return shown


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
    "head",
    category=CAT,
    effect="read",
    description=(
        "The first n lines of a file or a text (a String with a newline is text, any other "
        "String a path), as a String; of an Array, its first n elements."
    ),
    examples=[
        Example('write("a.txt", "1\\n2\\n3\\n"); head("a.txt", 2)', "1\n2"),
        Example('"a\\nb\\nc" | head(1)', "a"),
        Example("[1, 2, 3] | head(2)", [1, 2]),
    ],
)
def head(input: String | Array, n: Int = 10) -> String | Array:
    return _ends("head", input, n, last=False)


def _ends(who: str, input: Any, n: int, last: bool) -> Any:
    """The first (or ``last``) ``n`` elements of an Array, or lines of a text or a file; a
    file is read line by line (only ``n`` lines are kept)."""
    check_at_least(who, "n", n, 0)
    array = values.is_array(input)
    if last:
        from collections import deque

        if n == 0:  # (and a deque of no length would read everything)
            return [] if array else ""
    if array:
        return list(deque(input, maxlen=n) if last else itertools.islice(input, n))
    if _is_text(input):
        lines = input.splitlines()
        return "\n".join(lines[-n:] if last else lines[:n])
    with _open_lines(input) as fh:
        picked = deque(fh, maxlen=n) if last else itertools.islice(fh, n)
        return "\n".join(line.rstrip("\r\n") for line in picked)


@builtin(
    "tail",
    category=CAT,
    effect="read",
    description=(
        "The last n lines of a file or a text (a String with a newline is text, any other "
        "String a path), as a String; of an Array, its last n elements."
    ),
    examples=[
        Example('write("a.txt", "1\\n2\\n3\\n"); tail("a.txt", 2)', "2\n3"),
        Example('"a\\nb\\nc" | tail(1)', "c"),
        Example("[1, 2, 3] | tail(2)", [2, 3]),
    ],
)
def tail(input: String | Array, n: Int = 10) -> String | Array:
    return _ends("tail", input, n, last=True)


@builtin(
    "wc",
    category=CAT,
    effect="read",
    description=(
        "Count {lines, words, bytes} of a file or a text (a String with a newline is text, "
        "any other String a path); a last line without a newline counts as a line."
    ),
    examples=[
        Example(
            'write("a.txt", "one two\\nthree\\n"); wc("a.txt")',
            {"lines": 2, "words": 3, "bytes": 14},
        ),
        Example('"a b\\nc" | wc', {"lines": 2, "words": 3, "bytes": 5}),
    ],
)
def wc(input: String | Array) -> Record:
    path, lines = _text_input(input)
    if path is not None:
        real = resolve(path)
        try:
            data = real.read_bytes()
        except IsADirectoryError:
            raise ConchError("IOError", f"is a directory: {path}") from None
        except FileNotFoundError:
            raise ConchError(
                "FileNotFoundError", f"no such file or directory: {path}", hint=_NO_TEXT_HINT
            ) from None
        except OSError as exc:
            raise os_error(exc, path) from None
        text = data.decode("utf-8", errors="replace")
        return {"lines": len(text.splitlines()), "words": len(text.split()), "bytes": len(data)}
    assert lines is not None
    text = input if type(input) is str else "\n".join(lines)
    return {
        "lines": len(lines),
        "words": len(text.split()),
        "bytes": len(text.encode("utf-8")),
    }


def _is_binary(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return b"\0" in fh.read(8192)
    except OSError:
        return True


@builtin(
    "grep",
    category=CAT,
    effect="read",
    description=(
        "Lines matching a regular expression. grep(pattern, path) searches a file, a directory "
        "(recursively, skipping binary files and symlinks) or an Array of paths and returns a "
        "Table {path, line, text}; on text (a String with a newline, or an Array of lines, "
        'also piped: `cat("f") | grep("x")`) it returns {line, text}. Lines are 1-based.'
    ),
    examples=[
        Example(
            'write("a.txt", "foo\\nbar\\nfood\\n"); grep("^foo", "a.txt")',
            [
                {"path": "a.txt", "line": 1, "text": "foo"},
                {"path": "a.txt", "line": 3, "text": "food"},
            ],
        ),
        Example(
            '"one\\ntwo\\nthree" | grep("t")',
            [{"line": 2, "text": "two"}, {"line": 3, "text": "three"}],
        ),
        Example('grep("B", "a\\nb\\n", ignore_case=true) | .line', [2]),
        Example('mkdir("d"); write("d/x.txt", "hit\\n"); grep("hit", "d") | .path', ["d/x.txt"]),
    ],
)
@translate_os_errors
def grep(pattern: String | Array, input: String | Array = ".", ignore_case: Bool = False) -> Table:
    piped = values.is_array(pattern) or _is_text(pattern)
    if piped:
        # piped text: the subject came first
        if type(input) is not str:
            raise ConchError("TypeError", "grep: the pattern must be a String")
        pattern, input = input, pattern
    assert type(pattern) is str
    import re
    from pathlib import Path

    try:
        regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise ConchError(
            "ValueError", f"grep: invalid regular expression {pattern!r}: {exc}"
        ) from None
    if piped or _is_text(input):
        lines = (
            [values.render(x) for x in values.as_list(input)]
            if piped and values.is_array(input)
            else input.splitlines()
        )
        return [{"line": i, "text": t} for i, t in enumerate(lines, 1) if regex.search(t)]
    if values.is_array(input):
        # An Array in second position: the paths to search.
        targets = [values.render(x) for x in values.as_list(input)]
    else:
        targets = [input]
    ctx = current()
    files: list[tuple[str, Path]] = []
    for target in targets:
        real = ctx.resolve_path(target)
        if real.is_dir():
            for shown, entry, _depth in walk(real, target, ctx):
                if entry.is_file(follow_symlinks=False) and not _is_binary(entry.path):
                    files.append((shown, Path(entry.path)))
        elif real.exists():
            files.append((target, real))
        else:
            raise ConchError(
                "FileNotFoundError", f"no such file or directory: {target}", hint=_NO_TEXT_HINT
            )
    out = []
    for shown, real in files:
        ctx.check_cancelled()
        try:
            with open(real, encoding="utf-8", errors="replace") as fh:
                for i, line in enumerate(fh, 1):
                    text = line.rstrip("\r\n")
                    if regex.search(text):
                        out.append({"path": shown, "line": i, "text": text})
        except OSError as exc:
            raise os_error(exc, shown) from None
    return out


@builtin(
    "touch",
    category=CAT,
    effect="write",
    description="Create an empty file, or set an existing one's modification time to now. Returns the path.",
    examples=[Example('touch("a.txt"); [exists("a.txt"), cat("a.txt")]', [True, ""])],
)
@translate_os_errors
def touch(path: String) -> String:
    real = resolve(path)
    if real.exists():
        os.utime(real)
    else:
        try:
            with open(real, "ab"):
                pass
        except FileNotFoundError:
            raise not_found(path) from None
    return path


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
