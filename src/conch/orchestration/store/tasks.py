"""The task store: an agent task's row through its life, and the steps its run records.

A task is ``pending``, then ``running`` (held by one server under a lease, see
:mod:`.leases`), perhaps ``waiting`` for a person (held by none, see :mod:`.checkpoints`),
then ``succeeded``, ``failed`` or ``cancelled``. Tasks of one thread follow each other: a
task joins its thread only when the thread's tasks have all finished.

Tenants. A task belongs to its row's ``tenant``; readers that take a ``tenant`` read only
that tenant's tasks (``None``: every tenant's, the admin). A thread is a tenant's: its id
names a thread within the tenant, so two tenants' threads of one id never meet.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from conch.orchestration import tables as t
from conch.orchestration.errors import Conflict
from conch.orchestration.store.base import Database, page
from conch.orchestration.store.checkpoints import (
    CheckpointSeq,
    Entries,
    added_messages,
    append_entries,
)
from conch.orchestration.store.records import task_record

TASK_ACTIVE = ("pending", "running", "waiting")
# Held by a server (under a lease) while in these statuses; a waiting task is held by none.
TASK_HELD = ("pending", "running")
TASK_DONE = ("succeeded", "failed", "cancelled")
INTERRUPTED = {
    "kind": "InterruptedError",
    "reason": "interrupted",
    "message": "the server running it stopped before it finished",
}

# A thread's conversation so far, from its last task's row and the notes of its checkpoint.
Continues = Callable[[Any, dict[int, list[str]]], list[dict[str, Any]]]


class _TaskSQL:
    """The statements of a task's step, built once (see :class:`.base._EventSQL`)."""

    tk = t.tasks
    lock_steps = (
        sa.select(tk.c.id, tk.c.status, tk.c.owner, tk.c.steps)
        .where(tk.c.id == sa.bindparam("id"))
        .with_for_update()
    )
    set_steps = (
        sa.update(tk)
        .where(tk.c.id == sa.bindparam("k_id"))
        .values(
            steps=sa.bindparam("k_steps", type_=tk.c.steps.type),
            usage=sa.bindparam("k_usage", type_=tk.c.usage.type),
        )
    )


class TaskStore:
    """Agent tasks: created, started, stepped, finished, read."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def insert_task(
        self,
        row: dict[str, Any],
        entries: Entries | None = None,
        *,
        continues: Continues | None = None,
        new_thread: bool = False,
    ) -> dict[str, Any]:
        """Record a task (with its first checkpoint ``entries``: a fork's copy). A task with
        a ``thread_id`` joins that thread: Conflict if a task of the thread is still active,
        or (``new_thread``) if the thread has tasks at all; otherwise its ``history`` is
        ``continues(last, notes)``, the conversation of the thread's last task (the task's
        row and the notes of its checkpoint), when the thread has one."""
        with self.db.tx() as conn:
            thread = row.get("thread_id")
            if thread is not None:
                row = self._join_thread(conn, thread, row, continues, new_thread)
            conn.execute(sa.insert(t.tasks).values(**row))
            if entries:
                append_entries(conn, row["id"], entries)
            got = conn.execute(sa.select(t.tasks).where(t.tasks.c.id == row["id"])).one()
        return task_record(got)

    def _join_thread(
        self,
        conn: Connection,
        thread: str,
        row: dict[str, Any],
        continues: Continues | None,
        new_thread: bool,
    ) -> dict[str, Any]:
        """The row of a task that joins ``thread``, once the thread allows it."""
        tenant = row.get("tenant")
        self._lock_thread(conn, thread, tenant)
        tk = t.tasks
        earlier = conn.execute(
            sa.select(tk.c.id, tk.c.status, tk.c.created_at)
            .where(tk.c.thread_id == thread, _of(tk, tenant))
            .order_by(tk.c.created_at, tk.c.id)
        ).all()
        active = [r.id for r in earlier if r.status in TASK_ACTIVE]
        if active:
            raise Conflict(
                f"thread {thread!r}: task {active[0]!r} is still active; wait for it "
                "to finish (or cancel it) before adding to the thread"
            )
        if earlier and new_thread:
            raise Conflict(f"thread {thread!r} has tasks already: a fork starts a new thread")
        if earlier:
            # A thread's order is its tasks' creation times: later than the last, whatever
            # the clocks of the servers that created them say.
            row = {**row, "created_at": max(row["created_at"], earlier[-1].created_at + 1e-3)}
        if earlier and continues is not None:
            last = conn.execute(sa.select(tk).where(tk.c.id == earlier[-1].id)).one()
            row = {**row, "history": continues(last, added_messages(conn, last.id))}
        return row

    def _lock_thread(self, conn: Connection, thread: str, tenant: str | None) -> None:
        """Serialise the tasks added to one thread (PostgreSQL: a transaction-scoped advisory
        lock on the hash of the tenant and thread id; SQLite has one writer anyway)."""
        if not self.db.postgres:
            return
        name = f"conch-thread:{tenant or ''}:{thread}"
        digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
        key = int.from_bytes(digest, "big", signed=True)
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))

    def thread_session(self, thread: str) -> str | None:
        """The session of the thread's latest task that has one (None: none has)."""
        tk = t.tasks
        with self.db.read() as conn:
            return conn.execute(  # type: ignore[no-any-return]
                sa.select(tk.c.session)
                .where(tk.c.thread_id == thread, tk.c.session.is_not(None))
                .order_by(tk.c.created_at.desc(), tk.c.id.desc())
                .limit(1)
            ).scalar()

    def thread(self, thread: str, tenant: str | None = None) -> list[dict[str, Any]]:
        """The tasks of a thread, oldest first (``tenant``: that tenant's thread)."""
        tk = t.tasks
        q = sa.select(tk).where(tk.c.thread_id == thread)
        if tenant is not None:
            q = q.where(tk.c.tenant == tenant)
        with self.db.read() as conn:
            rows = conn.execute(q.order_by(tk.c.created_at, tk.c.id)).all()
        return [task_record(r) for r in rows]

    def start_task(self, id: str, owner: str, lease_until: float) -> bool:
        now = time.time()
        with self.db.tx() as conn:
            row = self.db.lock_row(conn, t.tasks, id)
            if row is None or row.status != "pending":
                return False
            conn.execute(
                sa.update(t.tasks)
                .where(t.tasks.c.id == id)
                .values(status="running", started_at=now, owner=owner, lease_until=lease_until)
            )
            self.db.emit(conn, f"task:{id}", "start", {"id": id, "status": "running"})
        return True

    def add_task_step(
        self,
        id: str,
        step: dict[str, Any],
        usage: dict[str, int],
        entries: Entries | None = None,
        owner: str | None = None,
        seq: CheckpointSeq | None = None,
    ) -> bool:
        """Record a step, and the checkpoint ``entries`` that completed it (a tool call's
        result), in one transaction; False if the task is no longer running (cancelled
        meanwhile) or no longer ``owner``'s. ``seq``: the running task's checkpoint number
        (:class:`CheckpointSeq`), kept up to date."""
        with self.db.tx() as conn:
            row = conn.execute(_TaskSQL.lock_steps, {"id": id}).first()
            if row is None or row.status != "running":
                return False
            if owner is not None and row.owner != owner:
                return False
            conn.execute(
                _TaskSQL.set_steps, {"k_id": id, "k_steps": [*row.steps, step], "k_usage": usage}
            )
            last = append_entries(conn, id, entries, seq) if entries else None
            self.db.emit(conn, f"task:{id}", "step", step)
        if seq is not None and last is not None:
            seq.last = last
        return True

    def set_task_protocol(self, id: str, owner: str, protocol: str, *, chosen: bool = False) -> bool:
        """Record the tool-call protocol (native | json) a running task of ``owner`` uses;
        False if it is no longer running as ``owner``'s. ``chosen``: the server chose it (the
        task asked for ``auto``), which its checkpoint keeps, so that a resumed task may
        still fall back to JSON actions before the model's first answer."""
        with self.db.tx() as conn:
            row = self.db.lock_row(conn, t.tasks, id, "owner")
            if row is None or row.status != "running" or row.owner != owner:
                return False
            conn.execute(sa.update(t.tasks).where(t.tasks.c.id == id).values(protocol=protocol))
            if chosen:
                append_entries(conn, id, [("protocol", {"protocol": protocol})])
        return True

    def finish_task(
        self,
        id: str,
        status: str,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        usage: dict[str, int] | None = None,
        steps: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any] | None:
        """Move an active task to a final status; None if it already had one."""
        now = time.time()
        with self.db.tx() as conn:
            row = self.db.lock_row(conn, t.tasks, id, "started_at")
            if row is None or row.status not in TASK_ACTIVE:
                return None
            values: dict[str, Any] = {
                "status": status,
                "result": result,
                "error": error,
                "finished_at": now,
                "lease_until": None,
                "pending": None,
                "wait_until": None,
            }
            if row.started_at is None:
                values["started_at"] = now
            if usage is not None:
                values["usage"] = usage
            if steps is not None:
                values["steps"] = steps
            conn.execute(sa.update(t.tasks).where(t.tasks.c.id == id).values(**values))
            got = conn.execute(sa.select(t.tasks).where(t.tasks.c.id == id)).one()
            record = task_record(got)
            self.db.emit(conn, f"task:{id}", *_final_event(record, result, error))
        return record

    def task_row(self, id: str) -> dict[str, Any] | None:
        """A task's columns as they are stored."""
        with self.db.read() as conn:
            row = conn.execute(sa.select(t.tasks).where(t.tasks.c.id == id)).first()
        return None if row is None else dict(row._mapping)

    def active_counts(self) -> dict[str, int]:
        """Tasks pending or running (``active_tasks``) and waiting for a person
        (``waiting_tasks``): read every 2 s for the status history, so a range of the status
        index, where ``Stores.metrics`` scans every task."""
        tk = t.tasks
        with self.db.read() as conn:
            by_status: dict[str, int] = dict(
                conn.execute(
                    sa.select(tk.c.status, sa.func.count())
                    .where(tk.c.status.in_(("pending", "running", "waiting")))
                    .group_by(tk.c.status)
                ).all()
            )
        return {
            "active_tasks": int(by_status.get("pending", 0) + by_status.get("running", 0)),
            "waiting_tasks": int(by_status.get("waiting", 0)),
        }

    def get_task(self, id: str) -> dict[str, Any] | None:
        with self.db.read() as conn:
            row = conn.execute(sa.select(t.tasks).where(t.tasks.c.id == id)).first()
        return task_record(row) if row is not None else None

    def task_status(self, id: str) -> str | None:
        with self.db.read() as conn:
            return conn.execute(  # type: ignore[no-any-return]
                sa.select(t.tasks.c.status).where(t.tasks.c.id == id)
            ).scalar_one_or_none()

    def list_tasks(
        self, status: str | None = None, limit: int = 100, offset: int = 0,
        tenant: str | None = None,
    ) -> list[dict[str, Any]]:
        """Tasks newest first (``tenant``: only that tenant's)."""
        q = page(t.tasks, status, limit, offset, tenant)
        with self.db.read() as conn:
            return [task_record(r) for r in conn.execute(q)]


def _of(table: sa.Table, tenant: str | None) -> Any:
    """The rows of ``tenant`` (``None``: the admin's, made without a tenant)."""
    return table.c.tenant.is_(None) if tenant is None else table.c.tenant == tenant


def _final_event(
    record: dict[str, Any], result: Any, error: dict[str, Any] | None
) -> tuple[str, dict[str, Any]]:
    """The event that ends a task's stream: ``complete``, or ``error`` for any other end."""
    id, status = record["id"], record["status"]
    if status == "succeeded":
        return "complete", {
            "id": id,
            "status": status,
            "result": result,
            "elapsed_ms": record["duration_ms"],
            "usage": record["usage"],
        }
    err = error or {}
    return "error", {
        "id": id,
        "status": status,
        "kind": err.get("kind"),
        "message": err.get("message", ""),
        "reason": err.get("reason"),
    }
