"""Live-only events of tasks: the model's turns as they are generated (text, thinking text,
tool calls as they form, with the time and tokens so far), for the subscribers of a task's
event stream that asked for them (``?deltas=true``).

Nothing here is stored: these events are not rows of ``orch_events``, carry no event number,
and are neither replayed to a subscriber that joins later nor to one that resumes with
``Last-Event-ID``. Only the server running the task has them.

A turn streams from the model only when, as it starts, someone watches its task
(:meth:`Live.begin`); a task no one watches pays two dictionary operations per model turn.
A subscriber that joins during a turn hears that the turn is under way (``model_start`` with
``streamed: false``) and its end, and the deltas from the next turn on.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from conch.orchestration.store.records import iso

# Live events a subscriber holds before it reads them; beyond that, deltas are dropped and
# the subscriber is told how many (``delta_gap``) rather than the server holding them all.
FEED_LIMIT = 4096


class Feed:
    """One subscriber's live events, in the order they were published."""

    __slots__ = ("dropped", "items", "ready")

    def __init__(self) -> None:
        self.items: deque[tuple[str, dict[str, Any]]] = deque()
        self.ready = asyncio.Event()
        self.dropped = 0

    def put(self, name: str, data: dict[str, Any]) -> None:
        if len(self.items) >= FEED_LIMIT:
            self.dropped += 1
            return
        self.items.append((name, data))
        self.ready.set()

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        """Every event published since the last take (and ``delta_gap`` after them when
        some were dropped)."""
        out = list(self.items)
        self.items.clear()
        self.ready.clear()
        if self.dropped:
            out.append(("delta_gap", {"dropped": self.dropped}))
            self.dropped = 0
        return out


class LiveTurn:
    """A model turn of a watched task, publishing as it goes: :meth:`delta` is the model
    client's ``on_delta``."""

    __slots__ = ("live", "started", "stream", "tag", "tokens")

    def __init__(self, live: Live, stream: str, tag: dict[str, Any]) -> None:
        self.live, self.stream, self.tag = live, stream, tag
        self.started = time.perf_counter()
        self.tokens = 0

    def delta(self, piece: dict[str, Any]) -> None:
        # A streamed chunk is one token on the servers that matter (llama.cpp, vLLM,
        # Ollama, OpenAI); the turn's ``model_end`` carries the exact usage.
        self.tokens += 1
        elapsed = int((time.perf_counter() - self.started) * 1000)
        self.live.publish(
            self.stream,
            "delta",
            {**self.tag, **piece, "tokens": self.tokens, "elapsed_ms": elapsed},
        )


class Live:
    """The live subscribers of each task stream, and the model turn each task is in."""

    def __init__(self) -> None:
        self._feeds: dict[str, set[Feed]] = {}
        # stream -> (step, turn, wall-clock start, task start) of the model turn under way
        self._turns: dict[str, tuple[int, int, float, float | None]] = {}

    def subscribe(self, stream: str) -> Feed:
        feed = Feed()
        self._feeds.setdefault(stream, set()).add(feed)
        under_way = self._turns.get(stream)
        if under_way is not None:
            step, turn, at, since = under_way
            feed.put("model_start", _start(step, turn, at, since, streamed=False))
        return feed

    def unsubscribe(self, stream: str, feed: Feed) -> None:
        feeds = self._feeds.get(stream)
        if feeds is not None:
            feeds.discard(feed)
            if not feeds:
                del self._feeds[stream]

    def watched(self, stream: str) -> bool:
        return stream in self._feeds

    def publish(self, stream: str, name: str, data: dict[str, Any]) -> None:
        for feed in self._feeds.get(stream, ()):
            feed.put(name, data)

    def begin(self, stream: str, step: int, turn: int, since: float | None) -> LiveTurn | None:
        """A model turn of step ``step`` starts (``since``: when the task started); a
        :class:`LiveTurn` to stream it through when someone watches the task, else None."""
        at = time.time()
        self._turns[stream] = (step, turn, at, since)
        if stream not in self._feeds:
            return None
        self.publish(stream, "model_start", _start(step, turn, at, since, streamed=True))
        return LiveTurn(self, stream, {"step": step, "turn": turn})

    def end(
        self,
        stream: str,
        live: LiveTurn | None,
        usage: dict[str, int] | None,
        error: str | None = None,
    ) -> None:
        """The turn begun last for ``stream`` ended (with the reply's usage, or an error)."""
        under_way = self._turns.pop(stream, None)
        if under_way is None or stream not in self._feeds:
            return
        step, turn, at, since = under_way
        now = time.time()
        data: dict[str, Any] = {
            "step": step, "turn": turn, "elapsed_ms": int((now - at) * 1000),
            "tokens": live.tokens if live is not None else (usage or {}).get("completion_tokens", 0),
            "usage": usage or {},
        }  # fmt: skip
        if since is not None:
            data["task_elapsed_ms"] = int((now - since) * 1000)
        if error is not None:
            data["error"] = error
        self.publish(stream, "model_end", data)


def _start(
    step: int, turn: int, at: float, since: float | None, *, streamed: bool
) -> dict[str, Any]:
    data: dict[str, Any] = {"step": step, "turn": turn, "started_at": iso(at), "streamed": streamed}
    if since is not None:
        data["task_elapsed_ms"] = int((time.time() - since) * 1000)
    return data
