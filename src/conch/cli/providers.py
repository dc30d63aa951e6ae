"""``conch providers``: the configured model providers and a real round trip to each.

Like ``conch models list`` this reads the configuration directly and asks the providers
itself, so it works whether or not a server is running.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer

app = typer.Typer(help="Model providers: local, ollama, openai, anthropic and configured endpoints.",
                  no_args_is_help=True)


async def _with_registry(work: Any) -> Any:
    from conch.config import load_settings
    from conch.inference.remote.registry import ProviderRegistry

    settings = load_settings()

    async def local_models() -> list[str]:
        from conch.inference.models.store import ModelStore

        records = await asyncio.to_thread(ModelStore(settings).list)
        return [r.id for r in records if r.status == "ready"]

    registry = ProviderRegistry(settings, local_models=local_models)
    try:
        return await work(registry)
    finally:
        await registry.close()


@app.command("list")
def list_(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the providers with their status (each probed now, briefly)."""

    async def work(registry: Any) -> list[dict[str, Any]]:
        await registry.probe_all()
        return list(registry.listing())

    rows = asyncio.run(_with_registry(work))
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "status", "url")
    for row in rows:
        table.add_row(row["id"], row["status"], row.get("url") or "")
    Console().print(table)


@app.command()
def validate(
    provider_id: Annotated[str, typer.Argument(metavar="ID", help="A provider id (`conch providers list`).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Check a provider with a real round trip (listing its models). Exit status 1 when it
    is not valid, 2 when no such provider is configured."""
    from conch.inference.remote.errors import UnknownProvider

    async def work(registry: Any) -> dict[str, Any]:
        return dict(await registry.validate(provider_id))

    try:
        result = asyncio.run(_with_registry(work))
    except UnknownProvider as exc:
        if as_json:
            typer.echo(json.dumps({"provider": provider_id, "error": str(exc)}))
        else:
            typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    elif result["valid"]:
        typer.echo(f"{provider_id}: valid ({result['models_available']} models, {result['latency_ms']} ms)")
    else:
        typer.echo(f"{provider_id}: not valid: {result.get('error')}")
    if not result["valid"]:
        raise typer.Exit(1)
