"""``conch up``: the agent server (3000) and the inference server (8080) in one process.

Two uvicorn ``Server`` objects share one asyncio loop; when either stops (or Ctrl-C), both
shut down.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import typer

from conch.cli.serving import (
    AgentPortOpt,
    HostOpt,
    ModelsPortOpt,
    agent_app,
    inference_app,
    uvicorn_options,
)


async def _serve_both(servers: list[Any]) -> None:
    tasks = [asyncio.create_task(s.serve()) for s in servers]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for s in servers:
        s.should_exit = True
    await asyncio.gather(*pending, return_exceptions=True)
    for t in done:
        if t.exception() is not None:
            raise t.exception()  # type: ignore[misc]


def up(host: HostOpt = None, port: AgentPortOpt = None, models_port: ModelsPortOpt = None) -> None:
    """Run the agent server and the inference server together."""
    import uvicorn

    from conch.config import load_settings

    settings = load_settings(host=host, port=port, models_host=host, models_port=models_port)
    if "models_url" not in settings.model_fields_set:
        # The agent server's programs reach models through this inference server.
        reach = "127.0.0.1" if settings.models_host in ("0.0.0.0", "::", "") else settings.models_host
        settings = settings.model_copy(update={"models_url": f"http://{reach}:{settings.models_port}/v1"})
    agent = agent_app(settings)
    inference = inference_app(settings)
    servers = [
        uvicorn.Server(uvicorn.Config(agent, **uvicorn_options(settings, settings.host, settings.port))),
        uvicorn.Server(
            uvicorn.Config(
                inference, **uvicorn_options(settings, settings.models_host, settings.models_port)
            )
        ),
    ]
    typer.echo(
        f"conch agent server on http://{settings.host}:{settings.port}, "
        f"inference server on http://{settings.models_host}:{settings.models_port}/v1"
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_both(servers))
