"""http_get / http_post / http_request against a loopback server: everything allowed in the
shell; in the agent server off by default, and when enabled private addresses, metadata
addresses and redirects to them refused unless network_allow lists them; bodies capped."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response

from conch.config import Settings
from conch.lang import run
from conch.lang.context import Context
from conch.lang.errors import ConchError
from tests.inference.providers.standins import serve


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/json")
    async def json_() -> Any:
        return JSONResponse({"hello": "world", "n": [1, 2]}, headers={"X-Custom": "yes"})

    @app.get("/text")
    async def text() -> Any:
        return PlainTextResponse("plain words")

    @app.post("/echo")
    async def echo(request: Request) -> Any:
        return {"content_type": request.headers.get("content-type"), "body": (await request.body()).decode(),
                "auth": request.headers.get("authorization")}

    @app.get("/big")
    async def big() -> Any:
        return Response(b"x" * 50_000, media_type="application/octet-stream")

    @app.get("/status/{code}")
    async def status(code: int) -> Any:
        return JSONResponse({"error": "nope"}, status_code=code)

    @app.get("/redirect")
    async def redirect(to: str) -> Any:
        return RedirectResponse(to, status_code=302)

    @app.get("/slow")
    async def slow() -> Any:
        await asyncio.sleep(10)
        return {"late": True}

    return app


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve(_app()) as base:
        yield base


def shell(code: str) -> Any:
    return run(code, context=Context())


def server_ctx(tmp_path: Path, **settings: Any) -> Context:
    return Context(workspace=tmp_path, settings=Settings(data_dir=tmp_path, allow_network=True, **settings))


def test_shell_get_parses_json_and_lowercases_headers(url: str) -> None:
    result = shell(f'http_get("{url}/json")')
    assert result["status"] == 200 and result["body"] == {"hello": "world", "n": [1, 2]}
    assert result["headers"]["x-custom"] == "yes" and "content-type" in result["headers"]
    assert shell(f'http_get("{url}/text").body') == "plain words"
    assert shell(f'http_get("{url}/status/404")') ["status"] == 404  # a status is a result


def test_shell_post_sends_json_or_text_and_headers(url: str) -> None:
    sent = shell(f'http_post("{url}/echo", {{a: 1}}, headers={{authorization: "Bearer t"}}).body')
    assert sent == {"content_type": "application/json", "body": '{"a": 1}', "auth": "Bearer t"}
    sent = shell(f'http_post("{url}/echo", "hi").body')
    assert sent["body"] == "hi" and sent["content_type"].startswith("text/plain")
    assert shell(f'http_request("DELETE", "{url}/json").status') == 405


def test_shell_timeout(url: str) -> None:
    with pytest.raises(ConchError) as err:
        shell(f'http_get("{url}/slow", timeout=0.5)')
    assert err.value.kind == "TimeoutError"


def test_server_refuses_loopback_and_metadata_by_default(url: str, tmp_path: Path) -> None:
    for target in (f"{url}/json", "http://169.254.169.254/latest/meta-data/", "http://[::1]:9/",
                   "http://10.0.0.1/", "http://localhost:9/"):
        with pytest.raises(ConchError) as err:
            run(f'http_get("{target}", timeout=2)', context=server_ctx(tmp_path))
        assert err.value.kind == "PermissionError", target
        assert "network_allow" in (err.value.hint or "")


def test_server_allows_what_network_allow_lists(url: str, tmp_path: Path) -> None:
    for allow in (["127.0.0.1"], ["127.0.0.0/8"], ["localhost"]):
        target = url.replace("127.0.0.1", "localhost") if allow == ["localhost"] else url
        result = run(f'http_get("{target}/json")', context=server_ctx(tmp_path, network_allow=allow))
        assert result["status"] == 200, allow


def test_server_refuses_a_redirect_to_a_private_address(url: str, tmp_path: Path) -> None:
    ctx = server_ctx(tmp_path, network_allow=["localhost"])
    entry = url.replace("127.0.0.1", "localhost")
    with pytest.raises(ConchError) as err:
        run(f'http_get("{entry}/redirect?to=http://127.0.0.2:9/x")', context=ctx)
    assert err.value.kind == "PermissionError" and "127.0.0.2" in err.value.message
    # An allowed redirect is followed.
    ok = run(f'http_get("{entry}/redirect?to={entry}/json")', context=ctx)
    assert ok["body"]["hello"] == "world"


def test_server_cuts_an_oversized_body(url: str, tmp_path: Path) -> None:
    ctx = server_ctx(tmp_path, network_allow=["127.0.0.1"], http_max_bytes=10_000)
    with pytest.raises(ConchError) as err:
        run(f'http_get("{url}/big")', context=ctx)
    assert err.value.kind == "LimitError" and "10000 bytes" in err.value.message


def test_server_timeout_is_capped_by_the_setting(url: str, tmp_path: Path) -> None:
    ctx = server_ctx(tmp_path, network_allow=["127.0.0.1"], http_timeout_s=0.5)
    with pytest.raises(ConchError) as err:
        run(f'http_get("{url}/slow", timeout=60)', context=ctx)
    assert err.value.kind == "TimeoutError"


def test_agent_server_refuses_network_by_default_and_policy_when_enabled(url: str, tmp_path: Path) -> None:
    from tests.web.agent_fixtures import start_agent_server

    code = f'http_get("{url}/json").status'
    off = start_agent_server(tmp_path / "off", workers=1)
    try:
        with off.client() as c:
            body = c.post("/api/v1/eval", json={"code": code}).json()
        assert body["success"] is False and body["error"]["kind"] == "PermissionError"
        assert "network" in body["error"]["message"]
    finally:
        off.stop()
    on = start_agent_server(tmp_path / "on", workers=1, allow_network=True)
    try:
        with on.client() as c:
            body = c.post("/api/v1/eval", json={"code": code}).json()
        assert body["error"]["kind"] == "PermissionError" and "private" in body["error"]["message"]
    finally:
        on.stop()
    allowed = start_agent_server(tmp_path / "allowed", workers=1, allow_network=True, network_allow=["127.0.0.1"])
    try:
        with allowed.client() as c:
            body = c.post("/api/v1/eval", json={"code": code}).json()
        assert body["success"] is True and body["value"] == 200
    finally:
        allowed.stop()
