"""The run context: what a running program may touch, and where its output goes.

Builtins that need the outside world (files, output, effects policy, limits) ask
:func:`current` for the context of the run they are part of. The shell runs with no
workspace (the whole machine, every effect allowed); the server runs each request with a
sandboxed workspace and limits.
"""

from __future__ import annotations

import contextvars
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conch.lang.errors import ConchError

EFFECTS = ("pure", "read", "write", "network", "process", "model")
ALL_EFFECTS = frozenset(EFFECTS)


@dataclass
class Limits:
    """Per-run limits. ``None`` means unlimited (the shell's default)."""

    wall_time_s: float | None = None
    steps: int | None = None
    recursion: int | None = None
    output_bytes: int | None = None
    collection_size: int | None = None


def _stdout_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@dataclass
class Context:
    """Everything a run may consult besides its own variables."""

    workspace: Path | None = None
    cwd: Path = field(default_factory=Path.cwd)
    allowed_effects: frozenset[str] = ALL_EFFECTS
    output: Callable[[str], None] = _stdout_line
    limits: Limits = field(default_factory=Limits)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Settings of the host (model endpoints, network policy, ...) for the ai/http builtins.
    settings: Any = None
    output_used: int = 0
    # When the run in progress must end (a time.monotonic() value), set while a run with a
    # wall-time limit is in progress: builtins that wait (sleep) stop there.
    deadline: float | None = None

    def __post_init__(self) -> None:
        if self.workspace is not None:
            self.workspace = Path(os.path.realpath(self.workspace))
            if not str(self.cwd).startswith(str(self.workspace)):
                self.cwd = self.workspace

    def emit(self, line: str) -> None:
        """Send one line of program output (``print``), enforcing the output limit."""
        limit = self.limits.output_bytes
        if limit is not None:
            self.output_used += len(line.encode("utf-8", "replace")) + 1
            if self.output_used > limit:
                raise ConchError("LimitError", f"output limit of {limit} bytes exceeded")
        self.output(line)

    def check_effect(self, effect: str, builtin: str) -> None:
        if effect not in self.allowed_effects:
            raise ConchError(
                "PermissionError",
                f"{builtin}: the {effect!r} effect is not allowed here",
                hint=f"the server must enable {effect} (allow_{effect})"
                if effect in ("network", "process")
                else None,
            )

    def resolve_path(self, path: str | os.PathLike[str]) -> Path:
        """An absolute real path for ``path`` (relative to ``cwd``).

        With a workspace, the real path (symlinks resolved) must stay inside it, else
        ``PermissionError``: a symlink inside the workspace that points outside is refused.
        """
        raw = Path(os.path.expanduser(os.fspath(path))) if self.workspace is None else Path(path)
        full = raw if raw.is_absolute() else self.cwd / raw
        real = Path(os.path.realpath(full))
        if self.workspace is not None:
            root = self.workspace
            if real != root and root not in real.parents:
                raise ConchError(
                    "PermissionError",
                    f"path {os.fspath(path)!r} is outside the workspace",
                    hint="paths must stay inside the workspace root",
                )
        return real

    def display_path(self, real: Path) -> str:
        """How a path is shown back to the program: relative to the workspace when sandboxed."""
        if self.workspace is not None:
            try:
                rel = real.relative_to(self.workspace)
                return "/" + rel.as_posix() if rel.parts else "/"
            except ValueError:
                return real.as_posix()
        return real.as_posix()

    def check_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise ConchError("CancelledError", "the run was cancelled")


_current: contextvars.ContextVar[Context] = contextvars.ContextVar("conch_context")
_default = Context()


def current() -> Context:
    """The context of the run in progress (a permissive shell context if none is set)."""
    return _current.get(_default)


@contextmanager
def using(ctx: Context) -> Iterator[Context]:
    """Make ``ctx`` the current context for the duration of a run."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
