"""Conch errors: one exception class with a closed set of kinds.

Every failure a conch program can meet is a :class:`ConchError`. Python exceptions raised
while running compiled code are translated into one by :func:`from_python` so that callers
(the shell, the servers) only ever see conch kinds.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

KINDS = (
    "SyntaxError",
    "NameError",
    "TypeError",
    "ValueError",
    "IndexError",
    "KeyError",
    "ZeroDivisionError",
    "FileNotFoundError",
    "PermissionError",
    "IOError",
    "TimeoutError",
    "LimitError",
    "CancelledError",
    "UserError",
    "ProviderError",
)


_DICT_FIELDS = ("kind", "message", "line", "column", "hint")


class ConchError(Exception):
    """A conch error. ``kind`` is one of :data:`KINDS`."""

    def __init__(
        self,
        kind: str,
        message: str,
        line: int | None = None,
        column: int | None = None,
        hint: str | None = None,
        value: Any = None,
    ) -> None:
        if kind not in KINDS:
            raise AssertionError(f"unknown error kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.line = line
        self.column = column
        self.hint = hint
        # The thrown value for UserError (``throw {code: 3}`` keeps the record).
        self.value = value

    def at(self, line: int | None, column: int | None) -> ConchError:
        """Attach a position unless one is already known (the innermost position wins)."""
        if self.line is None and line is not None:
            self.line = line
            self.column = column
        return self

    def to_dict(self) -> dict[str, Any]:
        """The error as data: what a run's envelope reports and a ``catch`` binds."""
        return {name: getattr(self, name) for name in _DICT_FIELDS}

    def render(self, source: str | None = None) -> str:
        """The text rendering with a caret under the offending column (docs/language.md)."""
        head = f"{self.kind}: {self.message}"
        if self.line is not None and f"line {self.line}" not in self.message:
            head += f" at line {self.line}, column {self.column}"
        out = [head]
        if source is not None and self.line is not None:
            lines = source.splitlines()
            if 1 <= self.line <= len(lines):
                text = lines[self.line - 1]
                gutter = str(self.line)
                out.append(f"  {gutter} | {text}")
                col = max(1, self.column or 1)
                out.append(f"  {' ' * len(gutter)} | {' ' * (col - 1)}^")
        if self.hint:
            out.append(f"hint: {self.hint}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return f"ConchError({self.kind!r}, {self.message!r}, line={self.line}, column={self.column})"


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """A ``did you mean "x"?`` hint for the closest candidate, or None."""
    import difflib  # only when a name is wrong: difflib costs start-up time

    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f'did you mean "{close[0]}"?' if close else None


def check_at_least(who: str, name: str, n: int, least: int) -> None:
    """A ValueError unless the count parameter ``name`` of ``who`` is ``least`` or more."""
    if n < least:
        raise ConchError("ValueError", f"{who}: '{name}' must be {least} or more, got {n}")


# Python exception types, the conch kind each becomes and, for a few, the message it gets
# (None: the exception's own, see _python_message); the first match wins.
_PY_KINDS: tuple[tuple[type[BaseException], str, str | None], ...] = (
    (ZeroDivisionError, "ZeroDivisionError", "division by zero"),
    (RecursionError, "LimitError", "maximum recursion depth exceeded"),
    (MemoryError, "LimitError", "out of memory"),
    (KeyError, "KeyError", None),
    (IndexError, "IndexError", None),
    (TypeError, "TypeError", None),
    (OverflowError, "ValueError", None),
    (ValueError, "ValueError", None),
    (FileNotFoundError, "FileNotFoundError", None),
    (NotADirectoryError, "FileNotFoundError", None),
    (IsADirectoryError, "IOError", None),
    (PermissionError, "PermissionError", None),
    (TimeoutError, "TimeoutError", None),
    (OSError, "IOError", None),
)


def from_python(exc: BaseException) -> ConchError:
    """Translate a Python exception raised by compiled code or a builtin into a ConchError."""
    if isinstance(exc, ConchError):
        return exc
    for py_type, kind, message in _PY_KINDS:
        if isinstance(exc, py_type):
            return ConchError(kind, message or _python_message(exc))
    return ConchError("ValueError", f"{type(exc).__name__}: {exc}")


def _python_message(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        key = exc.args[0] if exc.args else ""
        return f"no field {key!r}" if isinstance(key, str) else f"no key {key!r}"
    if isinstance(exc, OSError) and exc.filename is not None:
        reason = exc.strerror or str(exc)
        return f"{reason}: {exc.filename}"
    text = str(exc)
    return text or type(exc).__name__
