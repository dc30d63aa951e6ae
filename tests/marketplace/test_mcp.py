"""MCP: the official ``mcp`` client over streamable HTTP (``/mcp``) and stdio (``conch mcp``)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from conch.lang.builtins.registry import lookup
from conch.sandbox.jobs import allowed_effects
from tests.web.agent_fixtures import AgentServer

SRC = str(Path(__file__).resolve().parents[2] / "src")


def run(target: Any, body: Callable[[Client], Awaitable[Any]], **kw: Any) -> Any:
    async def go() -> Any:
        async with Client(target, **kw) as client:
            return await body(client)

    return asyncio.run(go())


def text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def tour(client: Client) -> dict[str, Any]:
    """Everything a client does first: tools, a program, a builtin, refusals, resources."""
    tools = await client.list_tools()
    ok = await client.call_tool("execute", {"command": "1 + 1"})
    table = await client.call_tool("execute", {"command": "[{a: 1}, {a: 2}] | .a | sum"})
    builtin = await client.call_tool("len", {"value": [1, 2, 3]})
    refused = await client.call_tool("execute", {"command": 'cat("/etc/passwd")'})
    syntax = await client.call_tool("execute", {"command": "1 +"})
    bad_arg = await client.call_tool("len", {"value": 5})
    unknown = await client.call_tool("no_such_tool", {})
    resources = await client.list_resources()
    builtins = await client.read_resource("conch://builtins")
    docs = await client.read_resource("conch://docs/language")
    return locals()


def check_tour(out: dict[str, Any], settings: Any) -> None:
    names = [t.name for t in out["tools"].tools]
    assert names[0] == "execute"
    assert {"len", "cat", "ls", "grep", "from_csv"} <= set(names)
    effects = allowed_effects(settings)
    for name in names[1:]:
        b = lookup(name)
        assert b is not None and b.effect in effects, name
    cat = next(t for t in out["tools"].tools if t.name == "cat")
    assert cat.input_schema["properties"]["path"]["type"] == "string"

    assert out["ok"].is_error is False and text(out["ok"]) == "2"
    assert out["ok"].structured_content["type"] == "Int"
    assert text(out["table"]) == "3"
    assert out["builtin"].is_error is False and text(out["builtin"]) == "3"
    # errors are tool results the model can read, never protocol errors
    assert out["refused"].is_error is True
    assert text(out["refused"]).startswith("PermissionError: ")
    assert out["syntax"].is_error is True and text(out["syntax"]).startswith("SyntaxError: ")
    assert out["bad_arg"].is_error is True and text(out["bad_arg"]).startswith("TypeError: ")
    assert out["unknown"].is_error is True and text(out["unknown"]).startswith("NameError: ")

    uris = {str(r.uri) for r in out["resources"].resources}
    assert {"conch://docs/language", "conch://builtins", "conch://schema"} <= uris
    listed = json.loads(out["builtins"].contents[0].text)
    assert {"name": "len"}.items() <= next(b for b in listed if b["name"] == "len").items()
    assert "conch" in out["docs"].contents[0].text.lower()


def test_streamable_http(server: AgentServer) -> None:
    check_tour(run(server.url + "/mcp", tour), server.settings)


def test_streamable_http_has_the_same_key_and_host_guard(fresh_server: Any) -> None:
    s = fresh_server(api_key="sekrit")
    # the bare protocol: no key → 401 with the agent server's error body
    r = httpx.post(s.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    r = httpx.post(
        s.url + "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"Host": "evil.example", "Authorization": "Bearer sekrit"},
    )
    assert r.status_code == 403
    with pytest.raises(Exception):  # noqa: B017  (the client surfaces the 401 its own way)
        run(s.url + "/mcp", lambda c: c.list_tools())

    async def with_key() -> str:
        http = httpx2.AsyncClient(headers={"Authorization": "Bearer sekrit"}, timeout=30)
        from mcp.client.streamable_http import streamable_http_client

        async with http, streamable_http_client(s.url + "/mcp", http_client=http) as streams:
            from mcp.client.session import ClientSession

            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                return text(await session.call_tool("execute", {"command": "40 + 2"}))

    assert asyncio.run(with_key()) == "42"


def test_stdio(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "CONCH_DATA_DIR": str(tmp_path / "data"),
        "CONCH_CONFIG": str(tmp_path / "none.toml"),
        "CONCH_WORKERS": "1",
    }
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "conch.cli.main", "mcp"], env=env, cwd=str(tmp_path)
    )
    from conch.config import Settings

    check_tour(run(params, tour), Settings(data_dir=tmp_path / "data"))


async def _remember(client: Client) -> dict[str, Any]:
    """Two tool calls of one client: a variable and a file made by the first, read back by
    the second and as a resource."""
    first = await client.call_tool("execute", {"command": 'let x = 41; write("note.txt", "kept")'})
    second = await client.call_tool("execute", {"command": "x + 1"})
    built = await client.call_tool("cat", {"path": "note.txt"})
    resources = await client.list_resources()
    note = await client.read_resource("conch://files/note.txt")
    templates = await client.list_resource_templates()
    return locals()


def _check_remembered(out: dict[str, Any]) -> None:
    assert out["first"].is_error is False, text(out["first"])
    assert text(out["second"]) == "42"
    session = out["first"].structured_content["session"]
    assert session.startswith("sess_") and out["second"].structured_content["session"] == session
    assert text(out["built"]) == "kept"
    uris = {str(r.uri) for r in out["resources"].resources}
    assert "conch://files/note.txt" in uris
    assert out["note"].contents[0].text == "kept"
    assert [t.uri_template for t in out["templates"].resource_templates] == ["conch://files/{path}"]


def test_an_mcp_client_keeps_its_variables_between_calls(server: AgentServer) -> None:
    out = run(server.url + "/mcp", _remember)
    _check_remembered(out)
    # Another client has a session of its own: none of the first one's state.
    other = run(server.url + "/mcp", lambda c: c.call_tool("execute", {"command": "x"}))
    assert other.is_error and text(other).startswith("NameError: ")
    # A client that keeps no cookie names the session itself.
    session = out["first"].structured_content["session"]
    named = run(server.url + "/mcp",
                lambda c: c.call_tool("execute", {"command": "x", "session": session}))
    assert text(named) == "41"


def test_an_mcp_client_keeps_its_variables_over_stdio(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "CONCH_DATA_DIR": str(tmp_path / "data"),
        "CONCH_CONFIG": str(tmp_path / "none.toml"),
        "CONCH_WORKERS": "1",
    }
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "conch.cli.main", "mcp"], env=env, cwd=str(tmp_path)
    )
    _check_remembered(run(params, _remember))
