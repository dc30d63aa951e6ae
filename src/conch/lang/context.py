"""The run context: what a running program may touch, and where its output goes.

Builtins that need the outside world (files, output, effects policy, limits) ask
:func:`current` for the context of the run they are part of. The shell runs with no
workspace (the whole machine, every effect allowed); the server runs each request with a
sandboxed workspace and limits. What the language does not own (models, agents) it reaches
through the context's :class:`~conch.lang.host.Host`, given by the program running it.
"""

from __future__ import annotations

import _thread
import contextvars
import os
import sys

from conch.lang.errors import ConchError
from conch.lang.record import record

# Records rather than dataclasses, and pathlib imported when a path is first needed:
# dataclasses (with the inspect and re modules it imports) and pathlib cost milliseconds on
# every ``conch -c``.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

    from conch.lang.host import Host

EFFECTS = ("pure", "read", "write", "network", "process", "model")
ALL_EFFECTS = frozenset(EFFECTS)


_CREATE_LOCK = _thread.allocate_lock()

@record
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


class Context:
    """Everything a run may consult besides its own variables."""

    def __init__(
        self,
        workspace: Path | str | None = None,
        cwd: Path | None = None,
        allowed_effects: frozenset[str] = ALL_EFFECTS,
        output: Callable[[str], None] = _stdout_line,
        limits: Limits | None = None,
        cancelled: threading.Event | None = None,
        settings: Any = None,
        output_used: int = 0,
        deadline: float | None = None,
        host: Host | None = None,
    ) -> None:
        self.workspace: Path | None = None
        self._cwd = cwd
        self.allowed_effects = allowed_effects
        self.output = output
        self.limits = limits if limits is not None else Limits()
        self._cancelled = cancelled
        # Settings of the server running the program (its network policy) for the http
        # builtins; None in the shell (every address allowed).
        self.settings = settings
        self.output_used = output_used
        # When the run in progress must end (a time.monotonic() value), set while a run with
        # a wall-time limit is in progress: builtins that wait (sleep) stop there.
        self.deadline = deadline
        # What the run reaches outside the language (models, agents: conch.lang.host);
        # None: nothing, and the builtins that need it say so.
        self.host = host
        if workspace is not None:
            from pathlib import Path

            self.workspace = Path(os.path.realpath(workspace))
            if not str(self.cwd).startswith(str(self.workspace)):
                self.cwd = self.workspace

    @property
    def cancelled(self) -> threading.Event:
        """Set to cancel the run (created on first use: threading costs start-up time)."""
        if self._cancelled is None:
            import threading

            with _CREATE_LOCK:  # the host may cancel from another thread as the run starts
                if self._cancelled is None:
                    self._cancelled = threading.Event()
        return self._cancelled

    @cancelled.setter
    def cancelled(self, value: threading.Event) -> None:
        self._cancelled = value

    @property
    def cwd(self) -> Path:
        """The directory relative paths start from (the process's own when not given)."""
        if self._cwd is None:
            from pathlib import Path

            self._cwd = Path.cwd()
        return self._cwd

    @cwd.setter
    def cwd(self, value: Path) -> None:
        self._cwd = value

    def __repr__(self) -> str:
        return f"Context(workspace={self.workspace!r}, limits={self.limits!r})"

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
        from pathlib import Path

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
        if self._cancelled is not None and self._cancelled.is_set():
            raise ConchError("CancelledError", "the run was cancelled")


_current: contextvars.ContextVar[Context] = contextvars.ContextVar("conch_context")
_default = Context()


def current() -> Context:
    """The context of the run in progress (a permissive shell context if none is set)."""
    return _current.get(_default)


class using:  # a class named as a function: ``with using(ctx):``
    """Make ``ctx`` the current context for the duration of a run."""

    __slots__ = ("ctx", "token")

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def __enter__(self) -> Context:
        self.token = _current.set(self.ctx)
        return self.ctx

    def __exit__(self, *exc: object) -> None:
        _current.reset(self.token)
