"""The ``conch`` command.

``conch -c CODE`` and ``conch run FILE [ARGS...]`` take a fast path that imports only the
language (no typer, rich or prompt_toolkit), because a shell command is started often and its
cold start is what people feel. Everything else goes through a typer app built on demand.

Exit status: 0 on success, 1 on a conch error (rendered with a caret on stderr), 2 on a
syntax error (and on a usage error, as typer does), 130 on Ctrl-C.

The fast path is :mod:`conch.cli.run`; the typer app (everything else) is :mod:`conch.cli.app`.
Neither imports this module, so the entry point is the only way in.
"""

from __future__ import annotations

import os
import sys

from conch.cli.run import EXIT_SYNTAX, run_file, run_source

# typing costs milliseconds of every start-up; the annotations are strings
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import NoReturn

_USAGE = """\
usage: conch                          start the interactive shell
       conch -c CODE [ARGS...]        run one program and print its result
       conch run FILE [ARGS...]       run a script (ARGS are bound to `args`)
       conch [--config PATH] COMMAND  see `conch --help`
"""


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


def _exit_now(status: int) -> NoReturn:
    """End the process as the interpreter would, without its teardown: clearing every module
    and a last garbage collection cost 2-3 ms of a 20 ms ``conch -c '1 + 1'``. What teardown
    does that a program can tell is done first: other threads joined, ``atexit`` handlers run,
    stdout and stderr flushed (files the builtins write are closed by them as they go)."""
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize calls first
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 (contextlib is one more import on the cold-start path)
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`) or stream: nothing to lose
            pass
    os._exit(status)


def entry() -> None:
    """The ``conch`` console script: :func:`main`, and a program run by ``-c`` or ``run`` ends
    the process at once (see :func:`_exit_now`)."""
    main(exit_now=True)


def main(argv: Sequence[str] | None = None, *, exit_now: bool = False) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    config, rest = _split_global(args)
    if config:
        # Settings are loaded lazily by whatever needs them; the variable reaches them all.
        os.environ["CONCH_CONFIG"] = os.path.abspath(config)
    if rest and rest[0] == "-c":
        if len(rest) < 2:
            sys.stderr.write("conch: -c needs an argument\n" + _USAGE)
            raise SystemExit(EXIT_SYNTAX)
        status = run_source(rest[1], rest[2:])
        if exit_now:
            _exit_now(status)
        raise SystemExit(status)
    if len(rest) >= 2 and rest[0] == "run" and not rest[1].startswith("-"):
        status = run_file(rest[1], rest[2:])
        if exit_now:
            _exit_now(status)
        raise SystemExit(status)
    if not rest:
        from conch.cli.repl import run_repl

        raise SystemExit(run_repl(config))
    from conch.cli.app import build_app

    app = build_app()
    app(args=args, prog_name="conch")


if __name__ == "__main__":  # pragma: no cover
    main()
