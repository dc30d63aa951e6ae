"""What the orchestrator's parts share: the stores, where their calls run, this server's
name and leases, and the live event streams of tasks and workflows.

The task runner (:mod:`.runner`), the workflow scheduler (:mod:`.scheduler`) and the lease
keeper (:mod:`.keeper`) each hold the one :class:`Runtime` of their orchestrator.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from sqlalchemy.engine import Engine

from conch.config import Settings
from conch.orchestration.errors import NotFound
from conch.orchestration.live import Live
from conch.orchestration.store import Stores

RunKind = Literal["task", "workflow"]
TERMINAL_EVENTS = frozenset({"complete", "error"})
# How often a stream, the scheduler and the approval timer look at the database for what
# other servers did (they are woken at once by what this server does).
POLL_S = 0.5


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


class Runtime:
    """The stores and this server's place among the servers sharing them."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.stores = Stores(engine)
        self.instance = f"{uuid.uuid4().hex[:12]}"
        self.lease_s = settings.orchestration_lease_s
        # Set once the orchestrator stops: work cancelled then is given back, not failed.
        self.closing = False
        # SQLite calls are local and take well under a millisecond (WAL, no fsync per
        # commit): they run on the event loop, because a thread doing them would hold the
        # interpreter lock in 5 ms slices against the loop and every request would queue
        # behind it. PostgreSQL calls wait on the network: they go to threads.
        self._inline_db = engine.dialect.name == "sqlite"
        self._db_threads = ThreadPoolExecutor(8, thread_name_prefix="orchestration-db")
        self._listeners: dict[str, set[asyncio.Event]] = {}
        # The live-only events of tasks (model deltas) for the subscribers that asked.
        self.live = Live()

    def lease(self) -> float:
        """When a lease taken or renewed now runs out."""
        return time.time() + self.lease_s

    async def db(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)``, a store call: inline on SQLite, in a thread on PostgreSQL."""
        if self._inline_db:
            return fn(*args, **kw)
        call = functools.partial(fn, *args, **kw)
        return await asyncio.get_running_loop().run_in_executor(self._db_threads, call)

    async def found(
        self, kind: str, read: Callable[[str], dict[str, Any] | None], id: str
    ) -> dict[str, Any]:
        """``read(id)``, or NotFound naming the ``kind`` of thing."""
        record = await self.db(read, id)
        if record is None:
            raise NotFound(f"no {kind} {id!r}")
        return record  # type: ignore[no-any-return]

    def close(self) -> None:
        self._db_threads.shutdown(wait=False)

    # -- event streams --------------------------------------------------------------------

    def notify(self, stream: str) -> None:
        """Wake the readers of ``stream`` (its events were just written by this server)."""
        for ev in self._listeners.get(stream, ()):
            ev.set()

    async def events(
        self, stream: str, after: int = 0, *, live: bool = False
    ) -> AsyncIterator[tuple[int | None, str, Any]]:
        """The stream's events after sequence number ``after``, live, until the terminal one
        (``complete`` or ``error``); a finished run replays and ends at once. ``live``: the
        live-only events of the task as well (:mod:`.live`), numbered None."""
        ev = asyncio.Event()
        self._listeners.setdefault(stream, set()).add(ev)
        feed = self.live.subscribe(stream) if live else None
        try:
            while True:
                ev.clear()
                # Live events taken before the stored ones are read: on SQLite nothing runs
                # between the two, so each comes before the stored events written after it
                # (a turn's deltas before the step it leads to).
                pending = feed.take() if feed is not None else ()
                batch = await self.db(self.stores.db.events_after, stream, after)
                for name, data in pending:
                    yield None, name, data
                for seq, name, data in batch:
                    after = seq
                    yield seq, name, data
                    if name in TERMINAL_EVENTS:
                        return
                if batch or pending:
                    continue
                # Other servers write to the same database: poll as well as listen.
                with contextlib.suppress(TimeoutError):
                    if feed is None:
                        await asyncio.wait_for(ev.wait(), POLL_S)
                    else:
                        await _either(ev, feed.ready, POLL_S)
        finally:
            if feed is not None:
                self.live.unsubscribe(stream, feed)
            listeners = self._listeners.get(stream)
            if listeners is not None:
                listeners.discard(ev)
                if not listeners:
                    self._listeners.pop(stream, None)

    async def finished(
        self,
        stream: str,
        get: Callable[[str], Awaitable[dict[str, Any]]],
        id: str,
        timeout: float | None,
    ) -> dict[str, Any]:
        """``get(id)`` once ``stream`` has ended (``NotFound`` at once for an unknown id)."""

        async def until_done() -> dict[str, Any]:
            async for _seq, name, _data in self.events(stream):
                if name in TERMINAL_EVENTS:
                    break
            return await get(id)

        await get(id)
        return await asyncio.wait_for(until_done(), timeout)


async def _either(a: asyncio.Event, b: asyncio.Event, timeout: float) -> None:
    """Until ``a`` or ``b`` is set (``TimeoutError`` after ``timeout`` s)."""
    waits = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    if not done:
        raise TimeoutError
