"""Filesystem builtins that read and write a file's contents: ``cat``, ``open`` (parsed by
extension), ``write`` (atomic, serialised by extension) and ``append``.

Category ``filesystem``: paths are resolved and checked against the workspace as
:mod:`.filesystem` says; the formats are the data builtins' (``from_csv``, ``to_yaml``...).
"""

from __future__ import annotations

import os
import posixpath
import stat as _stat

from conch.lang import values
from conch.lang.builtins.filesystem import CAT, os_error, resolve, translate_os_errors
from conch.lang.builtins.registry import REGISTRY, Example, builtin
from conch.lang.builtins.types import Bool, Record, String
from conch.lang.context import current
from conch.lang.errors import ConchError

# Other modules are imported where used, typing only by type checkers: see .filesystem.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _read_text(path: str) -> str:
    real = resolve(path)
    try:
        with open(real, encoding="utf-8", errors="replace", newline="") as fh:
            return fh.read()
    except IsADirectoryError:
        raise ConchError("IOError", f"is a directory: {path}", hint=f'ls("{path}") lists it')
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
