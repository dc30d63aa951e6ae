"""The sessions table through SessionStore on SQLite: create, read, tenants, use, expiry,
deletion, and leases between two servers (two stores, two engines, one database file)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from conch.sessions.errors import LeaseLost, SessionBusy, SessionNotFound
from conch.sessions.store import SessionStore
from tests.sessions.conftest import migrated

LIMITS = {"wall_time_s": 5.0, "steps": 1000, "recursion": 100, "output_bytes": 1000,
          "collection_size": 1000}  # fmt: skip


def make(store: SessionStore, *, tenant: str | None = None, ttl_s: float = 60.0,
         now: float = 1000.0) -> str:  # fmt: skip
    s = store.create(ttl_s=ttl_s, limits=LIMITS, allow_network=False, allow_process=True,
                     tenant=tenant, now=now)  # fmt: skip
    return s.id


def test_create_get_and_public_shape(store: SessionStore) -> None:
    s = store.create(ttl_s=60, limits=LIMITS, allow_network=False, allow_process=True, now=1000.0)
    assert s.id.startswith("sess_") and len(s.id) == 29
    got = store.get(s.id)
    assert got == s
    assert (got.status, got.runs, got.state_version, got.expires_at) == ("active", 0, 0, 1060.0)
    public = got.public()
    assert public["created_at"] == "1970-01-01T00:16:40.000Z"
    assert public["expires_at"] == "1970-01-01T00:17:40.000Z"
    assert public["limits"] == LIMITS and public["workspace_bytes"] == 0
    assert "lease_owner" not in public and "tenant" not in public
    with pytest.raises(SessionNotFound) as err:
        store.get("sess_nope")
    assert err.value.status == 404 and err.value.where == "session"


def test_tenants_see_only_their_own(store: SessionStore) -> None:
    a1 = make(store, tenant="a", now=1000.0)
    a2 = make(store, tenant="a", now=1001.0)
    b1 = make(store, tenant="b", now=1002.0)
    anon = make(store, now=1003.0)
    assert [s.id for s in store.list(tenant="a")] == [a2, a1]  # newest first
    assert [s.id for s in store.list(tenant="b")] == [b1]
    assert [s.id for s in store.list()] == [anon, b1, a2, a1]  # the admin sees all
    assert [s.id for s in store.list(limit=2, offset=1)] == [b1, a2]
    assert store.count(tenant="a") == 2 and store.count() == 4
    assert store.find(b1, tenant="a") is None
    with pytest.raises(SessionNotFound):
        store.get(b1, tenant="a")
    with pytest.raises(SessionNotFound):
        store.mark_deleting(b1, tenant="a")
    with pytest.raises(SessionNotFound):
        store.acquire(b1, "server-a", 10, tenant="a")
    assert store.holder(b1) is None  # the refused acquire took nothing
    assert store.get(b1, tenant="b").id == b1


def test_use_moves_expiry_and_records_runs(store: SessionStore) -> None:
    sid = make(store, ttl_s=10, now=1000.0)
    assert store.touch(sid, now=1005.0).expires_at == 1015.0
    store.acquire(sid, "srv", 30, now=1006.0)
    s = store.record_run(sid, "srv", saved=True, workspace_bytes=123, now=1007.0)
    assert (s.runs, s.state_version, s.workspace_bytes, s.last_used_at, s.expires_at) == (
        1,
        1,
        123,
        1007.0,
        1017.0,
    )
    s = store.record_run(sid, "srv", now=1008.0, lease_s=50)
    assert (s.runs, s.state_version, s.lease_expires_at) == (2, 1, 1058.0)
    store.set_workspace_bytes(sid, 7)
    assert store.get(sid).workspace_bytes == 7


def test_expiry_listing_and_expire(store: SessionStore) -> None:
    short = make(store, ttl_s=10, now=1000.0)
    long = make(store, ttl_s=100, now=1000.0)
    assert store.list_expired(now=1009.0) == []
    assert [s.id for s in store.list_expired(now=1011.0)] == [short]
    store.touch(short, now=1008.0)  # used: expires at 1018 now
    assert store.list_expired(now=1011.0) == []
    assert not store.expire(short, now=1011.0)
    # A session a live server holds does not expire, whatever its expires_at says.
    store.acquire(short, "srv", 100, now=1015.0)
    assert store.list_expired(now=1020.0) == [] and not store.expire(short, now=1020.0)
    assert [s.id for s in store.list_expired(now=1200.0)] == [short, long]  # lease ran out
    assert store.expire(short, now=1200.0)
    assert store.find(short) is None  # deleting: invisible
    assert store.list_deleting() == [short]
    assert not store.renew(short, "srv", 10)  # its holder learns it is gone
    assert store.purge(short) and store.existing([short, long]) == {long}


def test_delete_hides_then_purges(store: SessionStore) -> None:
    sid = make(store, tenant="t")
    store.mark_deleting(sid, tenant="t")
    assert store.list() == [] and store.find(sid) is None
    with pytest.raises(SessionNotFound):
        store.touch(sid)
    with pytest.raises(SessionNotFound):
        store.mark_deleting(sid)
    assert store.list_deleting() == [sid]
    assert store.purge(sid) and not store.purge(sid)
    assert store.existing([sid]) == set()


def test_pause_releases_its_holder_and_refuses_another(store: SessionStore) -> None:
    sid = make(store)
    store.acquire(sid, "a", 30, now=1000.0)
    with pytest.raises(SessionBusy) as err:
        store.mark_paused(sid, owner="b", now=1001.0)
    assert err.value.status == 409 and err.value.owner == "a"
    s = store.mark_paused(sid, owner="a", now=1001.0)
    assert (s.status, s.lease_owner, s.lease_expires_at) == ("paused", None, None)
    # An unheld session may be paused by anyone; a run makes it active again.
    store.acquire(sid, "b", 30, now=1002.0)
    assert store.record_run(sid, "b", now=1003.0).status == "active"
    assert store.list(status="active")[0].id == sid


def test_lease_handover(store: SessionStore) -> None:
    sid = make(store)
    s = store.acquire(sid, "a", 10, now=1000.0)
    assert (s.lease_owner, s.lease_expires_at) == ("a", 1010.0)
    assert store.acquire(sid, "a", 10, now=1001.0).lease_expires_at == 1011.0  # re-entrant
    with pytest.raises(SessionBusy) as err:
        store.acquire(sid, "b", 10, now=1002.0)
    assert err.value.owner == "a" and err.value.retry_after == pytest.approx(9.0)
    assert err.value.headers == {"Retry-After": "9"} and err.value.kind == "Conflict"
    assert store.holder(sid, now=1002.0) == ("a", 1011.0)
    assert store.renew(sid, "a", 10, now=1005.0)
    assert not store.renew(sid, "b", 10, now=1005.0)
    # a dies: its lease runs out, b takes the session over, a's late writes are refused.
    assert store.holder(sid, now=1016.0) is None
    assert store.acquire(sid, "b", 10, now=1016.0).lease_owner == "b"
    assert not store.renew(sid, "a", 10, now=1017.0)
    with pytest.raises(LeaseLost):
        store.record_run(sid, "a", now=1017.0)
    assert not store.release(sid, "a")
    assert store.release(sid, "b") and store.holder(sid) is None
    assert store.acquire(sid, "a", 10, now=1018.0).lease_owner == "a"


def test_renew_all_tells_what_was_lost(store: SessionStore) -> None:
    s1, s2, s3 = make(store), make(store), make(store)
    for sid in (s1, s2):
        store.acquire(sid, "a", 10, now=1000.0)
    store.acquire(s3, "b", 10, now=1000.0)
    assert store.renew_all("a", 10, now=1005.0) == {s1, s2}
    store.acquire(s2, "b", 10, now=1020.0)  # a's lease on s2 ran out; b took it
    store.mark_deleting(s1)
    assert store.renew_all("a", 10, now=1021.0) == set()
    with pytest.raises(SessionNotFound):
        store.record_run(s1, "a")


def _race(stores: list[SessionStore], ids: list[str], per_store: int) -> dict[str, list[str]]:
    """Every thread of every store tries to acquire every session at once; who got which."""
    won: dict[str, list[str]] = {sid: [] for sid in ids}
    barrier = threading.Barrier(len(stores) * per_store)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def contend(store: SessionStore, owner: str) -> None:
        try:
            barrier.wait()
            for sid in ids:
                try:
                    store.acquire(sid, owner, 60)
                except SessionBusy:
                    continue
                with lock:
                    won[sid].append(owner)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=contend, args=(st, f"server{i}-thread{j}"))
        for i, st in enumerate(stores)
        for j in range(per_store)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    return won


def contention(url: str, n: int = 20) -> None:
    """Two servers (stores on their own engines) race for ``n`` sessions: each session goes to
    exactly one thread of one server, and the database agrees with who was told it won."""
    a, b = SessionStore(migrated(url)), SessionStore(migrated(url))
    try:
        ids = [make(a) for _ in range(n)]
        won = _race([a, b], ids, per_store=4)
        for sid, owners in won.items():
            assert len(owners) == 1, (sid, owners)
            assert b.holder(sid) is not None and b.holder(sid)[0] == owners[0]  # type: ignore[index]
        assert {o.split("-")[0] for owners in won.values() for o in owners} <= {
            "server0",
            "server1",
        }
    finally:
        a.engine.dispose()
        b.engine.dispose()


def test_lease_contention_between_two_servers_on_sqlite(tmp_path: Path) -> None:
    contention(f"sqlite:///{tmp_path / 'shared.db'}")
