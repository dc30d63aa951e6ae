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
