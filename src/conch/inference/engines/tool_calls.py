"""Tool calls as text: the ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` convention.

Local models see tools and tool traffic as text (Hermes/Qwen style, which SmolLM2 was tuned
on): :func:`render_messages` writes OpenAI messages that way for a chat template, and
:func:`parse_tool_calls` reads the model's answer back into OpenAI-shaped calls. Both halves
live here so they cannot drift apart; the engine that renders decides whether to use it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from conch.inference.engines.base import MEDIA_MARKER, ChatInputError, ToolSpec

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"


def content_text(content: Any, param: str) -> str:
    """A message ``content``: a string, an array of text parts, or null. An ``image`` part (an
    image the serving layer took out into ``ChatSpec.images``) is the media marker, where a
    vision engine puts the image's tokens."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for i, part in enumerate(content):
        ptype = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
        if ptype == "image":
            parts.append(MEDIA_MARKER)
            continue
        if ptype != "text" or not isinstance(text, str):
            raise ChatInputError(
                f"Only text content parts are supported; got type {ptype!r}", f"{param}[{i}].type"
            )
        parts.append(text)
    return "".join(parts)


def render_messages(messages: list[dict[str, Any]], tools: list[ToolSpec], inject_tools: bool) -> list[dict[str, Any]]:
    """Plain role/content messages for the chat template (tool traffic rendered as text)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role = m["role"]
        text = content_text(m.get("content"), f"messages[{i}].content")
        if role == "developer":
            role = "system"
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c["function"]
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except json.JSONDecodeError:
                    # Arguments a client wrote as non-JSON text are shown to the model as they are.
                    args = fn.get("arguments")
                calls.append(f"{TOOL_OPEN}{json.dumps({'name': fn['name'], 'arguments': args})}{TOOL_CLOSE}")
            text = (text + "\n" if text else "") + "\n".join(calls)
        if role == "tool":
            # ChatML templates rarely know the tool role; a tagged user turn keeps the meaning.
            role = "user"
            text = f"<tool_response>\n{text}\n</tool_response>"
        out.append({"role": role, "content": text})
    if tools and inject_tools:
        listing = "\n".join(
            json.dumps({"type": "function", "function": {"name": t.name, "description": t.description or "", "parameters": t.parameters}})
            for t in tools
        )
        instructions = (
            "You can call functions. The available tools are:\n<tools>\n"
            f"{listing}\n</tools>\n"
            "To call a function, reply with "
            f'{TOOL_OPEN}{{"name": <function-name>, "arguments": <arguments-object>}}{TOOL_CLOSE}'
        )
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + instructions}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out


def tool_call_schema(tools: list[ToolSpec]) -> dict[str, Any]:
    """JSON Schema of one call's object (``{"name", "arguments"}``) to any of ``tools``."""
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.name},
                "arguments": t.parameters or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def parse_tool_calls(text: str, tools: list[ToolSpec]) -> tuple[str, list[dict[str, Any]]]:
    """Split generated text into leading content and OpenAI-shaped tool calls."""
    names = {t.name for t in tools}
    calls: list[dict[str, Any]] = []
    start = text.find(TOOL_OPEN)
    if start < 0:
        return text, calls
    content = text[:start].strip()
    rest = text[start:]
    decoder = json.JSONDecoder()
    while rest.startswith(TOOL_OPEN):
        body = rest[len(TOOL_OPEN) :].lstrip()
        try:
            obj, end = decoder.raw_decode(body)
        except json.JSONDecodeError:
            # A call cut short (max_tokens) is no call: the text is returned as content below.
            break
        if isinstance(obj, dict) and obj.get("name") in names:
            args = obj.get("arguments", {})
            calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": obj["name"], "arguments": json.dumps(args)},
                }
            )
        rest = body[end:].lstrip()
        if rest.startswith(TOOL_CLOSE):
            rest = rest[len(TOOL_CLOSE) :].lstrip()
    if not calls:
        return text, calls
    return content, calls


def safe_prefix(text: str) -> int:
    """How much of ``text`` can be streamed as content: all of it up to a (possible) ``<tool_call>``."""
    cut = text.find(TOOL_OPEN)
    if cut >= 0:
        return cut
    for k in range(min(len(TOOL_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(TOOL_OPEN[:k]):
            return len(text) - k
    return len(text)
