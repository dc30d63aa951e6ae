"""Limits that hold: admission of a request against its key's limits, shared by every server
through the database, and the usage report.

One call, :meth:`Limiter.admit`, checks everything a request needs at once (a request, tokens,
a run, a session, a model) and records it, all or nothing, in one short transaction; the
request ends with :meth:`Limiter.finish`, which settles what was reserved to what was used
and releases what was held.

Windows. ``requests_per_minute``, ``tokens_per_minute`` and ``runs_per_minute`` are sliding
windows of 60 s; ``tokens_per_day`` and ``cpu_seconds_per_day`` sliding windows of 86,400 s.
They are exact: every admission is a row of ``key_events`` with its time, and a unit counts
until precisely 60 s (or a day) after its admission; there is no bucket edge that lets twice
the limit through, as fixed windows do, and nothing is held longer than the window either.
What keeps this cheap is that the sum is never recomputed: ``key_usage`` holds each window's
running total and the mark up to which it has been pruned, and an admission subtracts only
the events that left the window since the last admission (usually none or one), found by an
index range scan. A key with a day limit keeps a day of events; one without keeps a minute.

Why not a ring of per-second counters in the key's row (two statements instead of three to
five)? Measured on SQLite (``benchmarks/keys.py`` and a prototype of the ring, one thread):
the ring costs 0.07 ms per admission while it holds only a minute, but 0.36-0.51 ms once a
day window's 1,440 per-minute slots are in the row (each admission parses and rewrites them),
and it is exact only to its slot (a minute, for the day). These events cost 0.12 ms per
admission (with authentication) with 20,000 events in the day window. So: exact, and faster
where it matters.

Budgets. A request that may use tokens reserves the most it can use at admission (prompt
tokens + ``max_tokens``), atomically with the check, and :meth:`Limiter.finish` settles the
reservation to the real count, giving back the rest. Concurrent requests on several servers
therefore can never together pass a budget: each one's worst case is counted before it
starts. CPU seconds of a run work the same way (reserve the run's wall-time limit, settle to
what it used); a run is refused once the day's CPU budget is spent. What a request used is
recorded even when it is more than it reserved, so the reservation must be an upper bound
(with no ``max_tokens``, the room left in the model's context).

Concurrency. ``concurrent_runs`` and ``sessions_max`` count leases (``key_leases``): a row
per run or session held, deleted when it ends. A lease has an expiry (renewable), so the
runs of a server that died stop counting once their leases run out.

Atomicity. The admissions of one key are serialised by a lock: on PostgreSQL the key's
``key_usage`` row (``SELECT … FOR UPDATE``), taken first in the transaction; on SQLite the
database's write lock (``BEGIN IMMEDIATE``), so that the read of the totals and the write of
the new ones cannot interleave with another admission's, in this process or another.

Cost. A request whose key sets no limit that the request touches does no database work at
all (authentication is cached by :class:`conch.keys.service.KeyService`). Otherwise one
admission is one transaction of three to five statements, all on one key's rows.

Refusals raise :class:`KeyLimitExceeded` (a :class:`conch.errors.LimitExceeded`, ``429``),
whose ``code`` tells a rate (``rate_limit_exceeded``: the window frees up soon) from an
exhausted budget (``insufficient_quota``), whose ``limit`` names the limit, and whose
``retry_after`` is the seconds until the window has freed enough for this request (``None``
when waiting cannot help: the request alone is larger than the limit, or a session must be
closed first).

Clocks. Times are the servers' own clocks (Unix seconds), which must agree to well within a
second (NTP); a server whose clock is behind never makes the totals inconsistent (an event is
never recorded before a window's mark), it only makes its own windows slide a little late.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from conch.errors import Forbidden, Internal, LimitExceeded
from conch.keys.hashing import new_id
from conch.keys.records import DAY, MINUTE, Principal, iso
from conch.keys.tables import key_events, key_leases, key_usage

RATE = "rate_limit_exceeded"
QUOTA = "insufficient_quota"

# How long a run's lease lives without renewal when the caller does not say: longer than any
# run's wall time by default (stream_wall_time_s is 300 s).
RUN_LEASE_S = 600.0
# A key with a day limit has its day-old events deleted at least this often even when its
# requests only read the minute window (the totals stay right either way: pruning subtracts
# what it deletes).
DAY_GC_S = 3600.0

RUN = "run"
SESSION = "session"


class KeyLimitExceeded(LimitExceeded):
    """A limit of the key refused the request (``429``).

    ``limit``: which (``tokens_per_day`` …); ``code``: ``rate_limit_exceeded`` for a rate,
    ``insufficient_quota`` for a budget; ``retry_after``: seconds until it frees enough, or
    ``None`` when waiting alone cannot help."""

    def __init__(
        self,
        message: str,
        *,
        limit: str,
        code: str,
        retry_after: float | None,
        maximum: float,
        used: float,
        requested: float,
    ) -> None:
        super().__init__(message, retry_after=retry_after, code=code, where=limit)
        self.limit = limit
        self.maximum = maximum
        self.used = used
        self.requested = requested


class ModelNotAllowed(Forbidden, code="model_not_allowed"):
    """The key's ``models`` allow-list does not name this model (``403``)."""

    def __init__(self, model: str, key_name: str) -> None:
        super().__init__(f"key '{key_name}' may not use the model '{model}'", where="model")
        self.model = model


@dataclass(frozen=True, slots=True)
class Admission:
    """What an admission recorded, for :meth:`Limiter.finish`. ``key_id`` None: nothing was
    recorded (no limit applied), and finishing it is free."""

    key_id: str | None = None
    event_id: int | None = None
    tokens: int = 0  # reserved
    cpu_seconds: float = 0.0  # reserved
    run_lease: str | None = None
    session_lease: str | None = None

    @property
    def recorded(self) -> bool:
        return self.key_id is not None


FREE = Admission()


@dataclass(frozen=True, slots=True)
class LimitUsage:
    """One limit of a key as of now."""

    limit: str
    maximum: float
    used: float | None  # None: not known here (disk_mb without a measurement)
    window_s: float | None  # the sliding window; None for concurrency and size limits
    resets_at: float | None  # when ``used`` falls to 0 if nothing more is admitted

    @property
    def remaining(self) -> float | None:
        return None if self.used is None else max(0, self.maximum - self.used)

    def to_dict(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "max": self.maximum,
            "used": self.used,
            "remaining": self.remaining,
            "window_s": self.window_s,
            "resets_at": iso(self.resets_at),
        }


# -- the windows -------------------------------------------------------------------------

# (limit name, event column, total column, window seconds, refusal code)
_MINUTE_LIMITS = (
    ("requests_per_minute", "requests", "requests_m", RATE),
    ("tokens_per_minute", "tokens", "tokens_m", RATE),
    ("runs_per_minute", "runs", "runs_m", RATE),
)
_DAY_LIMITS = (
    ("tokens_per_day", "tokens", "tokens_d", QUOTA),
    ("cpu_seconds_per_day", "cpu", "cpu_d", QUOTA),
)


def _k() -> sa.BindParameter[str]:
    return sa.bindparam("k")


_e, _u, _l = key_events.c, key_usage.c, key_leases.c


class _SQL:
    """The statements, built once (SQLAlchemy caches their compiled form by identity)."""

    state = sa.select(key_usage).where(_u.key_id == _k())
    state_for_update = state.with_for_update()
    # The events that left the minute window since its mark.
    minute_expired = sa.select(
        sa.func.coalesce(sa.func.sum(_e.requests), 0),
        sa.func.coalesce(sa.func.sum(_e.tokens), 0),
        sa.func.coalesce(sa.func.sum(_e.runs), 0),
    ).where(_e.key_id == _k(), _e.at > sa.bindparam("lo"), _e.at <= sa.bindparam("hi"))
    # The events that left every window the key keeps: deleted, their amounts returned to
    # subtract from the totals that still hold them.
    expired = (
        sa.delete(key_events)
        .where(_e.key_id == _k(), _e.at <= sa.bindparam("hi"))
        .returning(_e.at, _e.requests, _e.tokens, _e.runs, _e.cpu)
    )
    insert_event = sa.insert(key_events).returning(_e.id)
    update_state = (
        sa.update(key_usage)
        .where(_u.key_id == _k())
        .values(
            minute_mark=sa.bindparam("minute_mark"),
            day_mark=sa.bindparam("day_mark"),
            requests_m=sa.bindparam("requests_m"),
            tokens_m=sa.bindparam("tokens_m"),
            runs_m=sa.bindparam("runs_m"),
            tokens_d=sa.bindparam("tokens_d"),
            cpu_d=sa.bindparam("cpu_d"),
        )
    )
    event = sa.select(_e.at, _e.tokens, _e.cpu).where(_e.id == sa.bindparam("eid"))
    settle_event = (
        sa.update(key_events)
        .where(_e.id == sa.bindparam("eid"))
        .values(tokens=sa.bindparam("new_tokens"), cpu=sa.bindparam("new_cpu"))
    )
    leases = sa.select(_l.id, _l.expires_at).where(_l.key_id == _k(), _l.kind == sa.bindparam("kind"))
    drop_expired_leases = sa.delete(key_leases).where(
        _l.key_id == _k(), _l.expires_at <= sa.bindparam("now")
    )
    insert_lease = sa.insert(key_leases)
    delete_lease = sa.delete(key_leases).where(_l.id == sa.bindparam("lid"))
    renew_lease = (
        sa.update(key_leases)
        .where(_l.id == sa.bindparam("lid"))
        .values(expires_at=sa.bindparam("new_expires"))
    )


def _in_window(column: str, lo: float) -> sa.Select[Any]:
    """The events still in a window (after ``lo``) that count ``column``, oldest first."""
    col = _e[column]
    return (
        sa.select(_e.at, col)
        .where(_e.key_id == _k(), _e.at > lo, col > 0)
        .order_by(_e.at)
    )


@dataclass(slots=True)
class _State:
    """A key's ``key_usage`` row, read under its lock and written back at the end."""

    minute_mark: float
    day_mark: float
    requests_m: int
    tokens_m: int
    runs_m: int
    tokens_d: int
    cpu_d: float

    @classmethod
    def of(cls, row: Any) -> _State:
        return cls(
            float(row.minute_mark),
            float(row.day_mark),
            int(row.requests_m),
            int(row.tokens_m),
            int(row.runs_m),
            int(row.tokens_d),
            float(row.cpu_d),
        )

    def params(self, key_id: str) -> dict[str, Any]:
        return {
            "k": key_id,
            "minute_mark": self.minute_mark,
            "day_mark": self.day_mark,
            "requests_m": self.requests_m,
            "tokens_m": self.tokens_m,
            "runs_m": self.runs_m,
            "tokens_d": self.tokens_d,
            # Microseconds: sums and differences of floats must not drift into a refusal.
            "cpu_d": round(self.cpu_d, 6),
        }


@dataclass(slots=True)
class _Refusal:
    limit: str
    code: str
    maximum: float
    used: float
    requested: float
    retry_after: float | None
    message: str


def _prune(
    conn: Connection, key_id: str, st: _State, now: float, *, keep_day: bool, day: bool
) -> None:
    """Take out of the totals what left the windows since their marks.

    A key with a day limit (``keep_day``) keeps a day of events: those that left the minute
    are summed and stay; with ``day``, those that left the day are deleted. A key without
    one keeps a minute: what left it is deleted at once (and taken out of the day totals as
    well, so that they stay the sum of the events kept)."""
    cut = now - MINUTE
    if keep_day:
        if cut > st.minute_mark:
            r, t, n = conn.execute(
                _SQL.minute_expired, {"k": key_id, "lo": st.minute_mark, "hi": cut}
            ).one()
            st.requests_m -= int(r)
            st.tokens_m -= int(t)
            st.runs_m -= int(n)
            st.minute_mark = cut
        if day and now - DAY > st.day_mark:
            # Out of the minute already (now - DAY < the minute mark): the day totals only.
            _take_out(st, conn.execute(_SQL.expired, {"k": key_id, "hi": now - DAY}))
            st.day_mark = now - DAY
    elif cut > st.day_mark:
        _take_out(st, conn.execute(_SQL.expired, {"k": key_id, "hi": cut}))
        st.minute_mark = max(st.minute_mark, cut)
        st.day_mark = cut


def _take_out(st: _State, rows: Iterable[Any]) -> None:
    """Subtract deleted events from the totals that held them (all after the day mark)."""
    for row in rows:
        if row.at > st.minute_mark:
            st.requests_m -= int(row.requests)
            st.tokens_m -= int(row.tokens)
            st.runs_m -= int(row.runs)
        st.tokens_d -= int(row.tokens)
        st.cpu_d -= float(row.cpu)


def _retry_after(
    conn: Connection, key_id: str, column: str, window: float, mark: float, need: float, now: float
) -> float | None:
    """Seconds until ``need`` units of ``column`` have left the window (events after ``mark``)."""
    freed = 0.0
    for at, amount in conn.execute(_in_window(column, mark), {"k": key_id}):
        freed += float(amount)
        if freed >= need:
            return max(0.001, at + window - now)
    return None


def _unit(limit: str) -> str:
    if limit.startswith("tokens"):
        return "tokens"
    if limit.startswith("cpu"):
        return "CPU seconds"
    if limit.startswith("runs"):
        return "runs"
    return "requests"


_process_locks: dict[str, threading.Lock] = {}
_process_locks_guard = threading.Lock()


def _process_lock(engine: Engine) -> threading.Lock:
    """One lock per database file, shared by this process's limiters on it."""
    with _process_locks_guard:
        return _process_locks.setdefault(str(engine.url), threading.Lock())


class Limiter:
    """Admission, settlement and usage of keys' limits, on the database every server shares."""

    def __init__(self, engine: Engine, *, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.clock = clock
        self.postgres = engine.dialect.name == "postgresql"
        self.sqlite = engine.dialect.name == "sqlite"
        # SQLite: this process's own writers wait here instead of in SQLite's busy handler
        # (which sleeps in steps of milliseconds); other processes still meet BEGIN IMMEDIATE.
        self._local = _process_lock(engine) if self.sqlite else None

    # -- the lock ------------------------------------------------------------------------

    @contextmanager
    def _locked(self, key_id: str) -> Iterator[tuple[Connection, _State]]:
        """A transaction holding ``key_id``'s lock, with its usage row read under it."""
        if self._local is not None:
            self._local.acquire()
        try:
            with self.engine.connect() as conn:
                try:
                    if self.sqlite:
                        conn.exec_driver_sql("BEGIN IMMEDIATE")
                        row = conn.execute(_SQL.state, {"k": key_id}).first()
                    else:
                        row = conn.execute(_SQL.state_for_update, {"k": key_id}).first()
                    if row is None:
                        raise Internal(f"key {key_id} has no usage record")
                    yield conn, _State.of(row)
                    conn.commit()
                except BaseException:
                    conn.rollback()
                    raise
        finally:
            if self._local is not None:
                self._local.release()

    # -- admission -----------------------------------------------------------------------

    def check_model(self, principal: Principal, model: str) -> None:
        """Raise :class:`ModelNotAllowed` unless the key's allow-list names ``model``."""
        if principal.models is not None and not principal.allows_model(model):
            raise ModelNotAllowed(model, principal.name)

    def admit(
        self,
        principal: Principal,
        *,
        requests: int = 1,
        tokens: int = 0,
        run: bool = False,
        cpu_seconds: float = 0.0,
        session: bool = False,
        model: str | None = None,
        lease_s: float | None = None,
        lease_id: str | None = None,
    ) -> Admission:
        """Admit a request of ``principal``, or raise :class:`KeyLimitExceeded` /
        :class:`ModelNotAllowed` having recorded nothing.

        ``requests``: requests it counts (``requests_per_minute``); ``tokens``: the most
        tokens it can use (reserved); ``run``: it starts a run (``runs_per_minute``, a lease
        against ``concurrent_runs``, and the CPU budget), reserving ``cpu_seconds``;
        ``session``: it opens a session (a lease against ``sessions_max``, held until
        :meth:`release`); ``lease_s``: how long a lease lives without :meth:`renew`
        (default: :data:`RUN_LEASE_S` for a run, until released for a session);
        ``lease_id``: the session lease's id (the session's own, so that whoever deletes the
        session can release it)."""
        if requests < 0 or tokens < 0 or cpu_seconds < 0 or not math.isfinite(cpu_seconds):
            raise ValueError("amounts must be non-negative")
        if model is not None:
            self.check_model(principal, model)
        minute, day, run_lease, session_lease = _touched(principal, requests, tokens, run, session)
        if not (minute or day or run_lease or session_lease):
            return FREE
        return self._admit(
            principal,
            requests=requests,
            tokens=tokens,
            runs=1 if run else 0,
            cpu=float(cpu_seconds),
            minute=bool(minute),
            day=bool(day),
            run_lease=run_lease,
            session_lease=session_lease,
            lease_s=lease_s,
            lease_id=lease_id,
        )

    @staticmethod
    def touches(
        principal: Principal,
        *,
        requests: int = 1,
        tokens: int = 0,
        run: bool = False,
        session: bool = False,
        **_: Any,
    ) -> bool:
        """Whether :meth:`admit` with these arguments would read or write the database (a
        key without a limit they touch is admitted in memory): a caller may then skip
        moving the call off its event loop."""
        return any(_touched(principal, requests, tokens, run, session))

    def _admit(
        self,
        principal: Principal,
        *,
        requests: int,
        tokens: int,
        runs: int,
        cpu: float,
        minute: bool,
        day: bool,
        run_lease: bool,
        session_lease: bool,
        lease_s: float | None,
        lease_id: str | None = None,
    ) -> Admission:
        key_id = principal.key_id
        lim = principal.limits
        demand = {"requests": requests, "tokens": tokens, "runs": runs, "cpu": cpu}
        with self._locked(key_id) as (conn, st):
            # Read after the lock: a waiter must not record an event older than the marks
            # the holder before it advanced.
            now = self.clock()
            keep_day = lim.tokens_per_day is not None or lim.cpu_seconds_per_day is not None
            gc = keep_day and now - DAY - st.day_mark > DAY_GC_S
            if minute or day or gc:
                _prune(conn, key_id, st, now, keep_day=keep_day, day=day or gc)
            refusals: list[_Refusal] = []

            def check(limits: tuple[tuple[str, str, str, str], ...], window: float) -> None:
                mark = st.minute_mark if window == MINUTE else st.day_mark
                for name, col, total, code in limits:
                    maximum = getattr(lim, name)
                    if maximum is None or (col == "cpu" and not runs):
                        continue
                    refusal = self._check(conn, key_id, name, col, code, maximum,
                                          getattr(st, total), demand[col], window, mark, now)
                    if refusal is not None:
                        refusals.append(refusal)

            if minute:
                check(_MINUTE_LIMITS, MINUTE)
            if day:
                check(_DAY_LIMITS, DAY)
            leases: dict[str, str] = {}
            held: list[tuple[str, str, int]] = []
            if run_lease:
                held.append((RUN, "concurrent_runs", int(lim.concurrent_runs or 0)))
            if session_lease:
                held.append((SESSION, "sessions_max", int(lim.sessions_max or 0)))
            if held:
                conn.execute(_SQL.drop_expired_leases, {"k": key_id, "now": now})
                for kind, name, maximum in held:
                    active = len(conn.execute(_SQL.leases, {"k": key_id, "kind": kind}).all())
                    if active + 1 > maximum:
                        refusals.append(self._lease_refusal(name, kind, maximum, active))
            if refusals:
                raise _error(refusals)
            event_id: int | None = None
            if minute or day:
                # Never at or before a mark: the event would be in the totals but never pruned.
                at = max(now, math.nextafter(st.minute_mark, math.inf),
                         math.nextafter(st.day_mark, math.inf))
                event_id = int(
                    conn.execute(
                        _SQL.insert_event,
                        {"key_id": key_id, "at": at, **demand},
                    ).scalar_one()
                )
                st.requests_m += requests
                st.tokens_m += tokens
                st.runs_m += runs
                st.tokens_d += tokens
                st.cpu_d += cpu
            if minute or day or gc:
                conn.execute(_SQL.update_state, st.params(key_id))
            for kind, _name, _maximum in held:
                if kind == RUN:
                    expires: float | None = now + (RUN_LEASE_S if lease_s is None else lease_s)
                else:
                    expires = None if lease_s is None else now + lease_s
                lid = lease_id if kind == SESSION and lease_id else new_id("lease_")
                conn.execute(
                    _SQL.insert_lease,
                    {"id": lid, "key_id": key_id, "kind": kind, "acquired_at": now,
                     "expires_at": expires},
                )
                leases[kind] = lid
        return Admission(
            key_id=key_id,
            event_id=event_id,
            tokens=tokens,
            cpu_seconds=cpu,
            run_lease=leases.get(RUN),
            session_lease=leases.get(SESSION),
        )

    @staticmethod
    def _check(
        conn: Connection,
        key_id: str,
        name: str,
        column: str,
        code: str,
        maximum: float,
        used: float,
        amount: float,
        window: float,
        mark: float,
        now: float,
    ) -> _Refusal | None:
        """The refusal of ``amount`` more where ``used`` of ``maximum`` is taken, if any."""
        if amount == 0:
            # Checked only for the CPU budget of a run: a run may start while some of the
            # day's CPU is left, and not once it is spent.
            if column != "cpu" or used < maximum:
                return None
        elif used + amount <= maximum:
            return None
        unit = _unit(name)
        if amount > maximum:
            return _Refusal(name, code, maximum, used, amount, None,
                            f"this request needs {_num(amount)} {unit}, more than the key's "
                            f"{name} limit of {_num(maximum)}")
        need = used + amount - maximum + (1e-9 if amount == 0 else 0.0)
        retry = _retry_after(conn, key_id, column, window, mark, need, now)
        what = "rate limit" if code == RATE else "budget"
        return _Refusal(name, code, maximum, used, amount, retry,
                        f"{name} {what} of {_num(maximum)} {unit} reached "
                        f"({_num(used)} used, this request needs {_num(amount)})")

    def _lease_refusal(self, name: str, kind: str, maximum: int, active: int) -> _Refusal:
        if kind == RUN:
            # A run ends within its wall time; there is no telling when, so ask for a retry
            # soon, as a rate does.
            return _Refusal(name, RATE, maximum, active, 1, 1.0,
                            f"{name} limit of {maximum} reached ({active} runs in progress)")
        return _Refusal(name, QUOTA, maximum, active, 1, None,
                        f"{name} limit of {maximum} reached ({active} sessions open); "
                        "close one first")

    # -- the end of a request ------------------------------------------------------------

    def finish(
        self,
        admission: Admission,
        *,
        tokens: int | None = None,
        cpu_seconds: float | None = None,
        release: bool = True,
    ) -> None:
        """Settle the reservation to what the request used (``None``: as reserved) and, with
        ``release``, release its run lease. Finishing twice changes nothing more. A session's
        lease stays until :meth:`release`."""
        if not admission.recorded:
            return
        if (tokens is not None and tokens < 0) or (cpu_seconds is not None and cpu_seconds < 0):
            raise ValueError("amounts must be non-negative")
        assert admission.key_id is not None
        settle = admission.event_id is not None and (tokens is not None or cpu_seconds is not None)
        if settle:
            with self._locked(admission.key_id) as (conn, st):
                ev = conn.execute(_SQL.event, {"eid": admission.event_id}).first()
                if ev is not None:
                    new_tokens = int(ev.tokens) if tokens is None else int(tokens)
                    new_cpu = float(ev.cpu) if cpu_seconds is None else float(cpu_seconds)
                    dt, dc = new_tokens - int(ev.tokens), new_cpu - float(ev.cpu)
                    if dt or dc:
                        conn.execute(
                            _SQL.settle_event,
                            {"eid": admission.event_id, "new_tokens": new_tokens,
                             "new_cpu": new_cpu},
                        )
                        # The event counts in a window's totals while it is after its mark.
                        if ev.at > st.minute_mark:
                            st.tokens_m += dt
                        if ev.at > st.day_mark:
                            st.tokens_d += dt
                            st.cpu_d += dc
                        conn.execute(_SQL.update_state, st.params(admission.key_id))
                if release and admission.run_lease:
                    conn.execute(_SQL.delete_lease, {"lid": admission.run_lease})
            return
        if release and admission.run_lease:
            self.release(admission.run_lease)

    def cpu_left(self, principal: Principal) -> float | None:
        """The CPU seconds left of the key's day budget now (``None``: no such limit)."""
        maximum = principal.limits.cpu_seconds_per_day
        if maximum is None:
            return None
        with self.engine.connect() as conn:
            used, _resets = self._window_now(conn, principal.key_id, "cpu", DAY, self.clock())
        return max(0.0, float(maximum) - float(used))

    def session_leases(self, principal: Principal) -> list[str]:
        """The ids of the session leases ``principal``'s key holds."""
        with self.engine.connect() as conn:
            rows = conn.execute(_SQL.leases, {"k": principal.key_id, "kind": SESSION}).all()
        return [r.id for r in rows]

    def release(self, lease_id: str) -> None:
        """Release a run's or a session's lease (no matter if it is already gone)."""
        with self.engine.begin() as conn:
            conn.execute(_SQL.delete_lease, {"lid": lease_id})

    def renew(self, lease_id: str, lease_s: float | None) -> bool:
        """Extend a lease to ``lease_s`` from now (``None``: until released); False when the
        lease is gone (released, or expired and swept)."""
        expires = None if lease_s is None else self.clock() + lease_s
        with self.engine.begin() as conn:
            done = conn.execute(_SQL.renew_lease, {"lid": lease_id, "new_expires": expires})
            return bool(done.rowcount)

    # -- what is left --------------------------------------------------------------------

    def check_disk(self, principal: Principal, used_bytes: int, adding_bytes: int = 0) -> None:
        """Refuse (``insufficient_quota``) writing ``adding_bytes`` more where the key's
        things already take ``used_bytes``, if that passes its ``disk_mb``."""
        maximum = principal.limits.disk_mb
        if maximum is None:
            return
        used_mb, adding_mb = used_bytes / 1_048_576, adding_bytes / 1_048_576
        if used_mb + adding_mb > maximum:
            raise KeyLimitExceeded(
                f"disk_mb budget of {maximum} MB reached ({used_mb:.1f} MB used, "
                f"this needs {adding_mb:.1f} MB more)",
                limit="disk_mb",
                code=QUOTA,
                retry_after=None,
                maximum=maximum,
                used=used_mb,
                requested=adding_mb,
            )

    def usage(self, principal: Principal, *, disk_used_bytes: int | None = None) -> list[LimitUsage]:
        """Each limit the key has, with what is used now, what remains and when the window
        is empty again. Reads only; works for a key whose limits were set a moment ago."""
        lim = principal.limits
        if lim.empty:
            return []
        out: list[LimitUsage] = []
        now = self.clock()
        with self.engine.connect() as conn:
            for name, col, _total, _code in _MINUTE_LIMITS + _DAY_LIMITS:
                maximum = getattr(lim, name)
                if maximum is None:
                    continue
                window = MINUTE if name in _MINUTE_NAMES else DAY
                used, resets = self._window_now(conn, principal.key_id, col, window, now)
                out.append(LimitUsage(name, maximum, used, window, resets))
            for name, kind in (("concurrent_runs", RUN), ("sessions_max", SESSION)):
                maximum = getattr(lim, name)
                if maximum is None:
                    continue
                active = [
                    r for r in conn.execute(_SQL.leases, {"k": principal.key_id, "kind": kind})
                    if r.expires_at is None or r.expires_at > now
                ]
                out.append(LimitUsage(name, maximum, len(active), None, None))
        if lim.disk_mb is not None:
            used_mb = None if disk_used_bytes is None else round(disk_used_bytes / 1_048_576, 3)
            out.append(LimitUsage("disk_mb", lim.disk_mb, used_mb, None, None))
        return out

    def _window_now(
        self, conn: Connection, key_id: str, column: str, window: float, now: float
    ) -> tuple[float, float | None]:
        """What ``column`` sums to over the window ending now, and when it empties; read from
        the events themselves, since the totals are only as current as the last admission."""
        col = _e[column]
        used, last = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(col), 0), sa.func.max(_e.at)).where(
                _e.key_id == _k(), _e.at > now - window, col > 0
            ),
            {"k": key_id},
        ).one()
        used = float(used) if column == "cpu" else int(used)
        return used, (None if last is None else float(last) + window)


_MINUTE_NAMES = frozenset(name for name, *_ in _MINUTE_LIMITS)


def _touched(
    principal: Principal, requests: int, tokens: int, run: bool, session: bool
) -> tuple[bool, bool, bool, bool]:
    """Which of the minute windows, the day windows, a run's lease and a session's lease an
    admission touches."""
    lim = principal.limits
    minute = (
        (requests and lim.requests_per_minute is not None)
        or (tokens and lim.tokens_per_minute is not None)
        or (run and lim.runs_per_minute is not None)
    )
    day = (tokens and lim.tokens_per_day is not None) or (
        run and lim.cpu_seconds_per_day is not None
    )
    run_lease = run and lim.concurrent_runs is not None
    session_lease = session and lim.sessions_max is not None
    return bool(minute), bool(day), bool(run_lease), bool(session_lease)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


def _error(refusals: list[_Refusal]) -> KeyLimitExceeded:
    """One error for the refusals of one admission: the one that lasts longest (a refusal
    that waiting cannot end, then the longest wait), naming the others in its message."""
    worst = max(refusals, key=lambda r: math.inf if r.retry_after is None else r.retry_after)
    message = worst.message
    others = [r.limit for r in refusals if r is not worst]
    if others:
        message += f"; also over {', '.join(others)}"
    return KeyLimitExceeded(
        message,
        limit=worst.limit,
        code=worst.code,
        retry_after=worst.retry_after,
        maximum=worst.maximum,
        used=worst.used,
        requested=worst.requested,
    )
