"""What the commands that speak to a running agent server share (``conch marketplace``,
``conch tasks``, ``conch workflows``): the ``--url`` and ``--json`` options, and one request
that turns every failure into a message on stderr and an exit code.

The server is ``--url`` (default ``http://<host>:<port>`` from the configuration) and the
configured ``api_key`` (else ``admin_key``) is sent as a bearer token.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

UrlOpt = Annotated[
    str | None, typer.Option("--url", help="Agent server URL (default: from the configuration).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the server's JSON answer.")]


def request(
    url: str | None, method: str, path: str, timeout: float = 30, **kw: Any
) -> tuple[Any, dict[str, str]]:
    """The JSON answer and the headers of ``method path`` on the agent server. A server that
    cannot be reached exits with 2, an error answer (status 400 or more) with 1."""
    import httpx

    from conch.config import load_settings

    settings = load_settings()
    base = (url or f"http://{settings.host}:{settings.port}").rstrip("/")
    key = settings.api_key or settings.admin_key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=timeout) as c:
            r = c.request(method, path, **kw)
    except httpx.HTTPError as exc:
        typer.echo(f"error: cannot reach the agent server at {base}: {exc}", err=True)
        typer.echo("hint: start it with `conch serve`, or pass --url", err=True)
        raise typer.Exit(2) from None
    try:
        data = r.json()
    except ValueError:
        data = {"success": False, "error": {"kind": "Error", "message": r.text}}
    if r.status_code >= 400:
        err = data.get("error", {}) if isinstance(data, dict) else {}
        field = err.get("field") or err.get("where")
        where = f" ({field})" if field else ""
        typer.echo(
            f"error {r.status_code}: {err.get('kind', 'Error')}: {err.get('message', r.text)}{where}",
            err=True,
        )
        raise typer.Exit(1)
    return data, dict(r.headers)


def echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
