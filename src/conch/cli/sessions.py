"""``conch sessions`` and ``conch files``: a running agent server's sessions and their files.

    conch sessions list [--status active|paused]
    conch sessions show SESSION          the session, its bindings and the files at its root
    conch sessions rm SESSION...
    conch files ls SESSION [DIR]
    conch files put SESSION LOCAL [PATH] upload a file (PATH: where, default its name)
    conch files get SESSION PATH [LOCAL] download a file (LOCAL: default its name; - stdout)

The server is ``--url`` (default ``http://<host>:<port>`` from the configuration) and the
configured ``api_key`` is sent as a bearer token (:mod:`conch.cli.remote`). Every command
takes ``--json``; ``files get`` streams the file to disk.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from conch.cli.remote import JsonOpt, UrlOpt, echo_json, request

API = "/api/v1/sessions"

sessions_app = typer.Typer(help="Sessions on the agent server.", no_args_is_help=True)
files_app = typer.Typer(help="Files of a session on the agent server.", no_args_is_help=True)

SESSION_COLUMNS = ["id", "status", "runs", "workspace_bytes", "last_used_at", "expires_at"]
FILE_COLUMNS = ["name", "type", "size", "modified"]


def register(app: typer.Typer) -> None:
    app.add_typer(sessions_app, name="sessions")
    app.add_typer(files_app, name="files")


def _table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", box=None)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    Console().print(table)


def _path(path: str) -> str:
    return quote(path.lstrip("/"), safe="/")


# -- sessions -------------------------------------------------------------------------------


@sessions_app.command("list")
def sessions_list(
    status: Annotated[str | None, typer.Option(help="Only active or only paused ones.")] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The sessions, newest first."""
    params = {"status": status} if status else {}
    data, _ = request(url, "GET", API, params=params)
    if as_json:
        echo_json(data)
    else:
        _table(data, SESSION_COLUMNS)


@sessions_app.command("show")
def sessions_show(
    session: Annotated[str, typer.Argument(help="The session's id.")],
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A session: its state, its bindings, the files at its root."""
    data, _ = request(url, "GET", f"{API}/{session}")
    if as_json:
        echo_json(data)
        return
    _table([data], SESSION_COLUMNS)
    if data.get("bindings"):
        typer.echo("")
        _table(data["bindings"], ["name", "type"])
    if data.get("files"):
        typer.echo("")
        _table(data["files"], FILE_COLUMNS)


@sessions_app.command("rm")
def sessions_rm(
    sessions: Annotated[list[str], typer.Argument(help="The sessions' ids.")],
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete sessions: their files and saved bindings go with them."""
    answers = [request(url, "DELETE", f"{API}/{s}")[0] for s in sessions]
    if as_json:
        echo_json(answers)
    else:
        for answer in answers:
            typer.echo(f"deleted {answer['id']}")


# -- files ----------------------------------------------------------------------------------


@files_app.command("ls")
def files_ls(
    session: Annotated[str, typer.Argument(help="The session's id.")],
    dir: Annotated[str, typer.Argument(help="A directory of its workspace.")] = ".",
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The entries of a directory of the session's workspace."""
    data, _ = request(url, "GET", f"{API}/{session}/files", params={"dir": dir})
    if as_json:
        echo_json(data)
    else:
        _table(data, FILE_COLUMNS)


@files_app.command("put")
def files_put(
    session: Annotated[str, typer.Argument(help="The session's id.")],
    local: Annotated[Path, typer.Argument(help="The file to upload.", exists=True,
                                          dir_okay=False, readable=True)],
    path: Annotated[str | None, typer.Argument(help="Where in the workspace (default: the "
                                               "file's name).")] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Upload a file into the session's workspace (missing directories are made)."""
    target = path or local.name
    with local.open("rb") as fh:
        data, _ = request(url, "PUT", f"{API}/{session}/files/{_path(target)}", timeout=600,
                          content=fh)
    if as_json:
        echo_json(data)
    else:
        typer.echo(f"{data['name']}: {data['size']} bytes")


@files_app.command("get")
def files_get(
    session: Annotated[str, typer.Argument(help="The session's id.")],
    path: Annotated[str, typer.Argument(help="The file in the workspace.")],
    local: Annotated[str | None, typer.Argument(help="Where to write it (default: its name "
                                                "here; - for stdout).")] = None,
    url: UrlOpt = None,
) -> None:
    """Download a file of the session's workspace."""
    import httpx

    from conch.config import load_settings

    settings = load_settings()
    base = (url or f"http://{settings.host}:{settings.port}").rstrip("/")
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    target = local or Path(path).name
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=600) as c, \
                c.stream("GET", f"{API}/{session}/files/{_path(path)}") as r:
            if r.status_code >= 400:
                r.read()
                # The error answer, as every remote command reports it.
                request(url, "GET", f"{API}/{session}/files/{_path(path)}")
                raise typer.Exit(1)
            if target == "-":
                for chunk in r.iter_bytes():
                    sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                return
            written = 0
            with open(target, "wb") as out:
                for chunk in r.iter_bytes():
                    out.write(chunk)
                    written += len(chunk)
    except httpx.HTTPError as exc:
        typer.echo(f"error: cannot reach the agent server at {base}: {exc}", err=True)
        typer.echo("hint: start it with `conch serve`, or pass --url", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{target}: {written} bytes", err=True)
