"""Limits that hold: exact sliding windows, reservations settled to the real count, leases,
budgets, the models allow-list, the usage report; and, with real concurrency on one SQLite
file (threads, and two processes), no limit passed."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from conch import db
from conch.errors import Forbidden, LimitExceeded
from conch.keys import KeyLimitExceeded, ModelNotAllowed, Principal
from conch.keys.limits import DAY_GC_S
from conch.keys.records import iso
from conch.keys.tables import key_events, key_leases, key_usage
from tests.keys.conftest import Room, StatementCounter, make_room
from tests.keys.proofs import Tally, hammer

ROOT = Path(__file__).resolve().parents[2]


def _key(room: Room, **limits: float) -> Principal:
    issued = room.keys.create(name="k", scopes=["inference", "execute"], limits=limits)
    principal = room.keys.authenticate(issued.secret)
    assert principal is not None
    return principal


def _refused(room: Room, principal: Principal, **demand: object) -> KeyLimitExceeded:
    with pytest.raises(KeyLimitExceeded) as err:
        room.limiter.admit(principal, **demand)  # type: ignore[arg-type]
    e = err.value
    assert isinstance(e, LimitExceeded) and e.status == 429
    return e


def _usage(room: Room, principal: Principal) -> dict[str, dict[str, object]]:
    return {u.limit: u.to_dict() for u in room.limiter.usage(principal)}


def test_a_key_without_limits_costs_no_database_work(room: Room) -> None:
    free = _key(room)
    partial = _key(room, tokens_per_day=1000)  # limits what this request does not touch
    counter = StatementCounter(room.engine)
    try:
        for principal in (free, partial):
            a = room.limiter.admit(principal, requests=1)
            room.limiter.finish(a, tokens=10)
        a = room.limiter.admit(free, tokens=500, run=True, cpu_seconds=3, session=True,
                               model="local:x")
        assert not a.recorded
        room.limiter.finish(a, tokens=100, cpu_seconds=1)
        assert counter.count == 0
    finally:
        counter.close()


def test_requests_per_minute_is_an_exact_sliding_window(room: Room) -> None:
    p = _key(room, requests_per_minute=3)
    t0 = room.clock.now
    for offset in (0, 10, 20):
        room.clock.now = t0 + offset
        room.limiter.admit(p)
    room.clock.now = t0 + 30
    e = _refused(room, p)
    assert e.code == "rate_limit_exceeded" and e.limit == "requests_per_minute"
    assert e.retry_after == pytest.approx(30.0)
    assert e.headers == {"Retry-After": "30"} and e.where == "requests_per_minute"
    assert "3 requests" in e.message
    room.clock.now = t0 + 59.999
    assert _refused(room, p).retry_after == pytest.approx(0.001, abs=1e-6)
    # The first request leaves the window exactly 60 s after it was admitted.
    room.clock.now = t0 + 60
    room.limiter.admit(p)
    # Now 10, 20 and 60 are in the window: the next frees at 70.
    room.clock.now = t0 + 61
    assert _refused(room, p).retry_after == pytest.approx(9.0)
    # No fixed window edge: at 79.9 only the request at 10 has left.
    room.clock.now = t0 + 79.9
    room.limiter.admit(p)
    assert _refused(room, p).retry_after == pytest.approx(0.1)
    usage = _usage(room, p)["requests_per_minute"]
    assert usage["used"] == 3 and usage["remaining"] == 0 and usage["window_s"] == 60
    assert usage["max"] == 3


def test_tokens_are_reserved_at_admission_and_settled_at_the_end(room: Room) -> None:
    p = _key(room, tokens_per_minute=1000)
    first = room.limiter.admit(p, tokens=600)
    e = _refused(room, p, tokens=600)  # the reservation counts while the request runs
    assert e.limit == "tokens_per_minute" and e.code == "rate_limit_exceeded"
    assert e.retry_after == pytest.approx(60.0) and e.used == 600 and e.requested == 600
    room.limiter.finish(first, tokens=100)  # it used 100: 500 go back
    assert _usage(room, p)["tokens_per_minute"]["used"] == 100
    second = room.limiter.admit(p, tokens=600)
    assert _usage(room, p)["tokens_per_minute"]["used"] == 700
    room.limiter.finish(second, tokens=600)
    room.limiter.finish(second, tokens=600)  # finishing twice changes nothing
    room.limiter.finish(first, tokens=100)
    assert _usage(room, p)["tokens_per_minute"]["used"] == 700
    room.limiter.admit(p, tokens=300)
    _refused(room, p, tokens=1)


def test_a_reservation_settled_after_its_minute_stays_out_of_the_minute(room: Room) -> None:
    p = _key(room, tokens_per_minute=1000, tokens_per_day=5000)
    long = room.limiter.admit(p, tokens=800)
    room.clock.advance(61)
    room.limiter.admit(p, tokens=1000)  # the long request's 800 left the minute window
    room.limiter.finish(long, tokens=200)
    assert _usage(room, p)["tokens_per_minute"]["used"] == 1000
    assert _usage(room, p)["tokens_per_day"]["used"] == 1200
    e = _refused(room, p, tokens=1)
    assert e.limit == "tokens_per_minute"


def test_tokens_per_day_is_a_budget(room: Room) -> None:
    p = _key(room, tokens_per_day=1000, requests_per_minute=100)
    t0 = room.clock.now
    a = room.limiter.admit(p, tokens=700)
    room.limiter.finish(a, tokens=700)
    room.clock.advance(3600)
    room.limiter.finish(room.limiter.admit(p, tokens=300), tokens=250)
    room.clock.advance(60)
    e = _refused(room, p, tokens=100)
    assert e.code == "insufficient_quota" and e.limit == "tokens_per_day"
    # 950 used; 100 more need 50 freed: the 700 at t0 leave at t0 + 1 day.
    assert e.retry_after == pytest.approx(t0 + 86_400 - room.clock.now)
    assert "budget" in e.message
    # Nothing of the refused request was recorded: its request did not count either.
    assert _usage(room, p)["requests_per_minute"]["used"] == 0
    assert _usage(room, p)["tokens_per_day"]["used"] == 950
    room.limiter.admit(p, tokens=50)
    room.clock.now = t0 + 86_400
    room.limiter.admit(p, tokens=100)  # the first 700 are out of the day now
    usage = _usage(room, p)["tokens_per_day"]
    assert usage["used"] == 400 and usage["remaining"] == 600


def test_a_request_larger_than_the_limit_is_refused_without_retry_after(room: Room) -> None:
    p = _key(room, tokens_per_day=1000)
    e = _refused(room, p, tokens=1001)
    assert e.retry_after is None and e.headers is None and "more than" in e.message
    assert e.code == "insufficient_quota"


def test_the_worst_refusal_is_reported_and_names_the_others(room: Room) -> None:
    p = _key(room, requests_per_minute=1, tokens_per_day=100)
    room.limiter.admit(p, tokens=100)
    e = _refused(room, p, tokens=10)
    assert e.limit == "tokens_per_day" and "requests_per_minute" in e.message


def test_runs_per_minute_and_concurrent_runs(room: Room) -> None:
    p = _key(room, runs_per_minute=3, concurrent_runs=1)
    first = room.limiter.admit(p, run=True)
    assert first.run_lease is not None
    e = _refused(room, p, run=True)
    assert (e.limit, e.code, e.retry_after) == ("concurrent_runs", "rate_limit_exceeded", 1.0)
    assert _usage(room, p)["concurrent_runs"]["used"] == 1
    room.limiter.admit(p)  # a request that is not a run is not limited by runs
    room.limiter.finish(first)
    assert _usage(room, p)["concurrent_runs"]["used"] == 0
    room.limiter.finish(room.limiter.admit(p, run=True))
    room.limiter.finish(room.limiter.admit(p, run=True))
    e = _refused(room, p, run=True)
    assert e.limit == "runs_per_minute" and e.retry_after == pytest.approx(60.0)


def test_a_dead_servers_run_stops_counting_when_its_lease_runs_out(room: Room) -> None:
    p = _key(room, concurrent_runs=1)
    held = room.limiter.admit(p, run=True, lease_s=30)  # ... and its server dies
    room.clock.advance(29)
    _refused(room, p, run=True)
    room.clock.advance(1)
    taken = room.limiter.admit(p, run=True, lease_s=30)
    with room.engine.connect() as conn:
        ids = set(conn.execute(sa.select(key_leases.c.id)).scalars())
    assert ids == {taken.run_lease}  # the expired lease was swept
    assert not room.limiter.renew(held.run_lease or "", 30)
    room.clock.advance(20)
    assert room.limiter.renew(taken.run_lease or "", 30)  # a long run renews its lease
    room.clock.advance(20)
    _refused(room, p, run=True)


def test_sessions_max_holds_until_a_session_is_released(room: Room) -> None:
    p = _key(room, sessions_max=2)
    one = room.limiter.admit(p, session=True)
    two = room.limiter.admit(p, session=True)
    room.limiter.finish(one)  # the request that opened it ends; the session stays open
    room.clock.advance(10 * 86_400)
    e = _refused(room, p, session=True)
    assert (e.limit, e.code, e.retry_after) == ("sessions_max", "insufficient_quota", None)
    assert "close one" in e.message
    assert _usage(room, p)["sessions_max"]["used"] == 2
    room.limiter.release(one.session_lease or "")
    room.limiter.admit(p, session=True)
    room.limiter.release(two.session_lease or "")
    room.limiter.release(two.session_lease or "")  # releasing twice is harmless


def test_cpu_seconds_per_day(room: Room) -> None:
    p = _key(room, cpu_seconds_per_day=10)
    a = room.limiter.admit(p, run=True, cpu_seconds=4)
    b = room.limiter.admit(p, run=True, cpu_seconds=4)
    e = _refused(room, p, run=True, cpu_seconds=4)
    assert e.limit == "cpu_seconds_per_day" and e.code == "insufficient_quota"
    room.limiter.finish(a, cpu_seconds=0.5)
    room.limiter.finish(b, cpu_seconds=5.5)
    c = room.limiter.admit(p, run=True, cpu_seconds=3)
    room.limiter.finish(c, cpu_seconds=4.0)  # it used more than reserved: recorded as used
    assert _usage(room, p)["cpu_seconds_per_day"]["used"] == pytest.approx(10.0)
    e = _refused(room, p, run=True)  # no CPU left: a run with no reservation is refused too
    assert e.limit == "cpu_seconds_per_day" and e.retry_after is not None
    room.limiter.admit(p)  # a plain request is not a run


def test_the_models_allow_list(room: Room) -> None:
    issued = room.keys.create(name="m", scopes=["inference"], models=["local:*", "openai:gpt-4o"])
    p = room.keys.authenticate(issued.secret)
    assert p is not None
    room.limiter.admit(p, model="local:smollm2-135m-instruct")
    room.limiter.admit(p, model="openai:gpt-4o")
    with pytest.raises(ModelNotAllowed) as err:
        room.limiter.admit(p, model="openai:gpt-4o-mini")
    assert isinstance(err.value, Forbidden) and err.value.status == 403
    assert err.value.where == "model" and "openai:gpt-4o-mini" in err.value.message
    none = room.keys.create(name="n", scopes=["inference"], models=[]).secret
    principal = room.keys.authenticate(none)
    assert principal is not None
    with pytest.raises(ModelNotAllowed):
        room.limiter.check_model(principal, "local:x")


def test_disk_mb(room: Room) -> None:
    p = _key(room, disk_mb=10)
    room.limiter.check_disk(p, 9 * 1_048_576, 1_048_576)
    with pytest.raises(KeyLimitExceeded) as err:
        room.limiter.check_disk(p, 9 * 1_048_576, 1_048_577)
    assert err.value.limit == "disk_mb" and err.value.code == "insufficient_quota"
    usage = {u.limit: u for u in room.limiter.usage(p, disk_used_bytes=5 * 1_048_576)}
    assert usage["disk_mb"].used == 5 and usage["disk_mb"].remaining == 5


def test_rotation_keeps_limits_and_windows(room: Room) -> None:
    issued = room.keys.create(
        name="r", scopes=["inference"], limits={"requests_per_minute": 2, "tokens_per_day": 500}
    )
    p = room.keys.authenticate(issued.secret)
    assert p is not None
    pending = room.limiter.admit(p, tokens=300)
    room.limiter.admit(p, tokens=100)
    rotated = room.keys.rotate(issued.record.id)
    q = room.keys.authenticate(rotated.secret)
    assert q is not None and q.limits == p.limits
    e = _refused(room, q)
    assert e.limit == "requests_per_minute"  # the same window: no fresh allowance
    room.limiter.finish(pending, tokens=50)  # an admission of the old secret settles
    assert _usage(room, q)["tokens_per_day"]["used"] == 150
    assert _usage(room, q) == _usage(room, p)


def test_changed_limits_apply_to_the_existing_windows(room: Room) -> None:
    issued = room.keys.create(name="c", scopes=["inference"], limits={"requests_per_minute": 2})
    p = room.keys.authenticate(issued.secret)
    assert p is not None
    room.limiter.admit(p)
    room.limiter.admit(p)
    _refused(room, p)
    p = room.keys.patch(issued.record.id, {"limits": {"requests_per_minute": 3}}).principal()
    room.limiter.admit(p)
    _refused(room, p)
    p = room.keys.patch(issued.record.id, {"limits": {"requests_per_minute": None}}).principal()
    room.limiter.admit(p)


def test_usage_reports_each_limit(room: Room) -> None:
    p = _key(room, requests_per_minute=10, tokens_per_day=1000, concurrent_runs=2)
    t0 = room.clock.now
    room.limiter.admit(p, tokens=100)
    room.clock.advance(5)
    room.limiter.admit(p, run=True)
    usage = _usage(room, p)
    assert list(usage) == ["requests_per_minute", "tokens_per_day", "concurrent_runs"]
    rpm = usage["requests_per_minute"]
    assert (rpm["max"], rpm["used"], rpm["remaining"]) == (10, 2, 8)
    assert rpm["resets_at"] == iso(t0 + 5 + 60)
    assert usage["tokens_per_day"]["resets_at"] == iso(t0 + 86_400)
    assert usage["concurrent_runs"]["used"] == 1 and usage["concurrent_runs"]["resets_at"] is None
    assert room.limiter.usage(_key(room)) == []


def test_events_leave_the_table_after_a_day(room: Room) -> None:
    p = _key(room, tokens_per_day=10_000)
    for _ in range(5):
        room.limiter.admit(p, tokens=1)
        room.clock.advance(3600)
    room.clock.advance(86_400 - 3 * 3600 + 1)
    room.limiter.admit(p, tokens=1)
    with room.engine.connect() as conn:
        left = conn.execute(sa.select(sa.func.count()).select_from(key_events)).scalar_one()
    assert left == 3
    assert _usage(room, p)["tokens_per_day"]["used"] == 3


def test_a_clock_behind_never_records_an_event_before_the_marks(engine: sa.Engine) -> None:
    """A server whose clock is behind another's must not record an event the windows count
    but can never prune."""
    a = make_room(engine)
    behind = make_room(engine)
    behind.clock.now = a.clock.now - 30
    p = _key(a, requests_per_minute=2)
    a.clock.advance(61)
    a.limiter.admit(p)  # moves the minute mark to a's now - 60
    behind.limiter.admit(p)
    a.clock.advance(61)
    a.limiter.admit(p)
    a.limiter.admit(p)  # both earlier requests have left a's window
    _refused(a, p)


def test_threads_and_two_engines_never_pass_a_budget_on_sqlite(sqlite_url: str) -> None:
    engines = [db.create_engine(sqlite_url), db.create_engine(sqlite_url)]
    try:
        db.migrate(engines[0])
        room = make_room(engines[0])
        secret = room.keys.create(
            name="budget", scopes=["inference"], limits={"tokens_per_day": 10_000}
        ).secret
        tally = hammer(engines, secret, threads=64, mode="tokens")
        assert tally.errors == []
        assert tally.admitted == 10_000 // 64  # not one more, and none lost
        assert tally.settled_tokens == 156 * 64 <= 10_000
        assert {(code, limit) for code, limit, _ in tally.refusals} == {
            ("insufficient_quota", "tokens_per_day")
        }
        p = room.keys.authenticate(secret)
        assert p is not None
        assert _usage(room, p)["tokens_per_day"]["used"] == tally.settled_tokens
    finally:
        for e in engines:
            e.dispose()


def _processes(url: str, secret: str, mode: str, n: int = 2, threads: int = 32) -> Tally:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    start_at = time.time() + 3
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.keys.proofs", url, secret, str(threads), mode,
             str(start_at)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(n)
    ]
    tally = Tally()
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        tally.add(json.loads(out))
    return tally


@pytest.mark.timeout(300)
def test_two_processes_on_one_sqlite_file_never_pass_a_budget(sqlite_url: str) -> None:
    engine = db.create_engine(sqlite_url)
    try:
        db.migrate(engine)
        room = make_room(engine)
        secret = room.keys.create(
            name="budget", scopes=["inference"], limits={"tokens_per_day": 10_000}
        ).secret
        tally = _processes(sqlite_url, secret, "tokens-less")
        assert tally.errors == []
        assert tally.settled_tokens <= 10_000
        p = room.keys.authenticate(secret)
        assert p is not None
        assert _usage(room, p)["tokens_per_day"]["used"] == tally.settled_tokens
        assert {c for c, _, _ in tally.refusals} == {"insufficient_quota"}

        rpm = room.keys.create(
            name="rate", scopes=["inference"], limits={"requests_per_minute": 300}
        ).secret
        started = time.monotonic()
        tally = _processes(sqlite_url, rpm, "requests")
        assert time.monotonic() - started < 55  # all within one window
        assert tally.errors == [] and tally.admitted == 300
        assert all(c == "rate_limit_exceeded" and 0 < (r or 0) <= 60 for c, _, r in tally.refusals)
    finally:
        engine.dispose()


def test_the_running_totals_are_always_the_events_after_their_marks(room: Room) -> None:
    """Whatever happens (admissions, settlements, refusals, clock jumps, day limits added
    and removed), each running total in ``key_usage`` is the sum of its column over the
    events after the window's mark, and no event is kept past the windows the key reads."""
    rng = random.Random(32)
    issued = room.keys.create(
        name="inv", scopes=["inference"],
        limits={"requests_per_minute": 40, "tokens_per_minute": 4000, "tokens_per_day": 50_000},
    )
    key_id = issued.record.id
    p = room.keys.authenticate(issued.secret)
    assert p is not None
    open_admissions = []
    day_limits = True
    for step in range(600):
        roll = rng.random()
        admitted = False
        if roll < 0.55:
            try:
                open_admissions.append(
                    room.limiter.admit(p, tokens=rng.choice([0, 1, 64, 500]), run=rng.random() < 0.2)
                )
                admitted = True
            except KeyLimitExceeded:
                pass
        elif roll < 0.85 and open_admissions:
            a = open_admissions.pop(rng.randrange(len(open_admissions)))
            room.limiter.finish(a, tokens=rng.randint(0, a.tokens))
        elif roll < 0.97:
            room.clock.advance(rng.choice([0.5, 5, 20, 59.9, 60, 61, 3600, 86_400]))
        else:
            day_limits = not day_limits
            change = {"tokens_per_day": 50_000 if day_limits else None}
            p = room.keys.patch(key_id, {"limits": change}).principal()
        with room.engine.connect() as conn:
            st = conn.execute(sa.select(key_usage).where(key_usage.c.key_id == key_id)).one()
            events = conn.execute(sa.select(key_events)).all()
        after_m = [e for e in events if e.at > st.minute_mark]
        after_d = [e for e in events if e.at > st.day_mark]
        assert st.requests_m == sum(e.requests for e in after_m), step
        assert st.tokens_m == sum(e.tokens for e in after_m), step
        assert st.runs_m == sum(e.runs for e in after_m), step
        assert st.tokens_d == sum(e.tokens for e in after_d), step
        assert len(after_d) == len(events), step  # nothing before the day mark is kept
        assert st.minute_mark >= st.day_mark
        if admitted:  # an admission prunes: what is kept is what the windows read
            kept = 60 if not day_limits else 86_400 + DAY_GC_S
            assert all(e.at > room.clock.now - kept for e in events), step


def test_a_key_without_day_limits_keeps_a_minute_of_events(room: Room) -> None:
    p = _key(room, requests_per_minute=1000)
    for _ in range(10):
        room.limiter.admit(p)
        room.clock.advance(30)
    with room.engine.connect() as conn:
        kept = conn.execute(sa.select(sa.func.count()).select_from(key_events)).scalar_one()
    # The last admission was 30 s ago; the one 60 s ago left the window exactly now (the
    # next admission prunes it).
    assert kept == 2
