"""The one transaction helper of the orchestration stores, and the event log they share.

Every store (:mod:`.tasks`, :mod:`.checkpoints`, :mod:`.workflows`, :mod:`.leases`) opens its
transactions through one :class:`Database`, so that there is one way to do it:

- a state change and the events it emits commit in one transaction (:meth:`Database.tx`);
- on PostgreSQL several servers share the tables: a transition locks its row
  (``SELECT … FOR UPDATE``, :meth:`Database.lock_row`) before it reads and writes;
- SQLite has one writer at a time anyway; a lock held by this process keeps its writers from
  tripping over each other's read-then-write transactions (so the stores of one process
  must share one :class:`Database`).

Neither database's transactions are retried: a conflict on PostgreSQL is made impossible by
the lock order the stores keep (see :mod:`.workflows`), and SQLite's single writer waits
(its busy timeout, :func:`conch.db.create_engine`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from conch.orchestration import tables as t


class _EventSQL:
    """The event log's statements, built once: building a Core statement and its cache key
    costs more than SQLite takes to run it."""

    e = t.events
    last_seq = sa.select(sa.func.coalesce(sa.func.max(e.c.seq), 0)).where(
        e.c.stream == sa.bindparam("stream")
    )
    insert = sa.insert(e)


class Database:
    """The orchestration tables on one engine: transactions, row locks and the event log."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.postgres = engine.dialect.name == "postgresql"
        self._lock = threading.Lock() if not self.postgres else None

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        """A transaction: committed when the block ends, rolled back if it raises."""
        if self._lock is None:
            with self.engine.begin() as conn:
                yield conn
            return
        with self._lock, self.engine.begin() as conn:
            yield conn

    def read(self) -> Connection:
        """A connection for reads that need no transaction of their own (``with`` it)."""
        return self.engine.connect()

    @staticmethod
    def lock_row(conn: Connection, table: sa.Table, id: str, *columns: str) -> Any:
        """Lock a row and read ``status`` and the named columns: never the whole row, whose
        JSON columns (a workflow's definition, a task's steps) may be large."""
        cols = [table.c.id, table.c.status, *(table.c[name] for name in columns)]
        return conn.execute(sa.select(*cols).where(table.c.id == id).with_for_update()).first()

    # -- the event log --------------------------------------------------------------------

    @staticmethod
    def emit(conn: Connection, stream: str, event: str, data: dict[str, Any]) -> int:
        """Append an event; callers hold the lock of the stream's parent row."""
        seq = conn.execute(_EventSQL.last_seq, {"stream": stream}).scalar_one() + 1
        conn.execute(
            _EventSQL.insert,
            {"stream": stream, "seq": seq, "event": event, "data": data, "created_at": time.time()},
        )
        return int(seq)

    @staticmethod
    def emit_many(conn: Connection, stream: str, items: list[tuple[str, dict[str, Any]]]) -> None:
        """Append several events to one stream: one read of its last number, one insert."""
        if not items:
            return
        last = conn.execute(_EventSQL.last_seq, {"stream": stream}).scalar_one()
        now = time.time()
        conn.execute(
            _EventSQL.insert,
            [
                {"stream": stream, "seq": last + i, "event": event, "data": data, "created_at": now}
                for i, (event, data) in enumerate(items, start=1)
            ],
        )

    def events_after(self, stream: str, after: int, limit: int = 500) -> list[tuple[int, str, Any]]:
        """A stream's events ``(seq, event, data)`` after number ``after``, in order."""
        with self.read() as conn:
            rows = conn.execute(
                sa.select(t.events.c.seq, t.events.c.event, t.events.c.data)
                .where(t.events.c.stream == stream, t.events.c.seq > after)
                .order_by(t.events.c.seq)
                .limit(limit)
            ).all()
        return [(r.seq, r.event, r.data) for r in rows]


def page(
    table: sa.Table, status: str | None, limit: int, offset: int, tenant: str | None = None
) -> sa.Select[Any]:
    """A page of tasks or workflows: newest first (ties by id, so pages never overlap),
    optionally only those with ``status``, and only ``tenant``'s (``None``: every tenant's)."""
    q = sa.select(table).order_by(table.c.created_at.desc(), table.c.id).limit(limit).offset(offset)
    if tenant is not None:
        q = q.where(table.c.tenant == tenant)
    return q.where(table.c.status == status) if status else q
