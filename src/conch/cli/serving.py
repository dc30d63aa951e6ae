"""What the commands that run a server share (``conch serve``, ``conch models serve``,
``conch up``): their options, the agent server's start-up check and uvicorn's settings."""

from __future__ import annotations

from typing import Annotated, Any

import typer

HostOpt = Annotated[
    str | None,
    typer.Option(help="Address to bind (default 127.0.0.1; another address needs an API key)."),
]
AgentPortOpt = Annotated[int | None, typer.Option(help="Agent server port (default 3000).")]
ModelsPortOpt = Annotated[int | None, typer.Option(help="Inference server port (default 8080).")]


def agent_app(settings: Any) -> Any:
    """The agent server's app; exit 2 with the reason when the settings are unsafe (a
    non-loopback address without an API key)."""
    from conch.web.agent.app import ConfigurationError, create_app

    try:
        return create_app(settings)
    except ConfigurationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)


def uvicorn_options(settings: Any, host: str, port: int) -> dict[str, Any]:
    """``uvicorn.run``'s (and ``uvicorn.Config``'s) arguments for a server on ``host:port``."""
    return {"host": host, "port": port, "log_level": "info", "access_log": settings.access_log}
