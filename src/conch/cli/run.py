"""Running a program as the shell does, for `conch -c` and `conch run FILE` (from the entry
point or through typer). No typer, rich or prompt_toolkit at import: this is the cold-start path.

Exit status: 0 on success, 1 on a conch error (rendered with a caret on stderr), 2 on a
syntax error, 130 on Ctrl-C.
"""

from __future__ import annotations

import os
import sys

# typing costs milliseconds of every start-up; the annotations are strings
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_SYNTAX = 2
EXIT_INTERRUPTED = 130


def _write_result(value: Any) -> None:
    from conch.lang import values

    if value is None:
        # a program ending in a binding, a loop or print() has nothing more to say
        return
    if isinstance(value, values.LazyList | range):
        value = values.as_list(value)
    out = sys.stdout
    if out.isatty() and values.type_of(value) == "Table":
        from conch.cli.render import print_value

        print_value(value)
        return
    text = values.render(value)
    out.write(text if text.endswith("\n") else text + "\n")
    out.flush()


def run_source(source: str, args: Sequence[str], filename: str | None = None) -> int:
    """Run a program as the shell does (workspace = the whole machine, every effect allowed,
    the shell's host for models and agents) and print its result; returns the exit status."""
    from conch.lang import run
    from conch.lang.context import Context
    from conch.lang.errors import ConchError, from_python

    try:
        value = run(source, context=Context(host=_ShellHost()), variables={"args": list(args)})
        _write_result(value)
    except ConchError as err:
        return _report(err, source, filename)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return EXIT_INTERRUPTED
    except RecursionError as exc:
        return _report(from_python(exc), source, filename)
    except BrokenPipeError:
        # `conch -c ... | head` closing the pipe early is not an error
        _silence_stdout()
        return EXIT_OK
    return EXIT_OK


class _ShellHost:
    """The shell's host (:func:`conch.host.shell_host`), made when a program first asks for
    a model or an agent: ``conch -c '1 + 1'`` does not import it."""

    __slots__ = ("_host",)

    def __init__(self) -> None:
        self._host: Any = None

    def _get(self) -> Any:
        if self._host is None:
            from conch.host import shell_host

            self._host = shell_host()
        return self._host

    def chat(self, body: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        return self._get().chat(body, deadline)  # type: ignore[no-any-return]

    def embed(self, body: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        return self._get().embed(body, deadline)  # type: ignore[no-any-return]

    def run_agent(self, **request: Any) -> dict[str, Any]:
        return self._get().run_agent(**request)  # type: ignore[no-any-return]


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


def _report(err: Any, source: str, filename: str | None) -> int:
    text = err.render(source)
    if filename:
        text = f"{filename}: {text}"
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
    return EXIT_SYNTAX if err.kind == "SyntaxError" else EXIT_ERROR


def run_file(path: str, args: Sequence[str]) -> int:
    try:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
    except OSError as exc:
        sys.stderr.write(f"conch: cannot read {path}: {exc.strerror or exc}\n")
        return EXIT_ERROR
    return run_source(source, args, filename=path)
