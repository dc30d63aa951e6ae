"""What the providers with a wire format of their own (Anthropic, Ollama) share when they
translate conch's OpenAI-shaped chat body into it: content as text, tool-call arguments as
objects, the stop list, and refusing fields the vendor cannot honour.
"""

from __future__ import annotations

import json
from typing import Any

from conch.inference.remote import errors


def text_of(content: Any) -> str:
    """A message's content as text: a string, or the text of its ``{type: text}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def parse_arguments(provider: str, raw: Any) -> dict[str, Any]:
    """A tool call's ``arguments`` JSON string as the object vendors with native tool
    calls want; anything that is not a JSON object is a 400 naming the field."""
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except (TypeError, ValueError):
        value = None
    if not isinstance(value, dict):
        raise errors.UnsupportedByProvider(
            provider, "messages.tool_calls.function.arguments", "must be a JSON object"
        )
    return value


def stop_list(stop: Any) -> list[str] | None:
    if stop is None:
        return None
    return [stop] if isinstance(stop, str) else list(stop)


def refuse(provider: str, body: dict[str, Any], fields: dict[str, Any]) -> None:
    """400 for each field in ``fields`` that ``body`` sets to something other than its
    harmless value (``fields[name]``: the value(s) that may pass, e.g. ``n: 1``)."""
    for name, harmless in fields.items():
        if name not in body or body[name] is None:
            continue
        allowed = harmless if isinstance(harmless, tuple) else (harmless,)
        if body[name] not in allowed:
            raise errors.UnsupportedByProvider(provider, name)
