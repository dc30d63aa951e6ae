"""What the inbound dialects share: translations between other vendors' wire formats and
conch's OpenAI chat format.

Pure functions over JSON-shaped dicts: a request in the vendor's shape becomes an OpenAI
chat-completion request body (validated afterwards by the chat request model), and the
chat completion (or its chunks) becomes the vendor's response (or stream events). Nothing
here does I/O or knows about HTTP; the routers in ``conch.web.inference`` call them.

A field the target cannot honour raises :class:`TranslationError` naming it, so the router
answers ``400`` in the vendor's error shape instead of silently dropping it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conch import errors


class TranslationError(errors.Invalid):
    """A request field that cannot be translated or honoured (a 400); ``param`` (``where``)
    names it, ``code`` is the OpenAI error code chat completions gives the same fault (the
    Responses API reports it)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message, where=param, code=code)

    @property
    def param(self) -> str | None:
        return self.where


def refuse(param: str, why: str = "is not supported by conch") -> TranslationError:
    return TranslationError(f"'{param}' {why}", param, code="unsupported_parameter")


def joined_text(content: Any, param: str, parts: str, part_text: Callable[[Any, str], str]) -> str:
    """``content`` as one string: a string as it is, or an array whose every part
    ``part_text(part, "<param>[j]")`` turns into text (or refuses, in its protocol's words);
    ``parts`` names what the array holds in the error for anything else."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TranslationError(f"'{param}' must be a string or an array of {parts}", param)
    return "".join(part_text(part, f"{param}[{j}]") for j, part in enumerate(content))


def function_tools(tools: Any, function: Callable[[Any, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat ``tools`` from a vendor's array of tools: ``function(tool, "tools[i]")`` is each
    tool's chat ``function`` (or refuses the tool, in its protocol's words)."""
    if not isinstance(tools, list):
        raise TranslationError("'tools' must be an array", "tools")
    return [{"type": "function", "function": function(tool, f"tools[{i}]")} for i, tool in enumerate(tools)]
