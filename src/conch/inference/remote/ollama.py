"""Ollama through its native API (``/api/chat``, ``/api/embed``, ``/api/tags``) with the
official ``ollama`` client, translated to and from OpenAI's chat shapes.

Native rather than Ollama's ``/v1`` compatibility layer: the native API is the one every
Ollama version has, and it takes ``keep_alive`` and the sampling options directly.
"""

from __future__ import annotations

import base64
import json
import struct
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import ollama

from conch.inference.api.ollama import FINISH_REASONS, SAMPLING_OPTIONS
from conch.inference.remote import errors, translate
from conch.inference.remote.base import Provider, Timeouts

OLLAMA_URL = "http://127.0.0.1:11434"

# OpenAI request fields -> Ollama ``options``: the inbound dialect's table read backwards
# (``stop`` goes in below, as a list, with ``num_predict``).
_OPTIONS = {field: option for option, field in SAMPLING_OPTIONS.items() if option != "stop"}


class OllamaProvider(Provider):
    kind = "ollama"

    def __init__(self, id: str, url: str | None, timeouts: Timeouts) -> None:
        super().__init__(id, url or OLLAMA_URL, timeouts)
        self.client = ollama.AsyncClient(
            host=self.url, timeout=httpx.Timeout(timeouts.read_s, connect=timeouts.connect_s)
        )

    async def list_models(self, timeout: float | None = None) -> list[str]:
        # The client's list() has no per-call timeout: ask /api/tags directly, bounded.
        try:
            async with httpx.AsyncClient(timeout=timeout or self.timeouts.probe_s) as http:
                response = await http.get(f"{self.url}/api/tags")
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, timeout) from None
        if response.status_code >= 400:
            raise errors.status_error(self.id, response.status_code, _json(response), response.text)
        try:
            listed = ollama.ListResponse.model_validate(response.json())
        except ValueError as exc:
            raise errors.ProviderUnreachable(self.id, f"/api/tags answered something else: {exc}") from None
        return [m.model for m in listed.models if m.model]

    # -- chat --------------------------------------------------------------------------------
    def request(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        """The ``/api/chat`` arguments for an OpenAI chat request (400 for what Ollama lacks)."""
        translate.refuse(self.id, body, {"n": 1, "logprobs": False, "top_logprobs": None,
                                         "logit_bias": None, "parallel_tool_calls": True})
        options: dict[str, Any] = {}
        for field, option in _OPTIONS.items():
            if body.get(field) is not None:
                options[option] = body[field]
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is not None:
            options["num_predict"] = max_tokens
        stop = translate.stop_list(body.get("stop"))
        if stop:
            options["stop"] = stop
        args: dict[str, Any] = {"model": model, "messages": self._messages(body["messages"])}
        if options:
            args["options"] = options
        tools = body.get("tools")
        choice = body.get("tool_choice")
        if tools and choice != "none":
            if choice not in (None, "auto"):
                raise errors.UnsupportedByProvider(self.id, "tool_choice",
                                                   "Ollama lets the model choose; only 'auto' and 'none'")
            args["tools"] = tools
        fmt = body.get("response_format")
        if fmt and fmt.get("type") == "json_object":
            args["format"] = "json"
        elif fmt and fmt.get("type") == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema")
            args["format"] = schema or "json"
        if body.get("keep_alive") is not None:
            args["keep_alive"] = body["keep_alive"]
        return args

    def _messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        names: dict[str, str] = {}  # tool_call id -> function name, for tool results
        for m in messages:
            role = "system" if m["role"] == "developer" else m["role"]
            msg: dict[str, Any] = {"role": role, "content": translate.text_of(m.get("content"))}
            for call in m.get("tool_calls") or []:
                fn = call["function"]
                names[call.get("id", "")] = fn["name"]
                msg.setdefault("tool_calls", []).append(
                    {"function": {"name": fn["name"],
                                  "arguments": translate.parse_arguments(self.id, fn.get("arguments"))}}
                )
            if role == "tool":
                name = m.get("name") or names.get(m.get("tool_call_id") or "")
                if name:
                    msg["tool_name"] = name
            out.append(msg)
        return out

    async def chat(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        args = self.request(model, body)
        try:
            response = await self.client.chat(**args, stream=False)
        except Exception as exc:
            raise self._error(exc) from None
        message = response.message
        calls = _tool_calls(message.tool_calls)
        content = message.content or ""
        finish = "tool_calls" if calls else FINISH_REASONS.get(response.done_reason or "", "stop")
        prompt = response.prompt_eval_count or 0
        completion = response.eval_count or 0
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": f"{self.id}:{model}",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": (content or None) if calls else content,
                            **({"tool_calls": calls} if calls else {})},
                "finish_reason": finish,
                "logprobs": None,
            }],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        }

    async def chat_stream(self, model: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        args = self.request(model, body)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        try:
            upstream = await self.client.chat(**args, stream=True)
            # Ollama answers errors (unknown model) as a status before the first line: take
            # the first part now so that they surface as the response's status.
            first = await anext(upstream)
        except StopAsyncIteration:
            raise errors.ProviderUnreachable(self.id, "the stream ended before any answer") from None
        except Exception as exc:
            raise self._error(exc) from None
        return self._chunks(upstream, first, f"{self.id}:{model}", include_usage)

    async def _chunks(self, upstream: Any, first: Any, model: str,
                      include_usage: bool) -> AsyncIterator[dict[str, Any]]:
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": model, "system_fingerprint": None}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                         "logprobs": None}]}

        yield chunk({"role": "assistant", "content": ""})
        n_calls = 0
        part = first
        try:
            while True:
                message = part.message
                if message.content:
                    yield chunk({"content": message.content})
                calls = _tool_calls(message.tool_calls)
                if calls:
                    yield chunk({"tool_calls": [{"index": n_calls + k, **c} for k, c in enumerate(calls)]})
                    n_calls += len(calls)
                if part.done:
                    yield chunk({}, "tool_calls" if n_calls else FINISH_REASONS.get(part.done_reason or "", "stop"))
                    if include_usage:
                        p, c = part.prompt_eval_count or 0, part.eval_count or 0
                        yield {**head, "choices": [],
                               "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}
                    return
                try:
                    part = await anext(upstream)
                except StopAsyncIteration:
                    raise errors.ProviderUnreachable(self.id, "the stream ended before the answer was done") from None
        except errors.ProviderError:
            raise
        except Exception as exc:
            raise self._error(exc) from None
        finally:
            await upstream.aclose()

    # -- embeddings ----------------------------------------------------------------------------
    async def embed(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        translate.refuse(self.id, body, {"encoding_format": ("float", "base64")})
        raw = body["input"]
        if not (isinstance(raw, str) or (isinstance(raw, list) and all(isinstance(x, str) for x in raw))):
            raise errors.UnsupportedByProvider(self.id, "input", "Ollama embeds text, not token arrays")
        args: dict[str, Any] = {"model": model, "input": raw}
        if body.get("dimensions") is not None:
            args["dimensions"] = body["dimensions"]
        if body.get("keep_alive") is not None:
            args["keep_alive"] = body["keep_alive"]
        try:
            response = await self.client.embed(**args)
        except Exception as exc:
            raise self._error(exc) from None
        tokens = response.prompt_eval_count or 0
        as_base64 = body.get("encoding_format") == "base64"
        return {
            "object": "list",
            # base64 as OpenAI sends it (little-endian float32), which its client asks for.
            "data": [{"object": "embedding", "index": i,
                      "embedding": _base64(v) if as_base64 else list(v)}
                     for i, v in enumerate(response.embeddings)],
            "model": f"{self.id}:{model}",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    async def aclose(self) -> None:
        await self.client.close()

    # -- errors --------------------------------------------------------------------------------
    def _error(self, exc: BaseException) -> errors.ProviderError:
        if isinstance(exc, errors.ProviderError):
            return exc
        if isinstance(exc, ollama.ResponseError):
            status = exc.status_code if exc.status_code and exc.status_code > 0 else 502
            return errors.status_error(self.id, status, {"error": {"message": exc.error}}, exc.error)
        if isinstance(exc, httpx.HTTPError):
            return self._transport_error(exc)
        if isinstance(exc, ConnectionError):  # the client's "Failed to connect to Ollama"
            return errors.ProviderUnreachable(self.id, f"cannot reach {self.url}")
        if isinstance(exc, ValueError):  # a line that is not the protocol
            return errors.ProviderUnreachable(self.id, f"answered outside its protocol: {exc}")
        raise exc


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _base64(vector: Any) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    out = []
    for call in calls or []:
        fn = call.function
        out.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                    "function": {"name": fn.name,
                                 "arguments": json.dumps(dict(fn.arguments or {}), ensure_ascii=False)}})
    return out
