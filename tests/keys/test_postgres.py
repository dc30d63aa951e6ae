"""Keys on PostgreSQL, two engines (two servers) on one throwaway cluster: 64 concurrent
requests never pass a token budget, a request rate or a concurrency limit, and a change made
through one is applied by the other within a second."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from conch import db
from conch.keys import KeyLimitExceeded, KeyService, Limiter
from conch.keys.tables import audit_log
from tests.keys.conftest import make_room
from tests.keys.proofs import hammer
from tests.keys.test_service import two_servers_see_changes_within_a_second
from tests.orchestration.pg import postgres_cluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pg_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with postgres_cluster(tmp_path_factory.mktemp("pg")) as url:
        engine = db.create_engine(url)
        db.migrate(engine)
        engine.dispose()
        yield url


@pytest.fixture()
def engines(pg_url: str) -> Iterator[list[sa.Engine]]:
    pair = [db.create_engine(pg_url), db.create_engine(pg_url)]
    yield pair
    for e in pair:
        e.dispose()


def _used(engine: sa.Engine, secret: str, limit: str) -> object:
    keys = KeyService(engine)
    principal = keys.authenticate(secret)
    assert principal is not None
    return {u.limit: u.used for u in Limiter(engine).usage(principal)}[limit]


def test_64_concurrent_requests_on_two_servers_never_pass_a_token_budget(
    engines: list[sa.Engine],
) -> None:
    room = make_room(engines[0])
    secret = room.keys.create(
        name="budget", scopes=["inference"], limits={"tokens_per_day": 10_000}
    ).secret
    tally = hammer(engines, secret, threads=64, mode="tokens", reserve=64)
    assert tally.errors == []
    assert tally.admitted == 10_000 // 64  # 156: not one more, and none lost
    assert tally.settled_tokens == 9_984 <= 10_000
    assert {(c, limit) for c, limit, _ in tally.refusals} == {("insufficient_quota", "tokens_per_day")}
    assert _used(engines[1], secret, "tokens_per_day") == 9_984

    # Requests that use less than they reserved give the rest back at settlement, and the
    # budget still holds, to the token.
    secret = room.keys.create(
        name="budget-2", scopes=["inference"], limits={"tokens_per_day": 10_000}
    ).secret
    tally = hammer(engines, secret, threads=64, mode="tokens-less", reserve=64)
    assert tally.errors == []
    assert tally.admitted > 156 and tally.settled_tokens <= 10_000
    assert _used(engines[0], secret, "tokens_per_day") == tally.settled_tokens


def test_64_concurrent_requests_on_two_servers_never_pass_a_request_rate(
    engines: list[sa.Engine],
) -> None:
    room = make_room(engines[0])
    secret = room.keys.create(
        name="rate", scopes=["inference"], limits={"requests_per_minute": 300}
    ).secret
    started = time.monotonic()
    tally = hammer(engines, secret, threads=64, mode="requests")
    assert time.monotonic() - started < 55  # all within one window
    assert tally.errors == []
    assert tally.admitted == 300
    assert len(tally.refusals) == 64
    assert all(c == "rate_limit_exceeded" and 0 < (r or 0) <= 60 for c, _, r in tally.refusals)
    assert _used(engines[1], secret, "requests_per_minute") == 300


def test_concurrent_runs_hold_across_two_servers(engines: list[sa.Engine]) -> None:
    room = make_room(engines[0])
    secret = room.keys.create(
        name="runs", scopes=["execute"], limits={"concurrent_runs": 5}
    ).secret
    servers = [(KeyService(e), Limiter(e)) for e in engines]
    lock = threading.Lock()
    running = peak = done = refused = 0
    errors: list[str] = []
    deadline = time.monotonic() + 3

    def work(i: int) -> None:
        nonlocal running, peak, done, refused
        keys, limiter = servers[i % 2]
        principal = keys.authenticate(secret)
        assert principal is not None
        while time.monotonic() < deadline:
            try:
                admission = limiter.admit(principal, run=True)
            except KeyLimitExceeded as e:
                if e.limit != "concurrent_runs":
                    errors.append(e.message)
                with lock:
                    refused += 1
                time.sleep(0.002)
                continue
            with lock:
                running += 1
                peak = max(peak, running)
            time.sleep(0.02)
            with lock:
                running -= 1
                done += 1
            limiter.finish(admission)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # Counted between admission and finish, so never above the leases held.
    assert 1 <= peak <= 5 and done > 20 and refused > 0


def test_a_change_on_one_server_applies_on_the_other_within_a_second(pg_url: str) -> None:
    two_servers_see_changes_within_a_second(pg_url, pg_url)


def test_the_audit_log_is_append_only_on_postgresql(engines: list[sa.Engine]) -> None:
    room = make_room(engines[0])
    room.audit.model_deleted(None, model="x")
    for statement in (
        sa.update(audit_log).values(action="model.pulled"),
        sa.delete(audit_log),
        sa.text("TRUNCATE audit_log"),
    ):
        with pytest.raises(sa.exc.DatabaseError, match="append-only"), engines[0].begin() as conn:
            conn.execute(statement)
    assert room.audit.read().entries[0].action == "model.deleted"
