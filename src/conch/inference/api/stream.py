"""The walk over conch's OpenAI chat stream that the vendor stream translators share."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

E = TypeVar("E")


class ChatStreamTranslator(Generic[E]):
    """Turns conch's OpenAI chat stream into another protocol's events (``E``).

    The walk over a chunk is here; what each part becomes is the subclass's: ``on_text``,
    ``on_tool_call`` (``call_id`` set on a call's first chunk, ``arguments`` a fragment) and
    ``on_finish`` return the events to send, ``on_usage`` records the counts. Anthropic's and
    the Responses API's streams describe one answer, so only choice 0 is translated."""

    def start(self) -> list[E]:
        """The events that open the stream."""
        raise NotImplementedError

    def finish(self) -> list[E]:
        """The events that close the stream after the last chunk."""
        raise NotImplementedError

    def feed(self, chunk: dict[str, Any]) -> list[E]:
        events: list[E] = []
        usage = chunk.get("usage")
        if usage:
            self.on_usage(usage)
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                events += self.on_text(text, choice)
            for call in delta.get("tool_calls") or ():
                fn = call.get("function") or {}
                events += self.on_tool_call(call.get("id"), fn.get("name", ""), fn.get("arguments"))
            if choice.get("finish_reason"):
                self.on_finish(choice)
        return events

    def on_usage(self, usage: dict[str, Any]) -> None:
        raise NotImplementedError

    def on_text(self, text: str, choice: dict[str, Any]) -> list[E]:
        raise NotImplementedError

    def on_tool_call(self, call_id: str | None, name: str, arguments: str | None) -> list[E]:
        raise NotImplementedError

    def on_finish(self, choice: dict[str, Any]) -> None:
        raise NotImplementedError
