"""The shared web parts on their own: the SSE encoder, and the security guard answering in
the OpenAI family's envelope (which the official client must read as the right exception)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import uvicorn
from httpx_sse import connect_sse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from conch.web.common.errors import agent_error_body, openai_error_body
from conch.web.common.security import SecurityMiddleware
from conch.web.common.sse import EventStreamResponse, encode_event


def test_encode_event_frames_event_id_and_data() -> None:
    assert encode_event({"a": 1}, event="start", id=1) == b'event: start\nid: 1\ndata: {"a":1}\n\n'
    assert encode_event("[DONE]") == b"data: [DONE]\n\n"
    assert encode_event("two\nlines") == b"data: two\ndata: lines\n\n"


def test_error_bodies_of_both_families() -> None:
    assert agent_error_body(404, "no such thing", kind="NameError", hint="x?") == (
        b'{"success":false,"error":{"kind":"NameError","message":"no such thing","hint":"x?"}}'
    )
    assert agent_error_body(500, "boom").startswith(
        b'{"success":false,"error":{"kind":"InternalError"'
    )
    assert openai_error_body(401, "bad key") == (
        b'{"error":{"message":"bad key","type":"authentication_error","param":null,"code":null}}'
    )


async def _models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": []})


async def _stream(request: Request) -> Response:
    async def events():  # type: ignore[no-untyped-def]
        for i in range(3):
            yield encode_event({"n": i}, event="tick", id=i + 1)

    return EventStreamResponse(events())


@pytest.fixture(scope="module")
def guarded_url() -> Iterator[str]:
    app = Starlette(
        routes=[Route("/v1/models", _models), Route("/stream", _stream), Route("/health", _models)],
        middleware=[
            Middleware(
                SecurityMiddleware,
                api_key="sekret",
                loopback_only=True,
                max_body_bytes=1000,
                error_body=openai_error_body,
            )
        ],
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_guard_answers_in_the_openai_envelope(guarded_url: str) -> None:
    bad = openai.OpenAI(base_url=guarded_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        bad.models.list()
    assert err.value.status_code == 401
    assert err.value.body == {
        "message": "invalid bearer token",
        "type": "authentication_error",
        "param": None,
        "code": None,
    }
    good = openai.OpenAI(base_url=guarded_url + "/v1", api_key="sekret", max_retries=0)
    assert list(good.models.list()) == []


def test_guard_refusals_keep_the_family_shape(guarded_url: str) -> None:
    with httpx.Client(base_url=guarded_url) as c:
        assert c.get("/health").status_code == 200  # open without a key
        r = c.get("/v1/models", headers={"Host": "evil.example"})
        assert r.status_code == 403
        assert r.json()["error"]["type"] == "permission_error"
        r = c.post("/v1/models", content=b"x" * 2000, headers={"Authorization": "Bearer sekret"})
        assert r.status_code == 413
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_event_stream_through_the_guard(guarded_url: str) -> None:
    with (
        httpx.Client(base_url=guarded_url, headers={"Authorization": "Bearer sekret"}) as c,
        connect_sse(c, "GET", "/stream") as source,
    ):
        events = [(e.event, e.id, e.json()) for e in source.iter_sse()]
    assert events == [("tick", "1", {"n": 0}), ("tick", "2", {"n": 1}), ("tick", "3", {"n": 2})]
