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

from conch.orchestration.turns import ModelError, Reply, ToolsUnsupported

Protocol = Literal["native", "json"]

MAX_TOKENS = 512


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
        key_id: str | None = None,
    ) -> Reply:
        name = wire_model(model)
        body = _body(name, messages)
        if name not in self._unconstrained:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "action", "schema": schema, "strict": True},
            }
        response = await self._post(body, key_id)
        if (
            response.status_code == 400
            and "response_format" in body
            and "response_format" in response.text
        ):
            self._unconstrained.add(name)
            body.pop("response_format")
            response = await self._post(body, key_id)
        return _reply(response, model, tools=False)

    async def protocol(self, model: str, key_id: str | None = None) -> Protocol:
        """``native`` unless the model is known to lack tool support: the server's
        ``GET /models/{id}`` lists ``capabilities`` without ``"tools"`` (conch's inference
        server, for its local models), or a request carrying ``tools`` was refused with a
        400 naming them (:meth:`chat_tools`). Asked once per model and remembered."""
        name = wire_model(model)
        known = self._protocols.get(name)
        if known is not None:
            return known
        url = f"{self.base_url}/models/{quote(name, safe='/:')}"
        try:
            response = await self._http().get(url, headers=self._auth(key_id))
        except httpx.HTTPError:
            return "native"  # not remembered: the chat request says whether it is reachable
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
        key_id: str | None = None,
    ) -> Reply:
        """A chat turn with the API's ``tools``; :class:`ToolsUnsupported` when the server
        refuses them (a 400 naming tools), and the model is JSON-protocol from then on."""
        name = wire_model(model)
        body = _body(name, messages)
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        response = await self._post(body, key_id)
        if response.status_code == 400 and tools and "tool" in response.text.lower():
            self._protocols[name] = "json"
            raise ToolsUnsupported(
                f"the model server refused tools for model {model!r}: {_message(response)}"
            )
        return _reply(response, model, tools=True)

    async def _post(self, body: dict[str, Any], key_id: str | None = None) -> httpx.Response:
        url = f"{self.base_url}/chat/completions"
        try:
            return await self._http().post(url, json=body, headers=self._auth(key_id))
        except httpx.HTTPError as exc:
            raise ModelError(f"cannot reach the model server at {self.base_url}: {exc}") from exc


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
