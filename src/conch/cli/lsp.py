"""``conch lsp``: the language server, on stdin/stdout (see docs/lsp.md)."""

from __future__ import annotations

from typing import Annotated

import typer


def lsp(
    stdio: Annotated[
        bool, typer.Option("--stdio", help="Talk over stdin/stdout (the default and only transport).")
    ] = True,
    log_file: Annotated[
        str | None, typer.Option("--log-file", help="Write the server's log (debug level) here.")
    ] = None,
) -> None:
    """Run the conch Language Server Protocol server over stdio."""
    if log_file:
        import logging

        logging.basicConfig(filename=log_file, level=logging.DEBUG)
    from conch.lsp.server import run_stdio

    run_stdio()
