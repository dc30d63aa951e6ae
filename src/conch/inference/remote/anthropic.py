"""Anthropic's Messages API, translated both ways, through the official ``anthropic`` client.

OpenAI chat request -> Messages request: system and developer messages become ``system``;
assistant ``tool_calls`` become ``tool_use`` blocks and ``tool`` messages ``tool_result``
blocks of a user turn (consecutive turns of one role are merged, as the API wants
alternation); ``stop`` -> ``stop_sequences``; ``tool_choice`` auto/required/none/named ->
auto/any/none/tool. Messages answers and stream events come back as a ``chat.completion``
and ``chat.completion.chunk`` s: ``message_start`` -> the role chunk, ``text_delta`` ->
content, ``tool_use`` start + ``input_json_delta`` -> ``tool_calls`` deltas, ``message_delta``
-> ``finish_reason`` (end_turn/stop_sequence -> stop, max_tokens -> length, tool_use ->
tool_calls) and usage.

What the Messages API has no equivalent for (``n`` > 1, ``seed``, penalties, ``logprobs``,
``response_format`` json_object, ``temperature`` above 1) is a 400 naming the field;
``response_format`` json_schema becomes ``output_config.format``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx2 as httpx  # the transport the anthropic client is built on

from conch.inference.api.anthropic import FINISH_REASONS
from conch.inference.remote import errors, translate
from conch.inference.remote.base import Provider, Timeouts

ANTHROPIC_URL = "https://api.anthropic.com"
# The Messages API requires max_tokens; OpenAI's default is "up to the context".
DEFAULT_MAX_TOKENS = 4096


def to_messages_request(provider: str, model: str, body: dict[str, Any]) -> dict[str, Any]:
    """The Messages API request for an OpenAI chat request ``body``."""
    translate.refuse(provider, body, {
        "n": 1, "seed": None, "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
        "logprobs": False, "top_logprobs": None, "logit_bias": None,
    })
    fmt = body.get("response_format")
    output_format = None
    if fmt and fmt.get("type") == "json_object":
        raise errors.UnsupportedByProvider(provider, "response_format",
                                           "Anthropic has structured output for a schema only: use json_schema")
    if fmt and fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not schema:
            raise errors.UnsupportedByProvider(provider, "response_format.json_schema.schema",
                                               "Anthropic needs the schema itself")
        output_format = {"type": "json_schema", "schema": schema}
    temperature = body.get("temperature")
    if temperature is not None and temperature > 1:
        raise errors.UnsupportedByProvider(provider, "temperature", "Anthropic accepts 0 to 1")

    system: list[str] = []
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for i, m in enumerate(body["messages"]):
        role = m["role"]
        text = translate.text_of(m.get("content"))
        if role in ("system", "developer"):
            if turns:
                raise errors.UnsupportedByProvider(provider, f"messages[{i}].role",
                                                   "system messages must come before the conversation")
            system.append(text)
        elif role == "user":
            add("user", [{"type": "text", "text": text}])
        elif role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            for call in m.get("tool_calls") or []:
                fn = call["function"]
                blocks.append({"type": "tool_use", "id": call["id"], "name": fn["name"],
                               "input": translate.parse_arguments(provider, fn.get("arguments"))})
            if blocks:
                add("assistant", blocks)
        elif role == "tool":
            if not m.get("tool_call_id"):
                raise errors.UnsupportedByProvider(provider, f"messages[{i}].tool_call_id",
                                                   "a tool result must name the tool call it answers")
            add("user", [{"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": text}])

    out: dict[str, Any] = {
        "model": model,
        "messages": turns,
        "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS,
    }
    if system:
        out["system"] = "\n\n".join(system)
    if output_format is not None:
        out["output_config"] = {"format": output_format}
    # Sampling fields are no longer typed parameters of the client; they go in the body as
    # given, and a model that does not take them answers with its own 400 (passed on).
    sampling = {k: body[k] for k in ("temperature", "top_p") if body.get(k) is not None}
    if sampling:
        out["extra_body"] = sampling
    stop = translate.stop_list(body.get("stop"))
    if stop:
        out["stop_sequences"] = stop
    tools = body.get("tools")
    if tools:
        out["tools"] = [
            {"name": t["function"]["name"],
             **({"description": t["function"]["description"]} if t["function"].get("description") else {}),
             "input_schema": t["function"].get("parameters") or {"type": "object", "properties": {}}}
            for t in tools
        ]
        choice = body.get("tool_choice")
        if choice == "required":
            out["tool_choice"] = {"type": "any"}
        elif choice == "none":
            out["tool_choice"] = {"type": "none"}
        elif isinstance(choice, dict):
            out["tool_choice"] = {"type": "tool", "name": choice["function"]["name"]}
        if body.get("parallel_tool_calls") is False:
            out.setdefault("tool_choice", {"type": "auto"})["disable_parallel_tool_use"] = True
    if body.get("user"):
        out["metadata"] = {"user_id": body["user"]}
    return out


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def from_message(message: dict[str, Any], model: str) -> dict[str, Any]:
    """A ``chat.completion`` for a Messages API answer (a ``message`` dict)."""
    text = "".join(b.get("text", "") for b in message.get("content", []) if b.get("type") == "text")
    calls = [
        {"id": b["id"], "type": "function",
         "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False)}}
        for b in message.get("content", []) if b.get("type") == "tool_use"
    ]
    usage = message.get("usage") or {}
    reply: dict[str, Any] = {"role": "assistant", "content": (text or None) if calls else text}
    if calls:
        reply["tool_calls"] = calls
    return {
        "id": message.get("id") or "",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": reply,
                     "finish_reason": FINISH_REASONS.get(message.get("stop_reason") or "", "stop"),
                     "logprobs": None}],
        "usage": _usage(usage.get("input_tokens", 0), usage.get("output_tokens", 0)),
    }


class StreamTranslator:
    """Messages stream events (as dicts) -> ``chat.completion.chunk`` dicts."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.model = model
        self.include_usage = include_usage
        self.head: dict[str, Any] = {"id": "", "object": "chat.completion.chunk",
                                     "created": int(time.time()), "model": model,
                                     "system_fingerprint": None}
        self.tool_index: dict[int, int] = {}  # content block index -> tool_calls index
        self.input_tokens = 0
        self.output_tokens = 0

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**self.head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                          "logprobs": None}]}

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == "message_start":
            message = event["message"]
            self.head["id"] = message.get("id", "")
            self.input_tokens = (message.get("usage") or {}).get("input_tokens", 0)
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            block = event["content_block"]
            if block.get("type") == "tool_use":
                k = self.tool_index[event["index"]] = len(self.tool_index)
                return [self._chunk({"tool_calls": [{
                    "index": k, "id": block["id"], "type": "function",
                    "function": {"name": block["name"], "arguments": ""}}]})]
            if block.get("type") == "text" and block.get("text"):
                return [self._chunk({"content": block["text"]})]
            return []
        if kind == "content_block_delta":
            delta = event["delta"]
            if delta.get("type") == "text_delta":
                return [self._chunk({"content": delta["text"]})]
            if delta.get("type") == "input_json_delta" and event["index"] in self.tool_index:
                k = self.tool_index[event["index"]]
                return [self._chunk({"tool_calls": [{"index": k, "function": {"arguments": delta["partial_json"]}}]})]
            return []
        if kind == "message_delta":
            self.output_tokens = (event.get("usage") or {}).get("output_tokens", self.output_tokens)
            reason = (event.get("delta") or {}).get("stop_reason")
            return [self._chunk({}, FINISH_REASONS.get(reason or "", "stop"))]
        if kind == "message_stop":
            if self.include_usage:
                return [{**self.head, "choices": [], "usage": _usage(self.input_tokens, self.output_tokens)}]
            return []
        return []  # ping, content_block_stop


class AnthropicProvider(Provider):
    kind = "anthropic"
    transport_timeouts = (httpx.TimeoutException,)  # the anthropic client's httpx2

    def __init__(self, id: str, url: str | None, api_key: str | None, timeouts: Timeouts) -> None:
        super().__init__(id, url or ANTHROPIC_URL, timeouts)
        self._key = api_key
        self.client = anthropic.AsyncAnthropic(
            api_key=api_key or "unset",
            base_url=self.url,
            max_retries=0,
            timeout=httpx.Timeout(timeouts.read_s, connect=timeouts.connect_s),
        )

    def configured(self) -> bool:
        return bool(self._key)

    def unavailable_reason(self) -> str:
        return f"provider '{self.id}' has no API key (set ANTHROPIC_API_KEY or anthropic_api_key in conch.toml)"

    async def list_models(self, timeout: float | None = None) -> list[str]:
        self._require_configured()
        client = self.client.with_options(timeout=timeout) if timeout else self.client
        try:
            page = await client.models.list(limit=1000)
            return [m.id for m in page.data]
        except anthropic.AnthropicError as exc:
            raise self._error(exc, timeout) from None

    async def chat(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        self._require_configured()
        params = to_messages_request(self.id, model, body)
        try:
            message = await self.client.messages.create(**params)
        except anthropic.AnthropicError as exc:
            raise self._error(exc) from None
        return from_message(message.to_dict(), f"{self.id}:{model}")

    async def chat_stream(self, model: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        self._require_configured()
        params = to_messages_request(self.id, model, body)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        try:
            stream = await self.client.messages.create(**params, stream=True)
        except anthropic.AnthropicError as exc:
            raise self._error(exc) from None
        return self._chunks(stream, StreamTranslator(f"{self.id}:{model}", include_usage))

    async def _chunks(self, stream: Any, translator: StreamTranslator) -> AsyncIterator[dict[str, Any]]:
        try:
            async for event in stream:
                for chunk in translator.feed(event.to_dict()):
                    yield chunk
        except anthropic.AnthropicError as exc:
            raise self._error(exc) from None
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from None
        finally:
            await stream.close()

    async def aclose(self) -> None:
        await self.client.close()

    def _error(self, exc: anthropic.AnthropicError, timeout: float | None = None) -> errors.ProviderError:
        if isinstance(exc, anthropic.APITimeoutError):
            return self._timed_out(timeout)
        if isinstance(exc, anthropic.APIConnectionError):
            return errors.ProviderUnreachable(self.id, f"cannot reach {self.url}")
        if isinstance(exc, anthropic.APIStatusError):
            return errors.status_error(self.id, exc.status_code, exc.body, exc.message)
        if isinstance(exc, anthropic.APIError):  # an error event inside a stream
            body = exc.body if isinstance(exc.body, dict) else {}
            return errors.ProviderUnreachable(self.id, str((body.get("error") or {}).get("message") or exc.message))
        return errors.ProviderUnreachable(self.id, str(exc))
