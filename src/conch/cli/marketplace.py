"""``conch marketplace``: search, list, install, uninstall and publish agents on the running
agent server; ``conch mcp``: conch's tools and agents for an MCP client, over stdio.

The marketplace commands speak to the agent server's HTTP API (``--url``, default the
configured ``host``/``port``, with the configured ``api_key``), so what they do is what the
server does; ``--json`` prints the server's answer as it is.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="Find, install and publish agents.", no_args_is_help=True)

UrlOpt = Annotated[
    str | None, typer.Option("--url", help="Agent server URL (default: from the configuration).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the server's JSON answer.")]


def _client(url: str | None) -> Any:
    import httpx

    from conch.config import load_settings

    settings = load_settings()
    base = url or f"http://{settings.host}:{settings.port}"
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    return httpx.Client(base_url=base.rstrip("/"), headers=headers, timeout=30)


def _request(url: str | None, method: str, path: str, **kw: Any) -> tuple[Any, dict[str, str]]:
    import httpx

    with _client(url) as c:
        try:
            r = c.request(method, "/api/v1/marketplace" + path, **kw)
        except httpx.HTTPError as exc:
            typer.echo(f"error: cannot reach the agent server at {c.base_url}: {exc}", err=True)
            typer.echo("hint: start it with `conch serve`, or pass --url", err=True)
            raise typer.Exit(2) from None
    try:
        data = r.json()
    except ValueError:
        data = {"success": False, "error": {"kind": "Error", "message": r.text}}
    if r.status_code >= 400:
        err = data.get("error", {}) if isinstance(data, dict) else {}
        where = f" ({err['field']})" if err.get("field") else ""
        typer.echo(
            f"error {r.status_code}: {err.get('kind', 'Error')}: {err.get('message', r.text)}{where}",
            err=True,
        )
        raise typer.Exit(1)
    return data, dict(r.headers)


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
    data, _ = _request(url, "GET", "/search", params=params)
    if as_json:
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    _table(data["results"], data.get("notes", []))
    typer.echo(f"{len(data['results'])} of {data['total']}")


@app.command("list")
def list_(url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """Every agent (latest version), and which are installed."""
    data, headers = _request(url, "GET", "/agents")
    if as_json:
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    note = headers.get("x-conch-upstream-note")
    _table(data, [note] if note else [])


@app.command()
def install(
    spec: Annotated[str, typer.Argument(help="NAME or NAME@VERSION or NAME@RANGE (^1.2, ~1.2.3).")],
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Install an agent (the highest version matching the range; default latest)."""
    name, _, version = spec.partition("@")
    body: dict[str, Any] = {"name": name}
    if version:
        body["version"] = version
    data, _ = _request(url, "POST", "/install", json=body)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    verb = "installed" if data.get("changed", True) else "already installed:"
    typer.echo(f"{verb} {data['name']}@{data['version']} ({data['digest']})")


@app.command()
def uninstall(
    name: Annotated[str, typer.Argument(help="The agent's name.")],
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Uninstall an agent."""
    data, _ = _request(url, "POST", "/uninstall", json={"name": name})
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(f"uninstalled {data['name']}@{data['version']}")


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
    data, _ = _request(url, "POST", "/publish", json=body)
    if as_json:
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    typer.echo(f"published {data['name']}@{data['version']} ({data['digest']})")


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

    from conch.agents.sandbox import SandboxPool
    from conch.lang.builtins.registry import load_all
    from conch.marketplace.catalogue import CATALOGUE
    from conch.marketplace.service import MarketplaceService
    from conch.marketplace.sink import RegistrySink
    from conch.mcp_server import ConchMCP, OrchestratorRunner
    from conch.orchestration.executor import make_executor
    from conch.orchestration.service import Orchestrator

    load_all()
    settings.ensure_dirs()
    service = MarketplaceService.from_settings(settings)
    service.seed(CATALOGUE)
    pool = SandboxPool(settings)
    orchestrator = Orchestrator(settings, make_executor(settings, pool))
    service.attach_sink(RegistrySink(orchestrator.agents))
    await pool.start()
    await orchestrator.start()
    try:
        server = ConchMCP(
            settings=settings,
            run_job=pool.run,
            installed=service.installed,
            run_agent=OrchestratorRunner(orchestrator),
        )
        async with stdio_server() as (read, write):
            await server.server.run(read, write, server.server.create_initialization_options())
    finally:
        await orchestrator.close()
        await pool.close()
