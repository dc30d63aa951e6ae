"""Filesystem builtins that read lines of a file or of a text: ``head``, ``tail``, ``wc`` and
``grep`` (which also searches a directory tree).

Category ``filesystem``: a String with a newline is text, any other String a path, an Array
a list of lines (the module :mod:`.filesystem` says why).
"""

from __future__ import annotations

import io
import itertools

from conch.lang import values
from conch.lang.builtins.filesystem import CAT, os_error, resolve, translate_os_errors, walk
from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Array, Bool, Int, Record, String, Table
from conch.lang.context import current
from conch.lang.errors import ConchError, check_at_least

# Other modules are imported where used, typing only by type checkers: see .filesystem.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any


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
