"""OpenAI Responses API (stateless subset) <-> OpenAI chat completions.

``responses_to_chat`` turns a ``POST /v1/responses`` body into a chat request body;
``chat_to_response`` turns the chat completion into a ``response`` object;
:class:`ResponseStream` turns chat chunks into the typed stream events (``response.created``,
``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta`` / ``.done``, ``response.function_call_arguments.delta`` /
``.done``, ``response.content_part.done``, ``response.output_item.done``,
``response.completed`` or ``response.incomplete``).

conch stores no responses: ``previous_response_id``, ``conversation``, ``item_reference`` and
``background`` are refused with a 400 saying to send the whole conversation as ``input``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from conch.inference.api.dialect import TranslationError, function_tools, joined_text, refuse
from conch.inference.api.stream import ChatStreamTranslator

STATELESS = ("conch does not store responses; send the whole conversation as 'input' "
             "(earlier output items included)")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# -- request ---------------------------------------------------------------------------------
def _part_text(part: Any, param: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text"):
        return str(part.get("text", ""))
    if kind == "refusal":
        return str(part.get("refusal", ""))
    raise refuse(param, f"is a '{kind}' part; only text parts are supported")


def _content_text(content: Any, param: str) -> str:
    return joined_text(content, param, "content parts", _part_text)


def _input_messages(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise TranslationError("'input' must be a string or a non-empty array of items", "input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise TranslationError(f"'{param}' must be an object", param)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise TranslationError(f"'{param}.role' must be user, assistant, system or developer", f"{param}.role")
            out.append({"role": role, "content": _content_text(item.get("content", ""), f"{param}.content")})
        elif kind == "function_call":
            args = item.get("arguments", "")
            try:
                json.loads(args or "{}")
            except (TypeError, json.JSONDecodeError):
                raise TranslationError(f"'{param}.arguments' is not valid JSON", f"{param}.arguments")
            call = {"id": str(item.get("call_id") or ""), "type": "function",
                    "function": {"name": str(item.get("name", "")), "arguments": args or "{}"}}
            last = out[-1] if out else None
            # Consecutive calls (and the text before them) are one assistant turn in chat form.
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if not last.get("content"):
                    last["content"] = None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                        "content": _content_text(item.get("output", ""), f"{param}.output")})
        elif kind == "reasoning":
            continue  # reasoning of an earlier turn; the local models neither need nor produce it
        elif kind == "item_reference":
            raise refuse(param, f"is an item reference: {STATELESS}")
        else:
            raise refuse(f"{param}.type", f"'{kind}' is not supported; use message, function_call and function_call_output items")
    return out


def _function(tool: Any, param: str) -> dict[str, Any]:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        raise refuse(f"{param}.type", f"'{kind}' is not supported; conch runs function tools only")
    fn: dict[str, Any] = {"name": tool.get("name"), "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
    for key in ("description", "strict"):
        if tool.get(key) is not None:
            fn[key] = tool[key]
    return fn


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    kind = choice.get("type") if isinstance(choice, dict) else choice
    raise refuse("tool_choice", f"'{kind}' is not supported; use auto, none, required or a function")


def _format(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, dict):
        raise TranslationError("'text' must be an object", "text")
    if text.get("verbosity") not in (None, "medium"):
        raise refuse("text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise TranslationError("'text.format.schema' must be a JSON Schema object", "text.format.schema")
        spec: dict[str, Any] = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
        for key in ("description", "strict"):
            if fmt.get(key) is not None:
                spec[key] = fmt[key]
        return {"type": "json_schema", "json_schema": spec}
    raise TranslationError("'text.format.type' must be text, json_object or json_schema", "text.format.type")


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses API request body -> an OpenAI chat-completion request body."""
    for name in ("previous_response_id", "conversation"):
        if body.get(name):
            raise refuse(name, f"is not supported: {STATELESS}")
    if body.get("background"):
        raise refuse("background", "is not supported: conch answers in the foreground (use stream)")
    if body.get("prompt"):
        raise refuse("prompt", "is not supported: conch has no stored prompt templates")
    if body.get("truncation") not in (None, "disabled"):
        raise refuse("truncation", "'auto' is not supported: conch never drops input items")
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and (reasoning.get("effort") or reasoning.get("summary")):
        raise refuse("reasoning", "is not supported: conch's local models do not reason")
    include = [x for x in body.get("include") or [] if x != "message.output_text.logprobs"]
    if include:
        raise refuse("include", f"values {include} are not supported (only message.output_text.logprobs)")
    if body.get("max_tool_calls") is not None:
        raise refuse("max_tool_calls")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise TranslationError("'model' is required", "model")
    if "input" not in body:
        raise TranslationError("'input' is required", "input")
    messages = _input_messages(body["input"])
    if body.get("instructions"):
        messages.insert(0, {"role": "system", "content": str(body["instructions"])})
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    # The Responses API samples at temperature 1.0 by default, not conch's chat default 0.7.
    chat["temperature"] = 1.0 if body.get("temperature") is None else body["temperature"]
    for key in ("top_p", "parallel_tool_calls", "user"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("tools"):
        chat["tools"] = function_tools(body["tools"], _function)
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("text") is not None:
        fmt = _format(body["text"])
        if fmt is not None:
            chat["response_format"] = fmt
    top = body.get("top_logprobs")
    if top is not None or "message.output_text.logprobs" in (body.get("include") or []):
        chat["logprobs"] = True
        chat["top_logprobs"] = top or 0
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# -- response --------------------------------------------------------------------------------
def _echo(body: dict[str, Any]) -> dict[str, Any]:
    """The request settings a Response object repeats back."""
    fmt = (body.get("text") or {}).get("format") or {"type": "text"}
    tools = []
    for t in body.get("tools") or []:
        tools.append({"type": "function", "name": t.get("name"), "description": t.get("description"),
                      "parameters": t.get("parameters") or {"type": "object", "properties": {}},
                      "strict": bool(t.get("strict", False))})
    return {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "temperature": 1.0 if body.get("temperature") is None else body["temperature"],
        "text": {"format": fmt},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": tools,
        "top_p": 1.0 if body.get("top_p") is None else body["top_p"],
        "top_logprobs": body.get("top_logprobs"),
        "truncation": "disabled",
        "user": body.get("user"),
        "background": False,
    }


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    n_in, n_out = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": n_in + n_out}


def _logprobs(chat_logprobs: Any) -> list[dict[str, Any]]:
    if not chat_logprobs:
        return []
    return [dict(item) for item in chat_logprobs.get("content") or []]


def _message_item(item_id: str, text: str, logprobs: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id,
            "name": name, "arguments": arguments}


def _status(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def chat_to_response(completion: dict[str, Any], body: dict[str, Any], *, response_id: str | None = None,
                     created_at: int | None = None) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` -> a Responses API ``response``."""
    choice = completion["choices"][0]
    msg = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    if msg.get("content") or not msg.get("tool_calls"):
        output.append(_message_item(_new_id("msg"), msg.get("content") or "", _logprobs(choice.get("logprobs")), "completed"))
    for call in msg.get("tool_calls") or []:
        fn = call["function"]
        output.append(_call_item(_new_id("fc"), call["id"], fn["name"], fn.get("arguments", ""), "completed"))
    status, incomplete = _status(choice.get("finish_reason"))
    # The limit cut short the item being written, the last one; those before it were finished.
    output[-1]["status"] = status
    return {
        "id": response_id or _new_id("resp"),
        "object": "response",
        "created_at": created_at or completion.get("created") or int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "model": body.get("model") or completion.get("model"),
        "output": output,
        "usage": _usage(completion.get("usage")),
        **_echo(body),
    }


Event = dict[str, Any]


class ResponseStream(ChatStreamTranslator[Event]):
    """Chat chunks in, Responses stream events out (a state machine; no I/O)."""

    def __init__(self, body: dict[str, Any], response_id: str | None = None) -> None:
        self.body = body
        self.id = response_id or _new_id("resp")
        self.created_at = int(time.time())
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the output item being streamed
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def _response(self, status: str, incomplete: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "error": None, "incomplete_details": incomplete, "model": self.body.get("model"),
            "output": [dict(o) for o in self.output],
            "usage": _usage(self.usage) if status != "in_progress" else None,
            **_echo(self.body),
        }

    def start(self) -> list[Event]:
        return [self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress"))]

    def _close(self, status: str = "completed") -> list[Event]:
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.output)
        events: list[Event] = []
        if item["type"] == "message":
            part = item["content"][0]
            events.append(self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                      content_index=0, text=part["text"], logprobs=part["logprobs"]))
            events.append(self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                      content_index=0, part=dict(part)))
        else:
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                      arguments=item["arguments"]))
        item["status"] = status
        self.output.append(item)
        events.append(self._event("response.output_item.done", output_index=index, item=dict(item)))
        return events

    def _open(self, item: dict[str, Any]) -> list[Event]:
        events = self._close()
        index = len(self.output)
        self.open = item
        added = dict(item)
        if item["type"] == "message":
            added["content"] = []
        events.append(self._event("response.output_item.added", output_index=index, item=added))
        if item["type"] == "message":
            events.append(self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                      content_index=0, part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
        return events

    def on_usage(self, usage: dict[str, Any]) -> None:
        self.usage = usage

    def on_text(self, text: str, choice: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        if self.open is None or self.open["type"] != "message":
            events += self._open(_message_item(_new_id("msg"), "", [], "in_progress"))
        assert self.open is not None
        part = self.open["content"][0]
        part["text"] += text
        logprobs = _logprobs(choice.get("logprobs"))
        part["logprobs"].extend(logprobs)
        events.append(self._event("response.output_text.delta", item_id=self.open["id"], output_index=len(self.output),
                                  content_index=0, delta=text, logprobs=logprobs))
        return events

    def on_tool_call(self, call_id: str | None, name: str, arguments: str | None) -> list[Event]:
        events = self._open(_call_item(_new_id("fc"), call_id, name, "", "in_progress")) if call_id else []
        if arguments and self.open is not None and self.open["type"] == "function_call":
            self.open["arguments"] += arguments
            events.append(self._event("response.function_call_arguments.delta", item_id=self.open["id"],
                                      output_index=len(self.output), delta=arguments))
        return events

    def on_finish(self, choice: dict[str, Any]) -> None:
        self.finish_reason = choice["finish_reason"]

    def finish(self) -> list[Event]:
        status, incomplete = _status(self.finish_reason)
        # Only the item open when generation ended can have been cut short by the limit.
        events = self._close(status)
        if not self.output:
            # Nothing was generated: still one (empty) message, as a plain response has.
            events += self._open(_message_item(_new_id("msg"), "", [], "in_progress"))
            events += self._close(status)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        events.append(self._event(kind, response=self._response(status, incomplete)))
        return events

    def error(self, message: str, code: str | None = None, param: str | None = None) -> list[Event]:
        return [self._event("error", code=code, message=message, param=param)]


# Chat request fields whose Responses name differs (the rest are named alike).
_CHAT_PARAMS = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
                "response_format": "text.format", "logprobs": "top_logprobs"}


def chat_param(param: str | None) -> str | None:
    """The Responses request field a chat request field came from, for errors the chat layer
    reports (``messages[2].content`` -> ``input``, ``tools[0].function.name`` -> ``tools[0].name``)."""
    if param is None:
        return None
    head, dot, rest = param.partition(".")
    name = head.partition("[")[0]
    if name == "messages":
        # Instructions and merged function calls shift the indices: name the whole input.
        return "input"
    if name in _CHAT_PARAMS:
        return _CHAT_PARAMS[name]
    if name in ("tools", "tool_choice"):
        return (head + dot + rest.removeprefix("function.").removeprefix("function")).rstrip(".")
    return param


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
