"""The checkpoint and approval store: a task's checkpoint entries, and the waits for a person.

A task's checkpoint (``orch_checkpoints``) holds every model reply and tool call of its run as
it completed, and every approval asked for and decided (:mod:`conch.orchestration.checkpoints`
reads it back). While a task runs, its run is its checkpoint's only writer
(:class:`CheckpointSeq`); a task whose tool call needs a person's approval is ``waiting``: no
server holds it (no lease), its ``pending`` calls are in its row, and whichever server records
the decision (or notices the approval timeout) takes it and resumes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from conch.orchestration import tables as t
from conch.orchestration.errors import Conflict, Invalid, NotFound
from conch.orchestration.store.base import Database
from conch.orchestration.store.records import iso, task_record

Entries = list[tuple[str, dict[str, Any]]]


@dataclass
class CheckpointSeq:
    """The last ``seq`` of a task's checkpoint, as the server running the task knows it.

    While a task runs, its run is the only writer of its checkpoint: approvals write their
    ``decision`` entries only while it is ``waiting`` (held by no server), a fork copies
    entries into a new task, a server runs one run of a task at a time, and a server that
    takes the task over starts a run of its own while the old run's writes are refused by
    the owner check. So the run keeps the number instead of reading ``max(seq)`` in each of
    its transactions. ``last`` None: not known yet (a run starts so), read at the next write;
    advanced only once a transaction that added entries has committed."""

    last: int | None = None


class _CheckpointSQL:
    """The statements of a task's step path, built once: a tool step runs two transactions
    of them."""

    tk, c = t.tasks, t.checkpoints
    lock = (
        sa.select(tk.c.id, tk.c.status, tk.c.owner)
        .where(tk.c.id == sa.bindparam("id"))
        .with_for_update()
    )
    last_seq = sa.select(sa.func.coalesce(sa.func.max(c.c.seq), 0)).where(
        c.c.task_id == sa.bindparam("id")
    )
    insert = sa.insert(c)


def append_entries(
    conn: Connection, id: str, entries: Entries, seq: CheckpointSeq | None = None
) -> int:
    """Append entries to a task's checkpoint, after its last ``seq`` as ``seq`` knows it (or
    as read here); returns the new last ``seq``. Callers hold the task row's lock. A wrong
    ``seq`` cannot overwrite an entry: ``(task_id, seq)`` is the key, and the transaction
    fails."""
    last = None if seq is None else seq.last
    if last is None:
        last = conn.execute(_CheckpointSQL.last_seq, {"id": id}).scalar_one()
    now = time.time()
    conn.execute(
        _CheckpointSQL.insert,
        [
            {"task_id": id, "seq": last + i, "kind": kind, "data": data, "created_at": now}
            for i, (kind, data) in enumerate(entries, start=1)
        ],
    )
    return int(last) + len(entries)


def added_messages(conn: Connection, id: str) -> dict[int, list[str]]:
    """The user messages a task's checkpoint added, by the step they came before."""
    c = t.checkpoints
    out: dict[int, list[str]] = {}
    for data in conn.execute(
        sa.select(c.c.data).where(c.c.task_id == id, c.c.kind == "message").order_by(c.c.seq)
    ).scalars():
        out.setdefault(int(data["before"]), []).append(str(data["content"]))
    return out


# Why edited arguments do not fit a call: ``(where, message)``, or None when they do.
ArgsCheck = Callable[[dict[str, Any], Any], tuple[str, str] | None]


class CheckpointStore:
    """A task's checkpoint (written by its run, read back to resume or fork it) and the
    approvals of its calls."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def add_checkpoint(
        self, id: str, owner: str, entries: Entries, seq: CheckpointSeq | None = None
    ) -> bool:
        """Record checkpoint entries ``(kind, data)`` of a running task held by ``owner``;
        False if the task is no longer running or no longer its (cancelled, or taken over).
        ``seq``: the running task's checkpoint number, kept up to date."""
        with self.db.tx() as conn:
            row = conn.execute(_CheckpointSQL.lock, {"id": id}).first()
            if row is None or row.status != "running" or row.owner != owner:
                return False
            last = append_entries(conn, id, entries, seq)
        if seq is not None:
            seq.last = last
        return True

    def checkpoint(self, id: str) -> tuple[Any, list[tuple[str, Any]]] | None:
        """A task's row and its checkpoint entries ``(kind, data)`` in order."""
        c = t.checkpoints
        with self.db.read() as conn:
            row = conn.execute(sa.select(t.tasks).where(t.tasks.c.id == id)).first()
            if row is None:
                return None
            entries = conn.execute(
                sa.select(c.c.kind, c.c.data).where(c.c.task_id == id).order_by(c.c.seq)
            ).all()
        return row, [(e.kind, e.data) for e in entries]

    def checkpoint_entries(self, id: str) -> list[dict[str, Any]] | None:
        """A task's checkpoint as records ``{seq, kind, data, created_at}``."""
        c = t.checkpoints
        with self.db.read() as conn:
            if conn.execute(sa.select(t.tasks.c.id).where(t.tasks.c.id == id)).first() is None:
                return None
            rows = conn.execute(sa.select(c).where(c.c.task_id == id).order_by(c.c.seq)).all()
        return [
            {"seq": r.seq, "kind": r.kind, "data": r.data, "created_at": iso(r.created_at)}
            for r in rows
        ]

    # -- approvals ------------------------------------------------------------------------

    def wait_task(
        self,
        id: str,
        owner: str,
        pending: list[dict[str, Any]],
        wait_until: float | None,
        usage: dict[str, int],
        entries: Entries | None = None,
    ) -> bool:
        """A running task of ``owner`` stops to wait for a person: ``entries`` (results of
        calls of the same model turn that completed meanwhile) and ``ask`` entries in its
        checkpoint, status ``waiting`` with its ``pending`` calls, no server holding it, an
        ``interrupt`` event. False if it was no longer running as ``owner``'s."""
        with self.db.tx() as conn:
            row = self.db.lock_row(conn, t.tasks, id, "owner")
            if row is None or row.status != "running" or row.owner != owner:
                return False
            append_entries(conn, id, [*(entries or []), *(("ask", dict(p)) for p in pending)])
            conn.execute(
                sa.update(t.tasks)
                .where(t.tasks.c.id == id)
                .values(
                    status="waiting",
                    pending=pending,
                    wait_until=wait_until,
                    owner=None,
                    lease_until=None,
                    usage=usage,
                )
            )
            self.db.emit(
                conn,
                f"task:{id}",
                "interrupt",
                {"id": id, "status": "waiting", "pending": pending,
                 "approval_deadline": iso(wait_until)},
            )  # fmt: skip
        return True

    def decide(
        self,
        id: str,
        *,
        approve: bool,
        call_id: str | None,
        owner: str,
        lease_until: float,
        args: dict[str, Any] | None = None,
        message: str | None = None,
        check: ArgsCheck | None = None,
        by: str = "person",
        key: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Record a decision on one pending call of a waiting task (``call_id``, or the
        only one); ``key``: the API key that decided (``{id, name}``), kept with it so that
        the task's history says who. Once none is pending the task is ``running`` again, held by ``owner``
        (who resumes it), with a ``resume`` event. ``check(item, args)`` may refuse edited
        arguments with ``(where, message)``. Returns ``{record, resumed}``; raises
        NotFound, Conflict or Invalid."""
        with self.db.tx() as conn:
            row = self.db.lock_row(conn, t.tasks, id, "pending")
            if row is None:
                raise NotFound(f"no task {id!r}")
            if row.status != "waiting":
                raise Conflict(f"task {id!r} is {row.status}, not waiting for an approval")
            pending: list[dict[str, Any]] = list(row.pending or [])
            item = _pending_call(pending, call_id)
            decision: dict[str, Any] = {
                "call_id": item["call_id"],
                "decision": "approve" if approve else "reject",
                "by": by,
            }
            if key is not None:
                decision["key"] = key
            if approve:
                if args is not None and check is not None:
                    problem = check(item, args)
                    if problem is not None:
                        raise Invalid(problem[1], where=problem[0])
                decision["args"] = item["args"] if args is None else args
                decision["edited"] = args is not None and args != item["args"]
            else:
                decision["message"] = message
            append_entries(conn, id, [("decision", decision)])
            rest = [p for p in pending if p["call_id"] != item["call_id"]]
            resumed = not rest
            self._after_decision(conn, id, rest, decision, owner, lease_until)
            got = conn.execute(sa.select(t.tasks).where(t.tasks.c.id == id)).one()
        return {"record": task_record(got), "resumed": resumed}

    def _after_decision(
        self,
        conn: Connection,
        id: str,
        rest: list[dict[str, Any]],
        decision: dict[str, Any],
        owner: str,
        lease_until: float,
    ) -> None:
        """The task's row once a decision is recorded: still waiting for the ``rest``, or
        (none left) running again as ``owner``'s, with a ``resume`` event."""
        values: dict[str, Any] = {"pending": rest}
        if not rest:
            values.update(
                status="running", pending=None, wait_until=None, owner=owner,
                lease_until=lease_until,
            )  # fmt: skip
        conn.execute(sa.update(t.tasks).where(t.tasks.c.id == id).values(**values))
        if rest:
            return
        reason = {"approve": "approved", "reject": "rejected"}[decision["decision"]]
        if decision["by"] == "timeout":
            reason = "timeout"
        event = {"id": id, "status": "running", "reason": reason, **decision}
        self.db.emit(conn, f"task:{id}", "resume", event)

    def overdue_waits(self, now: float) -> list[tuple[str, list[dict[str, Any]]]]:
        """Waiting tasks whose approval timeout has passed, with their pending calls."""
        with self.db.read() as conn:
            rows = conn.execute(
                sa.select(t.tasks.c.id, t.tasks.c.pending).where(
                    t.tasks.c.status == "waiting",
                    t.tasks.c.wait_until.is_not(None),
                    t.tasks.c.wait_until <= now,
                )
            ).all()
        return [(r.id, list(r.pending or [])) for r in rows]


def _pending_call(pending: list[dict[str, Any]], call_id: str | None) -> dict[str, Any]:
    """The pending call a decision is about: ``call_id``, or the only one."""
    ids = [p["call_id"] for p in pending]
    if call_id is None:
        if len(pending) != 1:
            raise Invalid(
                f"call_id: {len(pending)} calls are pending ({', '.join(ids)}); say which one",
                where="call_id",
            )
        return pending[0]
    found = [p for p in pending if p["call_id"] == call_id]
    if not found:
        raise Invalid(
            f"call_id: no pending call {call_id!r} (pending: {', '.join(ids)})", where="call_id"
        )
    return found[0]
