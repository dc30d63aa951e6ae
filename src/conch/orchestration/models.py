"""Models through the inference server's OpenAI-compatible chat API (``models_url``).

The agent server never loads a model: every completion is an HTTP request to the conch
inference server (or any OpenAI-compatible server), which routes ``<provider>:<model>``
names to its providers; a ``local:`` prefix is conch's own and is stripped. Each request
carries ``response_format: {"type": "json_schema"}`` so that a server able to constrain
decoding (conch's, through a llama.cpp grammar) only produces valid actions; a server that
refuses the field is asked again without it, and the loop's lenient parser takes over.

With the native protocol (:meth:`ModelClient.chat_tools`) a request carries ``tools`` and
``tool_choice: "auto"`` instead, and the reply's ``tool_calls`` are read back.
:meth:`ModelClient.protocol` says which protocol a model gets (docs/orchestration.md,
"Tool-call protocols").

Given ``on_delta`` (someone watches the task live), a request streams (``stream: true``) and
each piece of the reply is handed over as it comes: text, thinking text
(``reasoning_content``, or ``reasoning`` as some servers name it) and tool calls as they
form; the reply returned is the same as without. Without it nothing streams, so a task no
one watches costs what it did. A model server that is not up (no connection, or a 502, 503
or 504 answer) raises :class:`ModelUnavailable`, which a caller may retry.

Keys. A task's model turns count against the limits of the key that made it: each request
carries the bearer ``credentials(key_id)`` gives (a model pass of that key, where the server
needs keys: conch.keys.service), or the client's own ``api_key``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal
from urllib.parse import quote

import httpx

from conch.orchestration.turns import ModelError, ModelUnavailable, Reply, ToolsUnsupported

Protocol = Literal["native", "json"]
# A piece of a streamed reply: ``{"type": "text" | "thinking", "text"}`` or ``{"type":
# "tool_call", "index", "id"?, "name"?, "arguments"}`` (``arguments``: the next fragment).
DeltaFn = Callable[[dict[str, Any]], None]

MAX_TOKENS = 512
# Answers that say the model server, or the provider behind it, is not up (or overloaded).
NOT_UP = frozenset({502, 503, 504})
_NOT_UP_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError)


def wire_model(model: str) -> str:
    return model.removeprefix("local:")


# A task's key id (None: the admin's) -> the bearer its model requests carry (None: the
# client's own).
Credentials = Callable[[str | None], str | None]


class ModelClient:
    def __init__(
        self, base_url: str, *, api_key: str | None = None, timeout: float = 300.0,
        credentials: Credentials | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.credentials = credentials
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client: httpx.AsyncClient | None = None
        self._headers = headers
        self._timeout = timeout
        # Models whose server refused response_format: asked without it from then on.
        self._unconstrained: set[str] = set()
        # The protocol of each model asked about (wire name -> native | json).
        self._protocols: dict[str, Protocol] = {}

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self._timeout,
                headers=self._headers,
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _auth(self, key_id: str | None) -> dict[str, str] | None:
        """The headers of a request made for ``key_id``'s task (None: the client's own)."""
        if self.credentials is None:
            return None
        token = self.credentials(key_id)
        return {"Authorization": f"Bearer {token}"} if token else None

    async def chat(
        self,
        model: str,
        messages: list[dict[str, Any]],
        schema: dict[str, Any],
        on_delta: DeltaFn | None = None,
        key_id: str | None = None,
    ) -> Reply:
        name = wire_model(model)
        body = _body(name, messages)
        if name not in self._unconstrained:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "action", "schema": schema, "strict": True},
            }
        response, reply = await self._send(body, model, tools=False, on_delta=on_delta, key_id=key_id)
        if (
            response.status_code == 400
            and "response_format" in body
            and "response_format" in response.text
        ):
            self._unconstrained.add(name)
            body.pop("response_format")
            response, reply = await self._send(body, model, tools=False, on_delta=on_delta, key_id=key_id)
        return reply or _reply(response, model, tools=False)

    async def protocol(self, model: str, key_id: str | None = None) -> Protocol:
        """``native`` unless the model is known to lack tool support: the server's
        ``GET /models/{id}`` lists ``capabilities`` without ``"tools"`` (conch's inference
        server, for its local models), or a request carrying ``tools`` was refused with a
        400 naming them (:meth:`chat_tools`). Asked once per model and remembered;
        :class:`ModelUnavailable` (not remembered) when the server is not up."""
        name = wire_model(model)
        known = self._protocols.get(name)
        if known is not None:
            return known
        url = f"{self.base_url}/models/{quote(name, safe='/:')}"
        try:
            response = await self._http().get(url, headers=self._auth(key_id))
        except httpx.HTTPError as exc:
            raise ModelUnavailable(
                f"cannot reach the model server at {self.base_url}: {exc}"
            ) from exc
        if response.status_code in NOT_UP:
            raise ModelUnavailable(
                f"the model server answered {response.status_code} for model {model!r}: "
                f"{_message(response)}"
            )
        found: Protocol = "native"
        if response.status_code == 200:
            try:
                caps = response.json().get("capabilities")
            except (ValueError, AttributeError):
                caps = None
            if isinstance(caps, list) and "tools" not in caps:
                found = "json"
        self._protocols[name] = found
        return found

    async def chat_tools(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_delta: DeltaFn | None = None,
        key_id: str | None = None,
    ) -> Reply:
        """A chat turn with the API's ``tools``; :class:`ToolsUnsupported` when the server
        refuses them (a 400 naming tools), and the model is JSON-protocol from then on."""
        name = wire_model(model)
        body = _body(name, messages)
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        response, reply = await self._send(body, model, tools=True, on_delta=on_delta, key_id=key_id)
        if response.status_code == 400 and tools and "tool" in response.text.lower():
            self._protocols[name] = "json"
            raise ToolsUnsupported(
                f"the model server refused tools for model {model!r}: {_message(response)}"
            )
        return reply or _reply(response, model, tools=True)

    async def _send(
        self, body: dict[str, Any], model: str, *, tools: bool, on_delta: DeltaFn | None,
        key_id: str | None = None,
    ) -> tuple[httpx.Response, Reply | None]:
        """The response, and the reply when it was streamed (``on_delta``) and came whole;
        an error response comes back read, for the caller to look at."""
        url = f"{self.base_url}/chat/completions"
        headers = self._auth(key_id)
        try:
            if on_delta is None:
                response = await self._http().post(url, json=body, headers=headers)
                _check_up(response, self.base_url, model)
                return response, None
            streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
            async with self._http().stream("POST", url, json=streamed, headers=headers) as response:
                if response.status_code == 200:
                    return response, await _read_stream(response, model, tools, on_delta)
                await response.aread()
            if response.status_code == 400 and "stream_options" in response.text:
                # A server that streams but knows no stream_options: the usage is then
                # whatever its chunks carry.
                streamed.pop("stream_options")
                async with self._http().stream("POST", url, json=streamed, headers=headers) as response:
                    if response.status_code == 200:
                        return response, await _read_stream(response, model, tools, on_delta)
                    await response.aread()
            _check_up(response, self.base_url, model)
            return response, None
        except httpx.HTTPError as exc:
            message = f"cannot reach the model server at {self.base_url}: {exc}"
            # No connection, or one dropped (a server stopping or restarting): not up. A
            # timeout is a slow model, not a missing one.
            if isinstance(exc, _NOT_UP_ERRORS):
                raise ModelUnavailable(message) from exc
            raise ModelError(message) from exc


def _check_up(response: httpx.Response, base_url: str, model: str) -> None:
    if response.status_code in NOT_UP:
        raise ModelUnavailable(
            f"the model server at {base_url} answered {response.status_code} for model "
            f"{model!r}: {_message(response)}"
        )


async def _read_stream(
    response: httpx.Response, model: str, tools: bool, on_delta: DeltaFn
) -> Reply:
    """A streamed chat completion (OpenAI's ``chat.completion.chunk`` events), each piece
    handed to ``on_delta`` as it comes, as the reply a request without ``stream`` gets."""
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    usage: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, comments, event names
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise ModelError("the model server's stream is not chat completion chunks") from None
        if not isinstance(chunk, dict):
            raise ModelError("the model server's stream is not chat completion chunks")
        if chunk.get("error") is not None:
            err = chunk["error"]
            message = err.get("message") if isinstance(err, dict) else err
            raise ModelError(f"the model server failed mid-stream for model {model!r}: {message}")
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict):
                _take_delta(delta, text, calls, tools, on_delta)
    ordered = [calls[k] for k in sorted(calls)]
    for c in ordered:
        c["arguments"] = c["arguments"] or "{}"
    return Reply(
        text="".join(text),
        usage={k: v for k, v in usage.items() if isinstance(v, int)},
        tool_calls=ordered or None,
    )


def _take_delta(
    delta: dict[str, Any],
    text: list[str],
    calls: dict[int, dict[str, str]],
    tools: bool,
    on_delta: DeltaFn,
) -> None:
    thinking = delta.get("reasoning_content") or delta.get("reasoning")
    if isinstance(thinking, str) and thinking:
        on_delta({"type": "thinking", "text": thinking})
    content = delta.get("content")
    if isinstance(content, str) and content:
        text.append(content)
        on_delta({"type": "text", "text": content})
    for position, tc in enumerate(delta.get("tool_calls") or () if tools else ()):
        if not isinstance(tc, dict):
            continue
        index = tc.get("index", position)
        index = index if isinstance(index, int) else position
        call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        function = tc.get("function")
        fn: dict[str, Any] = function if isinstance(function, dict) else {}
        piece: dict[str, Any] = {"type": "tool_call", "index": index}
        if tc.get("id"):
            call["id"] = piece["id"] = str(tc["id"])
        if fn.get("name"):
            call["name"] += str(fn["name"])
            piece["name"] = str(fn["name"])
        fragment = fn.get("arguments")
        if fragment is not None:
            fragment = _arguments(fragment)
            call["arguments"] += fragment
        piece["arguments"] = fragment or ""
        on_delta(piece)


def _body(name: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": name, "messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS}


def _reply(response: httpx.Response, model: str, *, tools: bool) -> Reply:
    """The chat completion's text, usage and (``tools``) tool calls; :class:`ModelError`
    for an error status or a body that is not a chat completion."""
    if response.status_code != 200:
        raise ModelError(
            f"the model server answered {response.status_code} for model {model!r}: "
            f"{_message(response)}"
        )
    try:
        data = response.json()
        message = data["choices"][0]["message"]
        text = message.get("content") or ""
        calls = [
            {
                "id": str(c.get("id") or ""),
                "name": str(c["function"]["name"]),
                "arguments": _arguments(c["function"].get("arguments")),
            }
            for c in (message.get("tool_calls") or [] if tools else [])
        ]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise ModelError("the model server's reply is not a chat completion") from None
    usage = data.get("usage") or {}
    return Reply(
        text=str(text),
        usage={k: v for k, v in usage.items() if isinstance(v, int)},
        tool_calls=calls or None,
    )


def _arguments(value: Any) -> str:
    # OpenAI sends a JSON string; some servers send the object itself.
    if value is None:
        return "{}"
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _message(response: httpx.Response) -> str:
    try:
        err = response.json().get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    except (ValueError, AttributeError):
        pass
    return response.text[:300]
