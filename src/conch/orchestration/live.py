"""Live-only events of tasks: the model's turns as they are generated (text, thinking text,
tool calls as they form, with the time and tokens so far), for the subscribers of a task's
event stream that asked for them (``?deltas=true``).

Nothing here is stored: these events are not rows of ``orch_events``, carry no event number,
and are neither replayed to a subscriber that joins later nor to one that resumes with
``Last-Event-ID``. Only the server running the task has them.

A turn streams from the model only when, as it starts, someone watches its task
(:meth:`Live.begin`); a task no one watches pays a few dictionary operations per model turn.
A subscriber that joins during a turn that started less than :data:`RESTREAM_S` ago has the
turn asked again, streamed (:meth:`Live.hold`): the common case of a client that creates a
task and at once opens its stream, which would otherwise miss the whole first turn, at the
cost of at most that much model time. One that joins later hears that the turn is under way
(``model_start`` with ``streamed: false``) and its end, and the deltas from the next turn on.
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
# A model request not streamed is asked again, streamed, for a subscriber that joins within
# this many seconds of its start (the work thrown away is at most this much).
RESTREAM_S = 3.0


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


class _Turn:
    """A model turn under way: its step and number, when it and its task started, and its
    request while it is not streamed (:meth:`Live.hold`)."""

    __slots__ = ("at", "request", "since", "step", "turn")

    def __init__(self, step: int, turn: int, at: float, since: float | None) -> None:
        self.step, self.turn, self.at, self.since = step, turn, at, since
        self.request: asyncio.Future[Any] | None = None


class Live:
    """The live subscribers of each task stream, and the model turn each task is in."""

    def __init__(self) -> None:
        self._feeds: dict[str, set[Feed]] = {}
        # stream -> the model turn under way
        self._turns: dict[str, _Turn] = {}

    def subscribe(self, stream: str) -> Feed:
        feed = Feed()
        self._feeds.setdefault(stream, set()).add(feed)
        t = self._turns.get(stream)
        if t is not None:
            young = time.time() - t.at < RESTREAM_S
            if young and t.request is not None and not t.request.done():
                # Asked again, streamed: its ``model_start`` comes then.
                t.request.cancel()
            else:
                feed.put("model_start", _start(t.step, t.turn, t.at, t.since, streamed=False))
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
        self._turns[stream] = _Turn(step, turn, at, since)
        if stream not in self._feeds:
            return None
        self.publish(stream, "model_start", _start(step, turn, at, since, streamed=True))
        return LiveTurn(self, stream, {"step": step, "turn": turn})

    def hold(self, stream: str, request: asyncio.Future[Any]) -> None:
        """``request`` is the turn just begun, not streamed: a subscriber that joins within
        :data:`RESTREAM_S` cancels it (to be asked again, streamed: :meth:`restarted`)."""
        t = self._turns.get(stream)
        if t is not None:
            t.request = request

    def restarted(self, stream: str, request: asyncio.Future[Any]) -> bool:
        """Whether ``request`` was cancelled by a subscriber that joined (then the turn is
        forgotten, to begin again); False for any other end."""
        t = self._turns.get(stream)
        if t is None or t.request is not request or not request.cancelled():
            return False
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            return False  # the run itself is being cancelled
        del self._turns[stream]
        return True

    def end(
        self,
        stream: str,
        live: LiveTurn | None,
        usage: dict[str, int] | None,
        error: str | None = None,
    ) -> None:
        """The turn begun last for ``stream`` ended (with the reply's usage, or an error)."""
        t = self._turns.pop(stream, None)
        if t is None or stream not in self._feeds:
            return
        step, turn, at, since = t.step, t.turn, t.at, t.since
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
