"""Translations between other vendors' wire formats and conch's OpenAI chat format.

Pure functions over JSON-shaped dicts: a request in the vendor's shape becomes an OpenAI
chat-completion request body (validated afterwards by the chat request model), and the
chat completion (or its chunks) becomes the vendor's response (or stream events). Nothing
here does I/O or knows about HTTP; the routers in ``conch.web.inference`` call them.

A field the target cannot honour raises :class:`TranslationError` naming it, so the router
answers ``400`` in the vendor's error shape instead of silently dropping it.
"""

from __future__ import annotations


class TranslationError(ValueError):
    """A request field that cannot be translated or honoured; ``param`` names it."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def refuse(param: str, why: str = "is not supported by conch") -> TranslationError:
    return TranslationError(f"'{param}' {why}", param)
