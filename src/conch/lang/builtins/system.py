"""System builtins: output, environment, clock, sleeping, assertions and introspection.

Effects: ``env`` and ``hostname`` read the machine (``read``). ``print`` is ``pure``: its
output goes to the run's own sink (the terminal, or the server's event stream), which changes
nothing in the world and is bounded by the output limit. ``now``, ``timestamp`` and
``sleep`` are pure too: they observe or spend time but touch nothing.
"""

from __future__ import annotations

import os
import time

import conch
from conch.lang.builtins import registry
from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Array, Bool, Float, Function, Int, Record, String, Table
from conch.lang.context import current
from conch.lang.errors import ConchError, did_you_mean
from conch.lang.values import function_name, render

# datetime is imported by the date builtins when first called, typing only by type checkers:
# they cost milliseconds on every start of a program that names a system builtin.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import datetime as _dt
    from typing import Any


@builtin(
    "print",
    category="system",
    returns="Null",
    description="Write the values to the program's output, rendered as `str` renders them and "
    "separated by spaces, as one line. Returns null.",
    examples=[Example('print("hello", 42, [1, 2])', None), Example("print()", None)],
)
def print_(*values: Any) -> None:
    text = " ".join([v if type(v) is str else render(v) for v in values])
    current().emit(text)
    return None


@builtin(
    "echo",
    category="system",
    description="Return its argument unchanged (a pipeline stage that does nothing).",
    examples=[Example("echo(42)", 42), Example("[1, 2] | echo", [1, 2])],
)
def echo(value: Any) -> Any:
    return value


@builtin(
    "env",
    category="system",
    description="The environment variable `name`, or `default` when it is not set; with no name, "
    "the whole environment as a Record sorted by name.",
    effect="read",
    examples=[
        Example('env("CONCH_SURELY_UNSET_VARIABLE", default="none")', "none"),
        Example("type_of(env())", "Record"),
    ],
)
def env(name: String | None = None, default: Any = None) -> Any:
    if name is None:
        return dict(sorted(os.environ.items()))
    return os.environ.get(name, default)


def _iso_utc(moment: _dt.datetime) -> str:
    import datetime as _dt

    return moment.astimezone(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@builtin(
    "now",
    category="system",
    description="The current time as an ISO-8601 UTC string with milliseconds, e.g. "
    "`2024-05-01T13:45:00.123Z`.",
    examples=[
        Example("now()", type="String"),
        Example(
            "now() | regex_match('^\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z$')", True
        ),
    ],
)
def now() -> String:
    import datetime as _dt

    return _iso_utc(_dt.datetime.now(_dt.UTC))


@builtin(
    "timestamp",
    category="system",
    description="The current time as Unix milliseconds (an Int).",
    examples=[Example("timestamp()", type="Int"), Example("timestamp() > 1700000000000", True)],
)
def timestamp() -> Int:
    return time.time_ns() // 1_000_000


def _parse_moment(value: Any) -> _dt.datetime:
    import datetime as _dt

    if type(value) is str:
        try:
            moment = _dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ConchError(
                "ValueError",
                f"date_format: {value!r} is not an ISO-8601 date",
                hint='use e.g. "2024-05-01T13:45:00Z", or Unix milliseconds',
            ) from None
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=_dt.UTC)
    try:
        return _dt.datetime.fromtimestamp(value / 1000, _dt.UTC)
    except (OverflowError, OSError, ValueError):
        raise ConchError("ValueError", f"date_format: timestamp {value} is out of range") from None


@builtin(
    "date_format",
    category="system",
    description="Format a moment with a strftime pattern (default `%Y-%m-%d`). The moment is "
    "Unix milliseconds (shown in UTC) or an ISO-8601 string (shown in its own offset; UTC "
    "when it has none).",
    examples=[
        Example("date_format(0)", "1970-01-01"),
        Example('date_format("2024-05-01T13:45:00Z", "%H:%M on %d/%m")', "13:45 on 01/05"),
        Example('date_format(1714571100000, "%Y-%m-%dT%H:%M:%SZ")', "2024-05-01T13:45:00Z"),
    ],
)
def date_format(moment: Int | Float | String, fmt: String = "%Y-%m-%d") -> String:
    return _parse_moment(moment).strftime(fmt)


# Sleeping is sliced so that cancellation and the wall-time limit are noticed quickly.
_SLICE_S = 0.05


@builtin(
    "sleep",
    category="system",
    returns="Null",
    description="Pause for `ms` milliseconds (`sleep(250ms)`, `sleep(2s)`). Cancelling the run "
    "interrupts it (CancelledError); running past the wall-time limit is a TimeoutError. "
    "Returns null.",
    examples=[Example("sleep(1)", None), Example("sleep(0)", None)],
)
def sleep(ms: Int | Float) -> None:
    if ms < 0:
        raise ConchError("ValueError", f"sleep: ms must not be negative, got {ms}")
    ctx = current()
    start = time.monotonic()
    end = start + ms / 1000
    limit = ctx.limits.wall_time_s
    deadline = ctx.deadline
    if deadline is None and limit is not None:
        # Called outside a run (a lazy result consumed later): the sleep alone must fit.
        deadline = start + limit
    cancelled = ctx.cancelled
    while True:
        ctx.check_cancelled()
        now_ = time.monotonic()
        if now_ >= end:
            return None
        if deadline is not None and now_ >= deadline:
            raise ConchError(
                "TimeoutError",
                f"sleep: the run exceeded its wall-time limit of {limit} s",
            )
        wake = min(end, now_ + _SLICE_S)
        if deadline is not None:
            wake = min(wake, deadline)
        # Event.wait returns early when the run is cancelled.
        cancelled.wait(max(wake - now_, 0))


@builtin(
    "hostname",
    category="system",
    description="The name of the machine running the program.",
    effect="read",
    examples=[Example("hostname()", type="String")],
)
def hostname() -> String:
    import socket

    return socket.gethostname()


@builtin(
    "version",
    category="system",
    description="The version of conch.",
    examples=[
        Example("version()", type="String"),
        Example("version() | regex_match('^\\d+\\.\\d+')", True),
    ],
)
def version() -> String:
    return conch.__version__


@builtin(
    "assert",
    category="system",
    returns="Null",
    description="Fail with a UserError carrying `message` when `condition` is false: the check "
    "is the program's own, like `throw`. Returns null when it holds.",
    examples=[
        Example("assert(1 + 1 == 2)", None),
        Example(
            'try { assert(false, "boom") } catch e { e.kind + ": " + e.message }', "UserError: boom"
        ),
    ],
)
def assert_(condition: Bool, message: String = "assertion failed") -> None:
    if not condition:
        raise ConchError("UserError", message)
    return None


# -- introspection ------------------------------------------------------------------------


@builtin(
    "builtins",
    category="system",
    description="Every builtin as a Table of `{name, category, description}`, sorted by "
    "category then name; `category` keeps one category.",
    examples=[
        Example('builtins("strings") | where(fn(b) => b.name == "upper") | len', 1),
        Example("builtins() | type_of", "Table"),
    ],
)
def builtins(category: String | None = None) -> Table:
    if category is not None and category not in registry.CATEGORIES:
        raise ConchError(
            "ValueError",
            f"builtins: unknown category {category!r}",
            hint=did_you_mean(category, registry.CATEGORIES)
            or f"categories: {', '.join(registry.CATEGORIES)}",
        )
    return [
        {"name": b.name, "category": b.category, "description": b.description}
        for b in registry.all_builtins()
        if category is None or b.category == category
    ]


@builtin(
    "help",
    category="system",
    description="The documentation of a builtin, by name or the builtin itself: a Record with "
    "name, description, category, signature, parameters, returns, effect, aliases and examples "
    "(with their results). An unknown name is a NameError.",
    examples=[
        Example('help("upper").signature', "upper(s: String) -> String"),
        Example("help(trim).category", "strings"),
    ],
)
def help_(name: String | Function) -> Record:
    if not isinstance(name, str):
        b = getattr(name, "conch_builtin", None)
        if b is None:
            raise ConchError(
                "TypeError",
                f"help: parameter 'name' expects a builtin or its name, got the function "
                f"{function_name(name)!r}",
            )
        return b.to_dict()
    found = registry.lookup(name)
    if found is None:
        raise ConchError(
            "NameError",
            f"help: unknown builtin {name!r}",
            hint=did_you_mean(name, registry.REGISTRY) or "builtins() lists them all",
        )
    return found.to_dict()


@builtin(
    "run_process",
    category="system",
    effect="process",
    returns="Record",
    description="Run a command, without a shell, in the current directory, and return "
    "`{code, stdout, stderr}` (stdout and stderr as text). `command` is a program on PATH or "
    "a path; `args` are its arguments; `stdin` is text sent to it. The command is stopped "
    "(TimeoutError) when the run's wall time runs out or the run is cancelled, and its "
    "output counts against the output limit. In the agent server it needs `allow_process`, "
    "and runs inside the worker's sandbox (docs/agent-server.md).",
    examples=[
        Example('run_process("echo", ["hi"]).stdout', "hi\n"),
        Example('run_process("sh", ["-c", "exit 3"]).code', 3),
        Example('run_process("cat", stdin="piped").stdout', "piped"),
    ],
)
def run_process(command: String, args: Array | None = None, stdin: String | None = None) -> Record:
    import shutil
    import subprocess

    ctx = current()
    argv = list(args or ())
    if not all(type(a) is str for a in argv):
        raise ConchError("TypeError", "run_process: args must be an Array of Strings")
    program = command
    if "/" in command:
        program = str(ctx.resolve_path(command))
    elif shutil.which(command) is None:
        raise ConchError("IOError", f"run_process: no program named {command!r} on PATH")
    limit = ctx.limits.wall_time_s
    deadline = ctx.deadline
    if deadline is None and limit is not None:
        deadline = time.monotonic() + limit
    try:
        # In the worker's process group (no new session): a worker that is killed takes it along.
        proc = subprocess.Popen(
            [program, *argv], cwd=ctx.cwd,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
    except OSError as exc:
        kind = "PermissionError" if isinstance(exc, PermissionError) else "IOError"
        raise ConchError(kind, f"run_process: cannot start {command!r}: {exc.strerror or exc}") from None
    data = None if stdin is None else stdin.encode("utf-8")
    try:
        while True:
            wait = _SLICE_S * 4
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            try:
                out, err = proc.communicate(data, timeout=wait)
                break
            except subprocess.TimeoutExpired:
                # communicate() keeps what it has sent and read so far, and goes on sending
                # the rest of the input it was first given: it refuses to be given it again.
                data = None
            ctx.check_cancelled()
            if deadline is not None and time.monotonic() >= deadline:
                raise ConchError(
                    "TimeoutError",
                    f"run_process: {command!r} ran past the run's wall-time limit of {limit} s",
                )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if ctx.limits.output_bytes is not None:
        ctx.output_used += len(out) + len(err)
        if ctx.output_used > ctx.limits.output_bytes:
            raise ConchError("LimitError",
                             f"output limit of {ctx.limits.output_bytes} bytes exceeded")
    return {"code": proc.returncode, "stdout": out.decode("utf-8", "replace"),
            "stderr": err.decode("utf-8", "replace")}
