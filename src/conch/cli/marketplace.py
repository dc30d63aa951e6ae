"""``conch marketplace``: search, list, install, uninstall and publish agents on the running
agent server; ``conch mcp``: conch's tools and agents for an MCP client, over stdio.

The marketplace commands speak to the agent server's HTTP API (``--url``, default the
configured ``host``/``port``, with the configured ``api_key``), so what they do is what the
server does; ``--json`` prints the server's answer as it is.
"""

from __future__ import annotations

import contextlib
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from conch.cli.remote import JsonOpt, UrlOpt, echo_json, request

app = typer.Typer(help="Find, install and publish agents.", no_args_is_help=True)

SpecArg = Annotated[str, typer.Argument(help="NAME or NAME@VERSION or NAME@RANGE (^1.2, ~1.2.3).")]
NameArg = Annotated[str, typer.Argument(help="The agent's name.")]


def _call(
    url: str | None,
    as_json: bool,
    show: Callable[[Any, dict[str, str]], None],
    method: str,
    path: str,
    **kw: Any,
) -> None:
    """``method path`` on the marketplace API; the answer printed as it is with ``--json``,
    else by ``show`` (given the answer and the response headers)."""
    data, headers = request(url, method, "/api/v1/marketplace" + path, **kw)
    if as_json:
        echo_json(data)
    else:
        show(data, headers)


def _table(rows: list[dict[str, Any]], notes: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("NAME", "VERSION", "CATEGORY", "INSTALLED", "ORIGIN", "DESCRIPTION")
    for r in rows:
        installed = r.get("installed_version") or ""
        table.add_row(
            r["name"],
            r["version"],
            r.get("category") or "",
            installed,
            r.get("origin") or "local",
            (r.get("description") or "")[:60],
        )
    console = Console()
    console.print(table)
    for note in notes:
        console.print(f"note: {note}", style="yellow")


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="Search text (empty: everything).")] = "",
    category: Annotated[str | None, typer.Option(help="Only this category.")] = None,
    limit: Annotated[int, typer.Option(help="Results per page (1-100).")] = 20,
    offset: Annotated[int, typer.Option(help="Results to skip.")] = 0,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Search agents: the exact name first, then by relevance."""
    params: dict[str, Any] = {"q": query, "limit": limit, "offset": offset}
    if category:
        params["category"] = category

    def show(data: Any, _headers: dict[str, str]) -> None:
        _table(data["results"], data.get("notes", []))
        typer.echo(f"{len(data['results'])} of {data['total']}")

    _call(url, as_json, show, "GET", "/search", params=params)


@app.command("list")
def list_(url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """Every agent (latest version), and which are installed."""

    def show(data: Any, headers: dict[str, str]) -> None:
        note = headers.get("x-conch-upstream-note")
        _table(data, [note] if note else [])

    _call(url, as_json, show, "GET", "/agents")


@app.command()
def install(spec: SpecArg, url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """Install an agent (the highest version matching the range; default latest)."""
    name, _, version = spec.partition("@")
    body: dict[str, Any] = {"name": name}
    if version:
        body["version"] = version

    def show(data: Any, _headers: dict[str, str]) -> None:
        verb = "installed" if data.get("changed", True) else "already installed:"
        typer.echo(f"{verb} {data['name']}@{data['version']} ({data['digest']})")

    _call(url, as_json, show, "POST", "/install", json=body)


@app.command()
def uninstall(name: NameArg, url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """Uninstall an agent."""
    _call(url, as_json, lambda data, _: typer.echo(f"uninstalled {data['name']}@{data['version']}"),
          "POST", "/uninstall", json={"name": name})


@app.command()
def publish(
    file: Annotated[Path, typer.Argument(help="The agent's manifest (TOML).", exists=True)],
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Publish an agent from a TOML manifest (name, description, system_prompt, tools, model;
    optional version, category, tags, author)."""
    try:
        body = tomllib.loads(file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        typer.echo(f"error: {file}: {exc}", err=True)
        raise typer.Exit(1) from None
    _call(url, as_json,
          lambda data, _: typer.echo(f"published {data['name']}@{data['version']} ({data['digest']})"),
          "POST", "/publish", json=body)


mcp_app = typer.Typer(help="Serve conch's tools and agents to an MCP client over stdio.")


@mcp_app.command("mcp")
def mcp_command() -> None:
    """Serve conch's tools and agents to an MCP client over stdio (stdin/stdout)."""
    import anyio

    from conch.config import load_settings

    settings = load_settings()
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(_serve_stdio, settings)
    sys.exit(0)


async def _serve_stdio(settings: Any) -> None:
    from mcp.server.stdio import stdio_server

    from conch.lang.builtins.registry import load_all
    from conch.marketplace.catalogue import CATALOGUE
    from conch.marketplace.service import MarketplaceService
    from conch.marketplace.sink import RegistrySink
    from conch.mcp_server import ConchMCP, OrchestratorRunner
    from conch.orchestration.executor import make_executor
    from conch.orchestration.service import Orchestrator
    from conch.sandbox.pool import SandboxPool
    from conch.sessions.runtime import SessionRuntime
    from conch.sessions.service import SessionService
    from conch.sessions.tasks import TaskSessions
    from conch.worker_process import run_on_dask_worker

    load_all()
    settings.ensure_dirs()
    service = MarketplaceService.from_settings(settings)
    service.seed(CATALOGUE)
    pool = SandboxPool(settings)
    # The client's session (one client: the process), paused when it goes.
    sessions = SessionRuntime(SessionService.from_settings(settings), pool)
    orchestrator = Orchestrator(settings, make_executor(settings, pool, dask_job=run_on_dask_worker),
                                sessions=TaskSessions(sessions))
    pool.recorder = orchestrator.record_builtin
    service.attach_sink(RegistrySink(orchestrator.agents))
    await pool.start()
    await sessions.start()
    await orchestrator.start()
    try:
        server = ConchMCP(
            settings=settings,
            run_job=pool.run,
            installed=service.installed,
            run_agent=OrchestratorRunner(orchestrator),
            sessions=sessions,
        )
        async with stdio_server() as (read, write):
            await server.server.run(read, write, server.server.create_initialization_options())
    finally:
        await orchestrator.close()
        await sessions.close()
        await pool.close()
