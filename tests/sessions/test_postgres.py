"""Sessions on PostgreSQL 15 (a throwaway cluster): the migration, the store, and two servers
racing for the same sessions' leases and expiry."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from conch import db
from conch.sessions.errors import SessionBusy
from conch.sessions.store import SessionStore
from tests.orchestration.pg import postgres_cluster
from tests.sessions.conftest import migrated
from tests.sessions.test_store import contention, make

pytestmark = pytest.mark.timeout(300)


def test_sessions_on_postgresql(tmp_path: Path) -> None:
    with postgres_cluster(tmp_path) as url:
        eng = migrated(url)
        try:
            with eng.connect() as conn:
                assert "0006_sessions" in db.current_revisions(conn)
                indexes = {ix["name"] for ix in sa.inspect(conn).get_indexes("sessions")}
            assert {"ix_sessions_tenant", "ix_sessions_expires_at"} <= indexes

            store = SessionStore(eng)
            sid = make(store, tenant="t", ttl_s=10, now=1000.0)
            assert store.get(sid, tenant="t").limits["steps"] == 1000
            assert store.touch(sid, now=1005.0).expires_at == 1015.0
            store.acquire(sid, "a", 10, now=1005.0)
            with pytest.raises(SessionBusy):
                store.acquire(sid, "b", 10, now=1006.0)
            run = store.record_run(sid, "a", saved=True, now=1007.0)
            assert (run.runs, run.state_version) == (1, 1)
            assert store.renew_all("a", 10, now=1008.0) == {sid}

            contention(url, n=30)

            # Two servers sweeping at once: each expired session is expired by exactly one.
            other = SessionStore(migrated(url))
            try:
                ids = [make(store, ttl_s=1, now=2000.0) for _ in range(20)]
                got: list[str] = []
                lock = threading.Lock()
                barrier = threading.Barrier(2)

                def sweep(st: SessionStore) -> None:
                    barrier.wait()
                    for s in st.list_expired(now=3000.0, limit=100):
                        if st.expire(s.id, now=3000.0):
                            with lock:
                                got.append(s.id)

                threads = [threading.Thread(target=sweep, args=(st,)) for st in (store, other)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert sorted(got) == sorted([*ids, sid])
            finally:
                other.engine.dispose()
        finally:
            eng.dispose()
