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
    non-loopback address without an API key) or ask for a strict sandbox this machine
    cannot give."""
    from conch.sandbox.probe import strict_missing
    from conch.web.agent.app import ConfigurationError, create_app

    missing = strict_missing(settings)
    if missing:
        typer.echo(f'error: sandbox = "strict" but this machine lacks: {", ".join(missing)} '
                   '(docs/agent-server.md, "The sandbox\'s layers")', err=True)
        raise typer.Exit(2)

    try:
        return create_app(settings)
    except ConfigurationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)


def inference_app(settings: Any) -> Any:
    """The inference server's app; exit 2 with the reason when the settings are unsafe (a
    non-loopback address without an admin key)."""
    from conch.web.common.security import ConfigurationError
    from conch.web.inference.app import create_app

    try:
        return create_app(settings)
    except ConfigurationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)


def uvicorn_options(settings: Any, host: str, port: int) -> dict[str, Any]:
    """``uvicorn.run``'s (and ``uvicorn.Config``'s) arguments for a server on ``host:port``."""
    return {"host": host, "port": port, "log_level": "info", "access_log": settings.access_log,
            "log_config": _log_config()}


def _log_config() -> dict[str, Any]:
    """uvicorn's own logging, with conch's loggers (the sandbox's layers at start-up,
    orchestration) printed the same way at INFO."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["conch"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config
