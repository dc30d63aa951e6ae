"""A scripted model server on loopback that speaks the OpenAI chat completions API.

It stands in for a model (replies are scripted, so agent-loop behaviour is deterministic)
and is proven with the official ``openai`` client in ``tests/orchestration/test_scripted_model.py``. The reply
to a conversation is chosen by its goal (its last user message that has a script, else its
first user message: a task of a thread or a fork carries earlier goals before its own) and the number of
requests made for it so far, so concurrent tasks each follow their own script; or, for a
goal scripted with :meth:`ScriptedModel.script_by_position`, by the conversation's position
(how many replies of the model it already holds), so that a request asked again after a
restart gets the same reply. Every request body is kept for inspection.

``POST /effects/NAME?delay_ms=N`` stands in for a side effect outside the server (an agent's
``http_post``): each request is counted at once under NAME, then answered after N ms; the
time each request came in and was answered is kept in ``effect_spans``.

Tool support, as the agent server asks for it (``GET /v1/models/{id}``): a model named in
``tool_models`` lists ``capabilities: ["chat", "tools"]``; one named in ``no_tools`` lists
no capabilities (as OpenAI does) but answers a request carrying ``tools`` with a 400 naming
them; any other lists ``["chat"]`` (as conch's inference server does for a local model), so
the agent server uses JSON actions. A scripted reply ``native(call(...), ...)`` answers with
native ``tool_calls`` (OpenAI shape, ``finish_reason: "tool_calls"``).

A request with ``"stream": true`` is answered as OpenAI streams (Server-Sent Events of
``chat.completion.chunk``): the role, then the reply's ``reasoning`` (a dict reply's, as
``reasoning_content`` deltas, as DeepSeek and vLLM send thinking text), its text and its
tool calls (name first, then the arguments) in pieces of ``stream_chunk`` characters, each
after ``stream_delay`` seconds (a dict reply's own ``stream_delay`` overrides it), the finish
reason, and the usage when ``stream_options.include_usage`` asks for it. A dict reply's
``stream_error`` ends its stream after the text with an error chunk (``data: {"error":
{...}}``), as conch's inference server does when generation fails mid-stream.

The server can be stopped and started again on the same port (:meth:`ScriptedModel.stop`,
then :meth:`ScriptedModel.start` with ``port``), its scripts kept: a model server that is
not up yet, or goes away for a while.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

Reply = str | dict[str, Any]

USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def final(answer: str) -> str:
    return json.dumps({"final": answer})


def tool(name: str, **args: Any) -> str:
    return json.dumps({"tool": name, "args": args})


def call(name: str, **args: Any) -> dict[str, Any]:
    """One native tool call of a :func:`native` reply."""
    return {"name": name, "arguments": args}


def native(*calls: dict[str, Any], content: str | None = None, **extra: Any) -> dict[str, Any]:
    """A reply with native tool calls (``extra``: ``delay``, ``delay_first``)."""
    return {"tool_calls": list(calls), "content": content, **extra}


@dataclass
class ScriptedModel:
    url: str = ""
    scripts: dict[str, list[Reply]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    # What to answer for a goal with no script (default: a final answer at once).
    fallback: Callable[[dict[str, Any]], Reply] | None = None
    positional: dict[str, list[Reply]] = field(default_factory=dict)
    effects: dict[str, int] = field(default_factory=dict)
    # name -> [(came in, answered)] in time.monotonic() seconds
    effect_spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    tool_models: set[str] = field(default_factory=set)
    no_tools: set[str] = field(default_factory=set)
    # Streamed replies: characters per chunk, and the pause before each.
    stream_chunk: int = 3
    stream_delay: float = 0.0
    _asked: dict[tuple[str, int], int] = field(default_factory=dict)
    _turns: dict[str, int] = field(default_factory=dict)
    _server: Any = None
    _thread: threading.Thread | None = None

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def script(self, goal: str, *replies: Reply) -> str:
        self.scripts[goal] = list(replies)
        self._turns.pop(goal, None)
        return goal

    def script_by_position(self, goal: str, *replies: Reply) -> str:
        """Replies by the conversation's position: the n-th reply answers every request
        whose conversation holds n replies of the model already. A reply
        ``{"delay_first": S, "content": …}`` waits S seconds the first time only."""
        self.positional[goal] = list(replies)
        for key in [k for k in self._asked if k[0] == goal]:
            del self._asked[key]
        return goal

    def requests_for(self, goal: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if self.goal_of(r) == goal]

    def goal_of(self, body: dict[str, Any]) -> str:
        return _goal(body, _Scripted(self))

    async def _chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        if body.get("tools") and body.get("model") in self.no_tools:
            return JSONResponse(
                {"error": {"message": f"{body['model']} does not support tools",
                           "type": "invalid_request_error", "param": "tools"}},
                400,
            )  # fmt: skip
        goal = self.goal_of(body)
        turn = self._turns.get(goal, 0)
        self._turns[goal] = turn + 1
        script = self.scripts.get(goal)
        reply: Reply
        if goal in self.positional:
            replies = self.positional[goal]
            position = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
            asked = self._asked.get((goal, position), 0)
            self._asked[(goal, position)] = asked + 1
            reply = replies[min(position, len(replies) - 1)]
            if isinstance(reply, dict) and "delay_first" in reply:
                reply = {**reply, "delay": reply["delay_first"] if asked == 0 else 0}
        elif script is not None:
            reply = script[min(turn, len(script) - 1)]
        elif self.fallback is not None:
            reply = self.fallback(body)
        else:
            reply = final("done")
        message: dict[str, Any] = {"role": "assistant"}
        finish = "stop"
        reasoning = ""
        delay = self.stream_delay
        stream_error = None
        if isinstance(reply, dict):
            reasoning = str(reply.get("reasoning") or "")
            stream_error = reply.get("stream_error")
            delay = float(reply.get("stream_delay", delay))
            if reply.get("delay"):
                await asyncio.sleep(reply["delay"])
            if reply.get("status"):
                return JSONResponse(
                    {"error": {"message": reply.get("content", "scripted failure")}},
                    reply["status"],
                )
            text = reply.get("content", "")
            if reply.get("tool_calls"):
                finish = "tool_calls"
                message["tool_calls"] = [
                    {
                        "id": f"call_{uuid.uuid4().hex[:12]}",
                        "type": "function",
                        "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                    }
                    for c in reply["tool_calls"]
                ]
        else:
            text = reply
        message["content"] = text
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunks = self._chunks(
                body, message, reasoning, finish, include_usage, delay, stream_error
            )
            return StreamingResponse(chunks, media_type="text/event-stream")  # type: ignore[return-value]
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": finish,
                    }
                ],
                "usage": USAGE,
            }
        )

    async def _chunks(
        self,
        body: dict[str, Any],
        message: dict[str, Any],
        reasoning: str,
        finish: str,
        include_usage: bool,
        delay: float,
        error: str | None = None,
    ) -> Any:
        """The reply as OpenAI's stream chunks (``data: {...}`` lines, then ``[DONE]``)."""
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())
        model = body.get("model", "scripted")
        n = max(1, self.stream_chunk)

        def chunk(delta: dict[str, Any], finish_reason: str | None = None,
                  usage: Any = None) -> bytes:
            choices = [] if delta is None else [
                {"index": 0, "delta": delta, "finish_reason": finish_reason}
            ]  # fmt: skip
            data = {"id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": choices, "usage": usage}  # fmt: skip
            return f"data: {json.dumps(data)}\n\n".encode()

        def pieces(text: str) -> list[str]:
            return [text[i : i + n] for i in range(0, len(text), n)]

        yield chunk({"role": "assistant", "content": ""})
        for piece in pieces(reasoning):
            if delay:
                await asyncio.sleep(delay)
            yield chunk({"reasoning_content": piece})
        for piece in pieces(message.get("content") or ""):
            if delay:
                await asyncio.sleep(delay)
            yield chunk({"content": piece})
        if error is not None:
            failure = {"error": {"message": error, "type": "server_error"}}
            yield f"data: {json.dumps(failure)}\n\n".encode()
            return
        for k, c in enumerate(message.get("tool_calls") or []):
            fn = c["function"]
            yield chunk({"tool_calls": [{"index": k, "id": c["id"], "type": "function",
                                         "function": {"name": fn["name"], "arguments": ""}}]})  # fmt: skip
            for piece in pieces(fn["arguments"]):
                if delay:
                    await asyncio.sleep(delay)
                yield chunk({"tool_calls": [{"index": k, "function": {"arguments": piece}}]})
        yield chunk({}, finish)
        if include_usage:
            yield chunk(None, usage=USAGE)  # type: ignore[arg-type]
        yield b"data: [DONE]\n\n"

    async def _effect(self, request: Request) -> JSONResponse:
        name = request.path_params["name"]
        came = time.monotonic()
        self.effects[name] = self.effects.get(name, 0) + 1
        delay_ms = float(request.query_params.get("delay_ms", "0"))
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        self.effect_spans.setdefault(name, []).append((came, time.monotonic()))
        return JSONResponse({"effect": name, "count": self.effects[name]})

    async def _model(self, request: Request) -> JSONResponse:
        name = request.path_params["name"]
        info: dict[str, Any] = {"id": name, "object": "model", "created": 0, "owned_by": "scripted"}
        if name in self.tool_models:
            info["capabilities"] = ["chat", "tools"]
        elif name not in self.no_tools:
            info["capabilities"] = ["chat"]
        return JSONResponse(info)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1]) if self.url else 0

    def start(self, port: int = 0) -> ScriptedModel:
        """Serve on loopback (``port``: this one, e.g. the port of an earlier start)."""
        import uvicorn

        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/effects/{name}", self._effect, methods=["POST"]),
                Route("/v1/models/{name:path}", self._model, methods=["GET"]),
            ]
        )
        # IPPROTO_TCP spelled out: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
        # sockets whose protocol says TCP, and a socket.socket() says 0. With Nagle on, each
        # reply on a kept-alive connection waits ~40 ms for the client's delayed ACK.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        port = sock.getsockname()[1]
        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
        )

        def serve() -> None:
            asyncio.run(self._server.serve(sockets=[sock]))

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the scripted model server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


class _Scripted:
    """The goals with a script, by turn or by position."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model

    def __contains__(self, goal: object) -> bool:
        return goal in self.model.scripts or goal in self.model.positional


def _goal(body: dict[str, Any], scripted: Container[str] = ()) -> str:
    """The conversation's goal: its last user message that is a scripted goal (a later task
    of a thread, or a fork's added message, has earlier goals before its own), else its
    first user message."""
    users = [str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "user"]
    for content in reversed(users):
        if content in scripted:
            return content
    return users[0] if users else ""
