"""Loopback stand-ins for the two providers that cannot run here: Ollama and Anthropic.

Each speaks its vendor's real wire protocol (routes, status codes, error bodies, NDJSON or
SSE event sequences) and is proven with the vendor's official Python client in
``test_standins.py`` before conch's providers are tested against it. Their answers are
deterministic so tests can check what crossed the translation: the reply echoes the last
user text (and the system prompt), a user text mentioning "weather" with tools given asks
for the first tool, and a tool result is answered with its content.

Model names select failure modes: ``*hang*`` never answers, ``*die*`` breaks the
connection mid-stream, ``*overloaded*`` (Anthropic) sends an error event mid-stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import math
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


class Broken(Exception):
    """Raised inside a streaming body: uvicorn drops the connection without ending the body."""


def _words(text: str) -> list[str]:
    parts = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(parts)]


def _vector(text: str, dims: int = 8) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    raw = [b - 128.0 for b in digest[:dims]]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(app: Any) -> Iterator[str]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("stand-in did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


# -- Ollama ------------------------------------------------------------------------------------
OLLAMA_MODELS = ["qwen2.5:7b", "nomic-embed-text:latest", "slow-hang:1b", "slow-die:1b"]


def ollama_app() -> FastAPI:
    app = FastAPI()
    app.state.requests = []  # what conch sent, for the tests to inspect

    def now() -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())

    @app.get("/api/version")
    async def version() -> Any:
        return {"version": "0.6.5"}

    @app.get("/api/tags")
    async def tags() -> Any:
        return {"models": [
            {"name": m, "model": m, "modified_at": "2025-01-01T00:00:00Z", "size": 1000, "digest": "0" * 64,
             "details": {"parent_model": "", "format": "gguf", "family": "qwen2", "families": ["qwen2"],
                         "parameter_size": "7B", "quantization_level": "Q4_K_M"}}
            for m in OLLAMA_MODELS
        ]}

    def not_found(model: str) -> JSONResponse:
        return JSONResponse({"error": f"model \"{model}\" not found, try pulling it first"}, status_code=404)

    @app.post("/api/chat")
    async def chat(request: Request) -> Any:
        body = await request.json()
        app.state.requests.append(body)
        model = body.get("model", "")
        if model not in OLLAMA_MODELS:
            return not_found(model)
        if "hang" in model:
            await asyncio.sleep(3600)
        messages = body.get("messages") or []
        system = " ".join(m["content"] for m in messages if m["role"] == "system")
        last = messages[-1] if messages else {"role": "user", "content": ""}
        options = body.get("options") or {}
        tool_calls = None
        if last["role"] == "tool":
            text = f"the tool said {last['content']}"
        elif body.get("tools") and "weather" in last.get("content", ""):
            text = ""
            tool_calls = [{"function": {"name": body["tools"][0]["function"]["name"],
                                        "arguments": {"city": "Paris"}}}]
        elif body.get("format"):
            text = json.dumps({"colour": "blue"})
        else:
            text = (f"[{system}] " if system else "") + f"echo: {last.get('content', '')}"
        words = _words(text) if text else []
        reason = "stop"
        limit = options.get("num_predict")
        if limit is not None and len(words) > limit:
            words, reason = words[:limit], "length"
        final = {"model": model, "created_at": now(), "message": {"role": "assistant", "content": ""},
                 "done": True, "done_reason": reason, "total_duration": 1000, "load_duration": 10,
                 "prompt_eval_count": 7, "prompt_eval_duration": 100, "eval_count": len(words) or 1,
                 "eval_duration": 200}
        if not body.get("stream", True):
            message: dict[str, Any] = {"role": "assistant", "content": "".join(words)}
            if tool_calls:
                message["tool_calls"] = tool_calls
            return {**final, "message": message}

        async def lines() -> AsyncIterator[bytes]:
            for i, w in enumerate(words):
                if "die" in model and i == 2:
                    raise Broken()
                yield (json.dumps({"model": model, "created_at": now(),
                                   "message": {"role": "assistant", "content": w}, "done": False}) + "\n").encode()
                await asyncio.sleep(0)
            if tool_calls:
                yield (json.dumps({"model": model, "created_at": now(),
                                   "message": {"role": "assistant", "content": "", "tool_calls": tool_calls},
                                   "done": False}) + "\n").encode()
            yield (json.dumps(final) + "\n").encode()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.post("/api/embed")
    async def embed(request: Request) -> Any:
        body = await request.json()
        app.state.requests.append(body)
        model = body.get("model", "")
        if model not in OLLAMA_MODELS:
            return not_found(model)
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        dims = body.get("dimensions") or 8
        return {"model": model, "embeddings": [_vector(t, dims) for t in inputs],
                "total_duration": 100, "load_duration": 10, "prompt_eval_count": len(inputs) * 2}

    return app


# -- Anthropic -----------------------------------------------------------------------------------
ANTHROPIC_KEY = "sk-ant-test-key"
ANTHROPIC_MODELS = ["claude-test-1", "claude-hang", "claude-die", "claude-overloaded"]


def _anthropic_error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}},
                        status_code=status, headers={"request-id": f"req_{uuid.uuid4().hex[:12]}"})


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def anthropic_app() -> FastAPI:
    app = FastAPI()
    app.state.requests = []

    def authorised(request: Request) -> JSONResponse | None:
        # Both ways the API takes a key: x-api-key, and the bearer token newer clients send.
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
        if ANTHROPIC_KEY not in (request.headers.get("x-api-key"), bearer):
            return _anthropic_error(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return _anthropic_error(400, "invalid_request_error", "anthropic-version: header is required")
        return None

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        if (denied := authorised(request)) is not None:
            return denied
        data = [{"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                for m in ANTHROPIC_MODELS]
        return {"data": data, "has_more": False, "first_id": data[0]["id"], "last_id": data[-1]["id"]}

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        if (denied := authorised(request)) is not None:
            return denied
        body = await request.json()
        app.state.requests.append(body)
        model = body.get("model")
        if model not in ANTHROPIC_MODELS:
            return _anthropic_error(404, "not_found_error", f"model: {model}")
        if not isinstance(body.get("max_tokens"), int):
            return _anthropic_error(400, "invalid_request_error", "max_tokens: Field required")
        turns = body.get("messages") or []
        if not turns or turns[0]["role"] != "user":
            return _anthropic_error(400, "invalid_request_error", "messages: first message must use the \"user\" role")
        for a, b in itertools.pairwise(turns):
            if a["role"] == b["role"]:
                return _anthropic_error(400, "invalid_request_error", "messages: roles must alternate")
        if "hang" in model:
            await asyncio.sleep(3600)
        last = turns[-1]
        blocks = last["content"] if isinstance(last["content"], list) else [{"type": "text", "text": last["content"]}]
        results = [b for b in blocks if b.get("type") == "tool_result"]
        text_in = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        system = body.get("system")
        tool_use = None
        known = {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "tools",
                 "tool_choice", "metadata", "output_config", "temperature", "top_p", "top_k", "thinking",
                 "service_tier", "cache_control", "container", "inference_geo", "speed"}
        unknown = sorted(set(body) - known)
        if unknown:
            return _anthropic_error(400, "invalid_request_error", f"{unknown[0]}: Extra inputs are not permitted")
        fmt = (body.get("output_config") or {}).get("format")
        if results:
            text = f"the tool said {results[0]['content']}"
        elif fmt:
            text = json.dumps({"colour": "blue"})
        elif body.get("tools") and "weather" in text_in:
            text = "Let me check."
            tool_use = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}",
                        "name": body["tools"][0]["name"], "input": {"city": "Paris"}}
        else:
            text = (f"[{system}] " if system else "") + f"echo: {text_in}"
        words = _words(text)
        stop_reason, stop_sequence = ("tool_use" if tool_use else "end_turn"), None
        for seq in body.get("stop_sequences") or []:
            joined = "".join(words)
            if seq in joined:
                words = _words(joined[: joined.index(seq)])
                stop_reason, stop_sequence = "stop_sequence", seq
                break
        if len(words) > body["max_tokens"]:
            words, stop_reason = words[: body["max_tokens"]], "max_tokens"
        msg_id = f"msg_{uuid.uuid4().hex[:24]}"
        usage_in = 10 + len(json.dumps(turns)) // 20
        if not body.get("stream"):
            content: list[dict[str, Any]] = [{"type": "text", "text": "".join(words)}]
            if tool_use:
                content.append(tool_use)
            return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
                    "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                    "usage": {"input_tokens": usage_in, "output_tokens": len(words)}}

        async def events() -> AsyncIterator[bytes]:
            yield _sse("message_start", {"type": "message_start", "message": {
                "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": usage_in, "output_tokens": 1}}})
            yield _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}})
            yield _sse("ping", {"type": "ping"})
            for i, w in enumerate(words):
                if i == 2 and "die" in model:
                    raise Broken()
                if i == 2 and "overloaded" in model:
                    yield _sse("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
                    return
                yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                   "delta": {"type": "text_delta", "text": w}})
                await asyncio.sleep(0)
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
            if tool_use:
                yield _sse("content_block_start", {"type": "content_block_start", "index": 1,
                                                   "content_block": {**tool_use, "input": {}}})
                raw = json.dumps(tool_use["input"])
                for piece in (raw[: len(raw) // 2], raw[len(raw) // 2:]):
                    yield _sse("content_block_delta", {"type": "content_block_delta", "index": 1,
                                                       "delta": {"type": "input_json_delta", "partial_json": piece}})
                yield _sse("content_block_stop", {"type": "content_block_stop", "index": 1})
            yield _sse("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                         "usage": {"output_tokens": len(words)}})
            yield _sse("message_stop", {"type": "message_stop"})

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@contextmanager
def silent_server() -> Iterator[str]:
    """A TCP server that accepts connections and never says a word (a hung provider)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        sock.close()


def closed_port_url() -> str:
    """A loopback URL where nothing listens (a provider that is down)."""
    return f"http://127.0.0.1:{free_port()}"
