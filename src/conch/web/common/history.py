"""The last 15 minutes of a server's own figures, sampled by the server every 2 seconds.

A client that charts a server (the studio's Status page) used to sample Prometheus
``/metrics`` itself: its charts started empty on every visit, and its rates were timed by the
*browser*, between the moments it sent two scrapes, however late a busy event loop answered
them. Here the server samples itself: rates are counter differences over the server's own
monotonic clock between two readings, and a small ring buffer keeps the last ``window_s``
seconds, so a chart is full on arrival (``GET /v1/status/history`` on the inference server,
``GET /api/v1/status/history`` on the agent server).

A server describes what it samples with :class:`Figure` s: a ``counter`` (cumulative, charted
as its rate per second over each sample's period) or a ``gauge`` (charted as read). Each
sample is ``{"t": unix seconds, "dt": seconds since the previous sample, <name>: value}``; a
figure that cannot be read (no GPU, no ``/proc``) is ``null``.

A counter ``held_by`` a gauge (tokens, by the sequences being generated) is not read as 0 for
a period in which the gauge stayed above 0 but the counter did not move: one engine step of
several sequences on a busy CPU can outlast a period (measured: 5 s between two tokens of one
stream on a 2-core machine running 9 other jobs), and "0 tokens/s" beside "1 active sequence"
reads as a hang. Such a sample's rate is the counter's average over the span back to the last
reading at which it was lower, as long as the gauge stayed above 0 all along (at most
:data:`HOLD_S`); the sample names that span in ``spans`` (``{<name>: seconds}``). A counter
that did not move while nothing was active reads 0.

Requests the client marks as its own polling (the ``X-Conch-Poll`` header, see
:data:`POLL_HEADER`) and monitoring routes are not traffic: :meth:`HTTPMetrics.count_request`
keeps them out of the ``requests`` counter sampled here, so an idle server charts 0 requests/s
however many pages watch it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Query

# Both servers' history routes: the ``since`` parameter and what the route returns.
HistorySince = Annotated[float | None, Query(
    ge=0, allow_inf_nan=False,
    description="Unix time (seconds): only the samples taken after it (a poll's last `t`).",
)]
HISTORY_ROUTE = (
    "The last 15 minutes of this server's figures, sampled by the server every 2 s: "
    "`{now, period_s, window_s, figures: {name: {kind, unit, help}}, samples: [{t, dt, ...}]}`; "
    "a counter's sample is its rate per second over `dt` (docs/studio.md, \"Status history\")."
)

log = logging.getLogger(__name__)

PERIOD_S = 2.0
WINDOW_S = 900.0  # 15 minutes
HOLD_S = 60.0  # the longest span a held counter's rate is averaged over

# A request carrying this header (any non-empty value; the studio sends ``studio``) is a
# client's polling, not traffic: counted in ``/metrics`` as any request, left out of the
# request rates of the history. Browsers send it cross-origin, so the CORS layer allows it.
POLL_HEADER = "x-conch-poll"

# Routes of monitoring (scrapes, health probes, status and history reads): never traffic.
MONITORING_ROUTES = frozenset(
    {
        "/metrics",
        "/health",
        "/v1/health",
        "/v1/status",
        "/v1/status/history",
        "/api/ps",
        "/api/v1/status/history",
        "/api/v1/orchestration/metrics",
    }
)


@dataclass(frozen=True)
class Figure:
    """One series: its name in a sample (a counter's name says it is per second), what it
    is, its unit, and how it is read."""

    name: str
    kind: Literal["counter", "gauge"]
    unit: str
    help: str
    held_by: str | None = None  # a gauge above 0 while this counter is expected to move


Reading = dict[str, float | None]


def resident_memory_bytes() -> float | None:
    """This process's resident memory, as ``process_resident_memory_bytes`` reads it (from
    ``/proc``); None where there is none."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return float(int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return None


class StatusHistory:
    """Samples ``read()`` every ``period_s`` seconds (from :meth:`start` to :meth:`close`)
    and keeps the last ``window_s`` seconds of samples."""

    def __init__(
        self,
        figures: tuple[Figure, ...],
        read: Callable[[], Awaitable[Reading]],
        period_s: float = PERIOD_S,
        window_s: float = WINDOW_S,
    ) -> None:
        self.figures = figures
        self.read = read
        self.period_s = period_s
        self.window_s = window_s
        self.samples: deque[dict[str, Any]] = deque(maxlen=max(1, math.ceil(window_s / period_s)))
        # The readings of the last HOLD_S seconds (monotonic time, figures), newest last.
        self._readings: deque[tuple[float, Reading]] = deque(maxlen=math.ceil(HOLD_S / period_s) + 1)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="conch-status-history")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        # Each sample is due a period after the previous one was due, not after it finished,
        # so the samples stay on a regular grid; a late one is not made up twice.
        due = time.monotonic()
        while True:
            try:
                await self.sample()
            except Exception:  # a figure failing to read must not end the history
                log.exception("status history: a sample failed")
            due += self.period_s
            now = time.monotonic()
            if due < now:
                due = now + self.period_s
            await asyncio.sleep(due - now)

    async def sample(self) -> dict[str, Any] | None:
        """Read the figures now; keep and return the sample (None for the first reading,
        which only sets the counters' baseline)."""
        reading = await self.read()
        mono, wall = time.monotonic(), time.time()
        last = self._readings[-1] if self._readings else None
        self._readings.append((mono, reading))
        if last is None:
            return None
        dt = mono - last[0]
        out: dict[str, Any] = {"t": round(wall, 3), "dt": round(dt, 3)}
        spans: dict[str, float] = {}
        for f in self.figures:
            value = reading.get(f.name)
            if f.kind == "gauge":
                out[f.name] = value
                continue
            before = last[1].get(f.name)
            if value is None or before is None or dt <= 0:
                out[f.name] = None
            elif value < before:
                # A counter that went back (an engine unloaded without its figures kept) is
                # read as a restart from 0, as Prometheus reads a counter reset.
                out[f.name] = round(value / dt, 3)
            elif value == before and f.held_by and reading.get(f.held_by) and last[1].get(f.held_by):
                out[f.name], span = self._held_rate(f, mono, value)
                if span:
                    spans[f.name] = round(span, 3)
            else:
                out[f.name] = round((value - before) / dt, 3)
        if spans:
            out["spans"] = spans
        self.samples.append(out)
        return out

    def _held_rate(self, f: Figure, mono: float, value: float) -> tuple[float, float | None]:
        """A held counter that did not move this period: its average since the last reading
        at which it was lower, while its gauge stayed above 0 (module doc); else 0."""
        for then, earlier in reversed(list(self._readings)[:-1]):
            count = earlier.get(f.name)
            if count is None:
                break
            if count < value:
                return round((value - count) / (mono - then), 3), mono - then
            if not earlier.get(f.held_by or ""):
                break
        return 0.0, None

    def to_dict(self, since: float | None = None) -> dict[str, Any]:
        """The route's body: the samples after ``since`` (unix seconds; all when None)."""
        samples = [s for s in self.samples if since is None or s["t"] > since]
        return {
            "now": round(time.time(), 3),
            "period_s": self.period_s,
            "window_s": self.window_s,
            "figures": {f.name: {"kind": f.kind, "unit": f.unit, "help": f.help} for f in self.figures},
            "samples": samples,
        }
