"""The ``conch`` command.

``conch -c CODE`` and ``conch run FILE [ARGS...]`` take a fast path that imports only the
language (no typer, rich or prompt_toolkit), because a shell command is started often and its
cold start is what people feel. Everything else goes through a typer app built on demand.

Exit status: 0 on success, 1 on a conch error (rendered with a caret on stderr), 2 on a
syntax error (and on a usage error, as typer does), 130 on Ctrl-C.

The typer app (everything but the fast path) is in :mod:`conch.cli.app`.
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

_USAGE = """\
usage: conch                          start the interactive shell
       conch -c CODE [ARGS...]        run one program and print its result
       conch run FILE [ARGS...]       run a script (ARGS are bound to `args`)
       conch [--config PATH] COMMAND  see `conch --help`
"""


# -- fast path ---------------------------------------------------------------------------


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
    """Run a program as the shell does (workspace = the whole machine, every effect allowed)
    and print its result; returns the exit status."""
    from conch.lang import run
    from conch.lang.errors import ConchError, from_python

    try:
        value = run(source, variables={"args": list(args)})
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


def _split_global(argv: list[str]) -> tuple[str | None, list[str]]:
    """Take a leading ``--config PATH`` (or ``--config=PATH``) off the arguments."""
    config = None
    rest = list(argv)
    while rest:
        if rest[0] == "--config" and len(rest) > 1:
            config = rest[1]
            rest = rest[2:]
        elif rest[0].startswith("--config="):
            config = rest[0].split("=", 1)[1]
            rest = rest[1:]
        else:
            break
    return config, rest


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    config, rest = _split_global(args)
    if config:
        # Settings are loaded lazily by whatever needs them; the variable reaches them all.
        os.environ["CONCH_CONFIG"] = os.path.abspath(config)
    if rest and rest[0] == "-c":
        if len(rest) < 2:
            sys.stderr.write("conch: -c needs an argument\n" + _USAGE)
            raise SystemExit(EXIT_SYNTAX)
        raise SystemExit(run_source(rest[1], rest[2:]))
    if len(rest) >= 2 and rest[0] == "run" and not rest[1].startswith("-"):
        raise SystemExit(run_file(rest[1], rest[2:]))
    if not rest:
        from conch.cli.repl import run_repl

        raise SystemExit(run_repl(config))
    from conch.cli.app import build_app

    app = build_app()
    app(args=args, prog_name="conch")


if __name__ == "__main__":  # pragma: no cover
    main()
