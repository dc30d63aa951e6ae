"""``conch keys create|list|show|update|rotate|revoke|usage``: API keys, on the database.

These commands work on the configured database directly (``database_url``, or the SQLite
file in the data directory) rather than through a running server: both servers read their
keys from it (a change applies on every server within a second), no server needs to be up,
and the first key of an install can be made before any admin key exists. Whoever can open
the database is its admin already; each change goes to the audit log as made by ``cli``
(with the user's name). Every command takes ``--json``.
"""

from __future__ import annotations

import getpass
import json
from typing import Annotated, Any

import typer

from conch.cli.remote import JsonOpt, echo_json

app = typer.Typer(help="API keys: scopes, tenants, limits (on the configured database).",
                  no_args_is_help=True)

KEY_COLUMNS = ["id", "name", "tenant", "scopes", "prefix", "status", "limits", "models", "expires_at"]
USAGE_COLUMNS = ["limit", "max", "used", "remaining", "resets_at"]

ScopeOpt = Annotated[
    list[str] | None,
    typer.Option("--scope", "-s", help="A scope (repeat): inference, models:write, execute, "
                 "sessions, orchestration, approve, marketplace:publish, admin."),
]
LimitOpt = Annotated[
    list[str] | None,
    typer.Option("--limit", "-l", help="NAME=VALUE (repeat), e.g. tokens_per_day=100000; "
                 "NAME=null removes a limit (update)."),
]
ModelOpt = Annotated[
    list[str] | None,
    typer.Option("--model", "-m", help="A model the key may use (repeat; * wildcards, e.g. "
                 "local:*). Without any: every model."),
]
ExpiresOpt = Annotated[
    str | None, typer.Option("--expires-at", help="ISO-8601 time or Unix seconds ('never' on update).")
]


def _services() -> tuple[Any, Any]:
    """The key service and limiter of the configured database."""
    from conch import db
    from conch.config import load_settings
    from conch.keys import AuditLog, KeyService, Limiter

    settings = load_settings()
    engine = db.engine_for(settings.effective_database_url)
    return KeyService.from_settings(engine, settings, audit=AuditLog(engine)), Limiter(engine)


def _actor() -> Any:
    from conch.keys import Principal

    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment
        user = "unknown"
    return Principal(key_id="cli", name=f"cli ({user})"[:100], tenant=None,
                     scopes=frozenset({"admin"}), configured=True)  # fmt: skip


def _domain(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call the keys room; its refusal (a bad field, no such key) is exit 1 with the message."""
    from conch.errors import DomainError

    try:
        return fn(*args, **kwargs)
    except DomainError as exc:
        where = f" ({exc.where})" if exc.where else ""
        typer.echo(f"error {exc.status}: {exc.message}{where}", err=True)
        raise typer.Exit(1) from None


def _limits(items: list[str] | None) -> dict[str, Any] | None:
    if not items:
        return None
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            typer.echo(f"error: --limit {item!r}: expected NAME=VALUE", err=True)
            raise typer.Exit(2)
        try:
            out[name.strip()] = json.loads(value)
        except ValueError:
            typer.echo(f"error: --limit {item!r}: the value must be a number or null", err=True)
            raise typer.Exit(2) from None
    return out


def _print(rows: Any, as_json: bool, columns: list[str]) -> None:
    if as_json:
        echo_json(rows)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", box=None)
    for col in columns:
        table.add_column(col)
    for row in rows if isinstance(rows, list) else [rows]:
        table.add_row(*(_cell(row.get(col)) for col in columns))
    Console().print(table)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _issued(issued: Any, as_json: bool) -> None:
    data = issued.to_dict()
    if as_json:
        echo_json(data)
        return
    _print(data, False, KEY_COLUMNS)
    typer.echo(f"\nsecret: {issued.secret}")
    typer.echo("(shown this once: only its hash is kept)", err=True)


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="A name to tell the key by (1-100 characters).")],
    scope: ScopeOpt = None,
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="Whose things the key makes and sees.")] = None,
    limit: LimitOpt = None,
    model: ModelOpt = None,
    expires_at: ExpiresOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a key; its secret is printed once."""
    keys, _ = _services()
    issued = _domain(
        keys.create, name=name, scopes=scope or [], tenant=tenant, limits=_limits(limit),
        models=model, expires_at=expires_at, actor=_actor(),
    )  # fmt: skip
    _issued(issued, as_json)


@app.command("list")
def list_keys(
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="Only this tenant's keys.")] = None,
    active: Annotated[bool, typer.Option("--active", help="Leave revoked keys out.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Every key, oldest first (never a secret)."""
    keys, _ = _services()
    kwargs: dict[str, Any] = {"include_revoked": not active, "limit": 500}
    if tenant is not None:
        kwargs["tenant"] = tenant
    _print([r.to_dict() for r in _domain(keys.list, **kwargs)], as_json, KEY_COLUMNS)


@app.command("show")
def show(key_id: Annotated[str, typer.Argument(help="The key's id.")], as_json: JsonOpt = False) -> None:
    """One key."""
    keys, _ = _services()
    _print(_domain(keys.get, key_id).to_dict(), as_json, KEY_COLUMNS)


@app.command("update")
def update(
    key_id: Annotated[str, typer.Argument(help="The key's id.")],
    name: Annotated[str | None, typer.Option("--name", help="A new name.")] = None,
    scope: ScopeOpt = None,
    limit: LimitOpt = None,
    model: ModelOpt = None,
    all_models: Annotated[bool, typer.Option("--all-models", help="Allow every model again.")] = False,
    expires_at: ExpiresOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a key's name, scopes (all of them), limits (merged: NAME=null removes one),
    models or expiry; every server applies it within a second."""
    changes: dict[str, Any] = {}
    if name is not None:
        changes["name"] = name
    if scope:
        changes["scopes"] = scope
    if limit:
        changes["limits"] = _limits(limit)
    if all_models:
        changes["models"] = None
    elif model:
        changes["models"] = model
    if expires_at is not None:
        changes["expires_at"] = None if expires_at == "never" else expires_at
    if not changes:
        typer.echo("error: nothing to change (see --help)", err=True)
        raise typer.Exit(2)
    keys, _ = _services()
    _print(_domain(keys.patch, key_id, changes, actor=_actor()).to_dict(), as_json, KEY_COLUMNS)


@app.command("rotate")
def rotate(key_id: Annotated[str, typer.Argument(help="The key's id.")], as_json: JsonOpt = False) -> None:
    """A new secret for the key (printed once); the old one stops working. Its limits and
    usage stay."""
    keys, _ = _services()
    _issued(_domain(keys.rotate, key_id, actor=_actor()), as_json)


@app.command("revoke")
def revoke(key_id: Annotated[str, typer.Argument(help="The key's id.")], as_json: JsonOpt = False) -> None:
    """Revoke the key for good; every server refuses it within a second."""
    keys, _ = _services()
    _print(_domain(keys.revoke, key_id, actor=_actor()).to_dict(), as_json, KEY_COLUMNS)


@app.command("usage")
def usage(key_id: Annotated[str, typer.Argument(help="The key's id.")], as_json: JsonOpt = False) -> None:
    """The key's use of each of its limits: max, used, remaining, when it resets."""
    keys, limiter = _services()
    principal = _domain(keys.get, key_id).principal()
    rows = [u.to_dict() for u in limiter.usage(principal)]
    if as_json:
        echo_json({"key": {"id": principal.key_id, "name": principal.name, "tenant": principal.tenant},
                   "limits": rows})  # fmt: skip
        return
    if not rows:
        typer.echo(f"key {key_id} has no limits")
        return
    _print(rows, False, USAGE_COLUMNS)
