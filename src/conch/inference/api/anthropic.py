"""Anthropic Messages API <-> OpenAI chat completions (the inbound direction).

``messages_to_chat`` turns a ``POST /v1/messages`` body into a chat request body;
``chat_to_message`` turns the chat completion into an Anthropic ``message``;
:class:`MessageStream` turns chat chunks into Anthropic's stream events
(``message_start``, ``content_block_start``, ``content_block_delta`` with ``text_delta`` or
``input_json_delta``, ``content_block_stop``, ``message_delta``, ``message_stop``, ``ping``).

Decisions (docs/apis.md): ``cache_control`` is accepted and ignored (conch reuses prompt
prefixes on its own); ``thinking`` blocks in the history are dropped (the local models do not
think) but asking for thinking is refused; documents and server tools are refused. ``image`` blocks
of user messages (``base64`` or ``url`` sources) become OpenAI ``image_url`` parts, in place.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from conch.inference.api.dialect import TranslationError, function_tools, joined_text, refuse
from conch.inference.api.stream import ChatStreamTranslator

# Anthropic's stop_reason for each chat finish_reason, and the chat finish_reason for each of
# Anthropic's (what the Anthropic provider, remote/anthropic.py, reads): several of them end a
# turn as a plain stop.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
FINISH_REASONS = {**{reason: finish for finish, reason in STOP_REASONS.items()},
                  "stop_sequence": "stop", "refusal": "content_filter", "pause_turn": "stop"}

# Fields an Anthropic client may send that change nothing a local model does (not read).
IGNORED_FIELDS = ("metadata", "service_tier", "cache_control", "context_management", "inference_geo",
                  "speed", "diagnostics", "user_profile_id", "workspace_id")
REFUSED_FIELDS = ("container", "mcp_servers")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    501: "api_error",
    502: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error envelope: ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


# -- request ---------------------------------------------------------------------------------
def _text_block(block: Any, param: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else type(block).__name__
    if kind != "text":
        raise refuse(param, f"is a '{kind}' block; only text blocks are supported here")
    return str(block.get("text", ""))


def _text_of(blocks: Any, param: str) -> str:
    """A string, or a list of text blocks (anything else refused), as one string."""
    return joined_text(blocks, param, "content blocks", _text_block)


def _convert_message(i: int, msg: Any) -> list[dict[str, Any]]:
    param = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise TranslationError(f"'{param}' must be an object", param)
    role = msg.get("role")
    if role not in ("user", "assistant"):
        raise TranslationError(f"'{param}.role' must be 'user' or 'assistant'", f"{param}.role")
    content = msg.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise TranslationError(f"'{param}.content' must be a string or an array of blocks", f"{param}.content")
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    # A user turn's text and images in order (images need parts; text alone stays a string).
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        bp = f"{param}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image" and role == "user":
            parts.append(_image_part(block, bp))
        elif kind in ("thinking", "redacted_thinking"):
            continue  # a previous turn's reasoning; local models neither need nor produce it
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("input", {}), dict):
                raise TranslationError(f"'{bp}.input' must be an object", f"{bp}.input")
            calls.append({
                "id": str(block.get("id") or f"toolu_{uuid.uuid4().hex[:24]}"),
                "type": "function",
                "function": {"name": str(block.get("name", "")), "arguments": json.dumps(block.get("input", {}))},
            })
        elif kind == "tool_result" and role == "user":
            result = block.get("content", "")
            text = _text_of(result, f"{bp}.content") if result is not None else ""
            if block.get("is_error"):
                text = f"Error: {text}"
            # A tool result answers the call before any new user text in the same turn.
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": text})
        else:
            raise refuse(bp, f"is a '{kind}' block, which conch does not support in {role} messages")
    if role == "assistant":
        item: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
        if calls:
            item["tool_calls"] = calls
        out.append(item)
    elif any(p["type"] == "image_url" for p in parts):
        out.append({"role": "user", "content": parts})
    elif texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _image_part(block: dict[str, Any], bp: str) -> dict[str, Any]:
    """An ``image`` block as an OpenAI ``image_url`` part naming the block's field in errors."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        data, media = source.get("data"), source.get("media_type")  # type: ignore[union-attr]
        if not isinstance(data, str) or not data:
            raise TranslationError(f"'{bp}.source.data' must be base64 image data", f"{bp}.source.data")
        return {"type": "image_url", "image_url": {"url": f"data:{media or 'image/*'};base64,{data}"},
                "source_param": f"{bp}.source.data"}
    if kind == "url":
        url = source.get("url")  # type: ignore[union-attr]
        if not isinstance(url, str) or not url:
            raise TranslationError(f"'{bp}.source.url' must be a URL", f"{bp}.source.url")
        return {"type": "image_url", "image_url": {"url": url}, "source_param": f"{bp}.source.url"}
    raise refuse(bp, f"has a '{kind}' image source; conch takes 'base64' and 'url' sources")


def _function(tool: Any, param: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise TranslationError(f"'{param}' must be an object", param)
    kind = tool.get("type", "custom")
    if kind != "custom" or "input_schema" not in tool:
        raise refuse(param, f"is a '{kind}' server tool; only custom tools (with input_schema) are supported")
    fn: dict[str, Any] = {"name": tool.get("name"), "parameters": tool["input_schema"]}
    if tool.get("description") is not None:
        fn["description"] = tool["description"]
    return fn


def _tool_choice(choice: Any) -> tuple[Any, bool | None]:
    if not isinstance(choice, dict):
        raise TranslationError("'tool_choice' must be an object", "tool_choice")
    kind = choice.get("type")
    parallel = None if choice.get("disable_parallel_tool_use") is None else not choice["disable_parallel_tool_use"]
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}, parallel
    raise TranslationError("'tool_choice.type' must be one of auto, any, tool, none", "tool_choice.type")


def messages_to_chat(body: dict[str, Any], *, require_max_tokens: bool = True) -> dict[str, Any]:
    """An Anthropic Messages request body -> an OpenAI chat-completion request body."""
    for name in REFUSED_FIELDS:
        if body.get(name):
            raise refuse(name)
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled"):
        raise refuse("thinking", "is not supported: conch's local models do not produce thinking blocks")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise TranslationError("'model' is required", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise TranslationError("'messages' must be a non-empty array", "messages")
    chat: dict[str, Any] = {"model": body["model"], "messages": []}
    system = body.get("system")
    if system is not None:
        chat["messages"].append({"role": "system", "content": _text_of(system, "system")})
    for i, msg in enumerate(messages):
        chat["messages"].extend(_convert_message(i, msg))
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        if require_max_tokens:
            raise TranslationError("'max_tokens' is required", "max_tokens")
    elif not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise TranslationError("'max_tokens' must be a positive integer", "max_tokens")
    else:
        chat["max_tokens"] = max_tokens
    # Anthropic's default temperature is 1.0, not conch's 0.7.
    chat["temperature"] = 1.0 if body.get("temperature") is None else body["temperature"]
    for key in ("top_p", "top_k"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    if body.get("tools"):
        chat["tools"] = function_tools(body["tools"], _function)
    if body.get("tool_choice") is not None:
        choice, parallel = _tool_choice(body["tool_choice"])
        if "tools" in chat or choice == "none":
            chat["tool_choice"] = choice
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    output = body.get("output_config")
    if output is not None:
        if not isinstance(output, dict):
            raise TranslationError("'output_config' must be an object", "output_config")
        if output.get("effort") is not None:
            raise refuse("output_config.effort", "is not supported: conch's local models do not reason")
        fmt = output.get("format")
        if fmt is not None:
            if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
                raise TranslationError("'output_config.format' must be {type: json_schema, schema: {...}}",
                                       "output_config.format")
            chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# -- response --------------------------------------------------------------------------------
def message_id(chat_id: str | None = None) -> str:
    suffix = (chat_id or "").removeprefix("chatcmpl-") or uuid.uuid4().hex
    return f"msg_{suffix}"


def _stop(choice: dict[str, Any]) -> tuple[str, str | None]:
    reason = choice.get("finish_reason") or "stop"
    matched = choice.get("stop_reason")
    if reason == "stop" and isinstance(matched, str):
        return "stop_sequence", matched
    return STOP_REASONS.get(reason, "end_turn"), None


def _tool_input(arguments: str) -> Any:
    try:
        return json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {}


def chat_to_message(completion: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` -> an Anthropic ``message``."""
    choice = completion["choices"][0]
    msg = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for call in msg.get("tool_calls") or []:
        fn = call["function"]
        content.append({"type": "tool_use", "id": call["id"], "name": fn["name"], "input": _tool_input(fn.get("arguments", ""))})
    stop_reason, stop_sequence = _stop(choice)
    usage = completion.get("usage") or {}
    return {
        "id": message_id(completion.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model or completion.get("model", ""),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0)},
    }


Event = tuple[str, dict[str, Any]]


class MessageStream(ChatStreamTranslator[Event]):
    """Chat chunks in, Anthropic stream events out (a state machine; no I/O)."""

    def __init__(self, model: str, input_tokens: int = 0, msg_id: str | None = None) -> None:
        self.model = model
        self.id = msg_id or message_id()
        self.input_tokens = input_tokens
        self.output_tokens = 0
        self.block = -1          # index of the last opened content block
        self.open: str | None = None  # kind of the open block ("text" | "tool_use"), if any
        self.stop_reason = "end_turn"
        self.stop_sequence: str | None = None
        self.created = int(time.time())

    def start(self) -> list[Event]:
        message: dict[str, Any] = {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.block})]

    def _open(self, block: dict[str, Any]) -> list[Event]:
        events = self._close()
        self.block += 1
        self.open = block["type"]
        events.append(("content_block_start", {"type": "content_block_start", "index": self.block, "content_block": block}))
        return events

    def on_usage(self, usage: dict[str, Any]) -> None:
        self.input_tokens = usage.get("prompt_tokens", self.input_tokens)
        self.output_tokens = usage.get("completion_tokens", self.output_tokens)

    def on_text(self, text: str, choice: dict[str, Any]) -> list[Event]:
        events = self._open({"type": "text", "text": ""}) if self.open != "text" else []
        events.append(("content_block_delta", {"type": "content_block_delta", "index": self.block,
                                               "delta": {"type": "text_delta", "text": text}}))
        return events

    def on_tool_call(self, call_id: str | None, name: str, arguments: str | None) -> list[Event]:
        events = self._open({"type": "tool_use", "id": call_id, "name": name, "input": {}}) if call_id else []
        if arguments:
            events.append(("content_block_delta", {"type": "content_block_delta", "index": self.block,
                                                   "delta": {"type": "input_json_delta", "partial_json": arguments}}))
        return events

    def on_finish(self, choice: dict[str, Any]) -> None:
        self.stop_reason, self.stop_sequence = _stop(choice)

    def finish(self) -> list[Event]:
        events = self._close()
        events.append(("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
        }))
        events.append(("message_stop", {"type": "message_stop"}))
        return events
