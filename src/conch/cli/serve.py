"""``conch serve``: the agent and code-execution server (default 127.0.0.1:3000)."""

from __future__ import annotations

from typing import Annotated

import typer

from conch.cli.serving import AgentPortOpt, HostOpt, agent_app, uvicorn_options


def serve(
    host: HostOpt = None,
    port: AgentPortOpt = None,
    workers: Annotated[
        int | None, typer.Option(help="Sandbox worker processes that run programs (default 2).")
    ] = None,
    config: Annotated[str | None, typer.Option(help="Path of conch.toml.")] = None,
) -> None:
    """Run the agent and code-execution server."""
    import uvicorn

    from conch.config import load_settings

    settings = load_settings(config, host=host, port=port, workers=workers)
    app = agent_app(settings)
    typer.echo(
        f"conch agent server on http://{settings.host}:{settings.port} "
        f"(workspace {settings.workspace_dir}, {settings.workers} sandbox workers)"
    )
    uvicorn.run(
        app, **uvicorn_options(settings, settings.host, settings.port), timeout_graceful_shutdown=5
    )
