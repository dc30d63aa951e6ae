"""``conch serve``: the agent and code-execution server (default 127.0.0.1:3000)."""

from __future__ import annotations

from typing import Annotated

import typer


def serve(
    host: Annotated[
        str | None, typer.Option(help="Address to bind (default 127.0.0.1; others need an API key).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 3000).")] = None,
    workers: Annotated[
        int | None, typer.Option(help="Sandbox worker processes that run programs (default 2).")
    ] = None,
    config: Annotated[str | None, typer.Option(help="Path of conch.toml.")] = None,
) -> None:
    """Run the agent and code-execution server."""
    import uvicorn

    from conch.config import load_settings
    from conch.web.agent.app import ConfigurationError, create_app

    settings = load_settings(config, host=host, port=port, workers=workers)
    try:
        app = create_app(settings)
    except ConfigurationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    typer.echo(
        f"conch agent server on http://{settings.host}:{settings.port} "
        f"(workspace {settings.workspace_dir}, {settings.workers} sandbox workers)"
    )
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=settings.access_log,
        timeout_graceful_shutdown=5,
    )
