"""Every read and write of orchestration state (synchronous SQLAlchemy Core; the service
calls these from worker threads).

Concurrency. Each state change and the events it emits commit in one transaction. On
PostgreSQL several servers share the tables: transitions of one workflow lock its row
(``SELECT … FOR UPDATE``), and servers claim runnable steps with
``SELECT … FOR UPDATE SKIP LOCKED`` so that no step is handed out twice; claims lock only
step rows (never the workflow row) so the two kinds of transaction cannot deadlock. SQLite
has one writer at a time anyway; a process-wide lock keeps this process's writers from
tripping over each other's read-then-write transactions.

Leases. A server that runs a task or a step holds it until ``lease_until`` and renews that
while it works. Work whose lease ran out belongs to a server that died: another server (or
this one restarted) claims its tasks and resumes them from their checkpoints
(``orch_checkpoints``: every model reply and tool call as it completed); steps go back to
pending if they have attempts left, so workflows resume. A task whose checkpoint cannot be
read is failed with reason ``interrupted``.

Waiting. A task whose tool call needs a person's approval is ``waiting``: no server holds it
(no lease), its ``pending`` calls are in its row, and whichever server records the decision
(or notices the approval timeout) claims it and resumes it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from conch.orchestration import tables as t
from conch.orchestration.spec import Plan

TASK_ACTIVE = ("pending", "running", "waiting")
# Held by a server (under a lease) while in these statuses; a waiting task is held by none.
TASK_HELD = ("pending", "running")
TASK_DONE = ("succeeded", "failed", "cancelled")
STEP_DONE = ("succeeded", "failed", "skipped", "cancelled")
INTERRUPTED = {
    "kind": "InterruptedError",
    "reason": "interrupted",
    "message": "the server running it stopped before it finished",
}


@dataclass
class StepOutcome:
    """What one run of a step came to, waiting to be recorded."""

    plan: Plan
    workflow_id: str
    step_id: str
    ok: bool
    result: Any = None
    error: dict[str, Any] | None = None
    backoff_s: float = 1.0


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


class _Hot:
    """The statements of a scheduling round, built once. Building a Core statement and its
    cache key costs more than SQLite takes to run it; a statement object that is reused
    keeps both, and its parameters come in as bind values."""

    s, w, e = t.workflow_steps, t.workflows, t.events
    last_seq = sa.select(sa.func.coalesce(sa.func.max(e.c.seq), 0)).where(
        e.c.stream == sa.bindparam("stream")
    )
    insert_event = sa.insert(e)
    lock_workflow = (
        sa.select(w.c.id, w.c.status).where(w.c.id == sa.bindparam("id")).with_for_update()
    )
    step_rows = sa.select(s.c.id, s.c.status, s.c.owner, s.c.attempts, s.c.max_attempts).where(
        s.c.workflow_id == sa.bindparam("wf"), s.c.id.in_(sa.bindparam("ids", expanding=True))
    )
    succeed = (
        sa.update(s)
        .where(s.c.workflow_id == sa.bindparam("k_wf"), s.c.id == sa.bindparam("k_id"))
        .values(
            status="succeeded",
            result=sa.bindparam("k_result", type_=s.c.result.type),
            error=None,
            finished_at=sa.bindparam("k_now", type_=sa.Float),
            lease_until=None,
        )
    )
    unblock = (
        sa.update(s)
        .where(s.c.workflow_id == sa.bindparam("k_wf"), s.c.id == sa.bindparam("k_id"))
        .values(blocked=s.c.blocked - sa.bindparam("k_n", type_=sa.Integer))
    )
    any_active = (
        sa.select(s.c.id)
        .where(s.c.workflow_id == sa.bindparam("wf"), s.c.status.in_(("pending", "running")))
        .limit(1)
    )
    claimable = (
        sa.select(s.c.workflow_id, s.c.id)
        .join(w, w.c.id == s.c.workflow_id)
        .where(
            s.c.status == "pending",
            s.c.blocked == 0,
            s.c.not_before <= sa.bindparam("now", type_=sa.Float),
            w.c.status == "running",
        )
        .order_by(w.c.created_at, s.c.position)
        .limit(sa.bindparam("lim", type_=sa.Integer))
        .with_for_update(of=s, skip_locked=True)
    )
    claim = (
        sa.update(s)
        .where(
            sa.tuple_(s.c.workflow_id, s.c.id).in_(sa.bindparam("keys", expanding=True)),
            s.c.status == "pending",
        )
        .values(
            status="running",
            owner=sa.bindparam("owner", type_=sa.String),
            lease_until=sa.bindparam("lease", type_=sa.Float),
            attempts=s.c.attempts + 1,
            started_at=sa.bindparam("now", type_=sa.Float),
            finished_at=None,
        )
        .returning(s.c.workflow_id, s.c.id, s.c.attempts)
    )


class _TaskHot:
    """The statements of a task's step path (its checkpoint entries, its step, its event),
    built once like :class:`_Hot`'s: a tool step runs two transactions of them."""

    tk, c = t.tasks, t.checkpoints
    # The row locks of :meth:`Store._lock_row`: status, owner (and the steps, to add one).
    lock = (
        sa.select(tk.c.id, tk.c.status, tk.c.owner)
        .where(tk.c.id == sa.bindparam("id"))
        .with_for_update()
    )
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
    last_seq = sa.select(sa.func.coalesce(sa.func.max(c.c.seq), 0)).where(
        c.c.task_id == sa.bindparam("id")
    )
    insert = sa.insert(c)


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_record(row: Any) -> dict[str, Any]:
    duration = None
    if row.started_at is not None and row.finished_at is not None:
        duration = int((row.finished_at - row.started_at) * 1000)
    return {
        "id": row.id,
        "goal": row.goal,
        "tools": row.tools,
        "max_steps": row.max_steps,
        "agent": row.agent,
        "model": row.model,
        "status": row.status,
        "steps": row.steps,
        "result": row.result,
        "error": row.error,
        "created_at": iso(row.created_at),
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
        "duration_ms": duration,
        "usage": row.usage,
        "pending": row.pending or [],
        "approvals": row.approvals or {},
        "approval_timeout_s": row.approval_timeout_s,
        "approval_deadline": iso(row.wait_until),
        "thread_id": row.thread_id,
        "forked_from": row.forked_from,
        "fork_checkpoint": row.fork_checkpoint,
        "protocol": row.protocol,
    }


def step_record(row: Any, definition: dict[str, Any] | None = None) -> dict[str, Any]:
    status = row.status
    if status == "running" and getattr(row, "task_status", None) == "waiting":
        # Its agent task waits for a person's approval.
        status = "waiting"
    out = {
        "id": row.id,
        "status": status,
        "result": row.result,
        "error": row.error,
        "attempts": row.attempts,
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
    }
    if row.task_id is not None:
        out["task_id"] = row.task_id
    if definition is not None:
        out["definition"] = definition
    return out


def _steps_with_task_status() -> sa.Select[Any]:
    """Workflow steps with the status of their agent task (a running step whose task waits
    for an approval shows as ``waiting``)."""
    s, tk = t.workflow_steps, t.tasks
    return sa.select(s, tk.c.status.label("task_status")).select_from(
        s.outerjoin(tk, tk.c.id == s.c.task_id)
    )


def _page(table: sa.Table, status: str | None, limit: int, offset: int) -> sa.Select[Any]:
    """A page of tasks or workflows: newest first (ties by id, so pages never overlap),
    optionally only those with ``status``."""
    q = sa.select(table).order_by(table.c.created_at.desc(), table.c.id).limit(limit).offset(offset)
    return q.where(table.c.status == status) if status else q


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.postgres = engine.dialect.name == "postgresql"
        self._lock = threading.Lock() if not self.postgres else None

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        if self._lock is None:
            with self.engine.begin() as conn:
                yield conn
            return
        with self._lock, self.engine.begin() as conn:
            yield conn

    # -- events ---------------------------------------------------------------------------

    def _emit(self, conn: Connection, stream: str, event: str, data: dict[str, Any]) -> int:
        """Append an event; callers hold the lock of the stream's parent row."""
        seq = conn.execute(_Hot.last_seq, {"stream": stream}).scalar_one() + 1
        conn.execute(
            _Hot.insert_event,
            {"stream": stream, "seq": seq, "event": event, "data": data, "created_at": time.time()},
        )
        return int(seq)

    def _emit_many(
        self, conn: Connection, stream: str, items: list[tuple[str, dict[str, Any]]]
    ) -> None:
        """Append several events to one stream: one read of its last number, one insert."""
        if not items:
            return
        last = conn.execute(_Hot.last_seq, {"stream": stream}).scalar_one()
        now = time.time()
        conn.execute(
            _Hot.insert_event,
            [
                {"stream": stream, "seq": last + i, "event": event, "data": data, "created_at": now}
                for i, (event, data) in enumerate(items, start=1)
            ],
        )

    def events_after(self, stream: str, after: int, limit: int = 500) -> list[tuple[int, str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.events.c.seq, t.events.c.event, t.events.c.data)
                .where(t.events.c.stream == stream, t.events.c.seq > after)
                .order_by(t.events.c.seq)
                .limit(limit)
            ).all()
        return [(r.seq, r.event, r.data) for r in rows]

    def _lock_row(self, conn: Connection, table: sa.Table, id: str, *columns: str) -> Any:
        """Lock a row and read ``status`` and the named columns: never the whole row, whose
        JSON columns (a workflow's definition, a task's steps) may be large."""
        cols = [table.c.id, table.c.status, *(table.c[name] for name in columns)]
        return conn.execute(sa.select(*cols).where(table.c.id == id).with_for_update()).first()

    # -- tasks ----------------------------------------------------------------------------

    def insert_task(
        self,
        row: dict[str, Any],
        entries: list[tuple[str, dict[str, Any]]] | None = None,
        *,
        continues: Callable[[Any, dict[int, list[str]]], list[dict[str, Any]]] | None = None,
        new_thread: bool = False,
    ) -> dict[str, Any]:
        """Record a task (with its first checkpoint ``entries``: a fork's copy). A task with
        a ``thread_id`` joins that thread: Conflict if a task of the thread is still active,
        or (``new_thread``) if the thread has tasks at all; otherwise its ``history`` is
        ``continues(last, notes)``, the conversation of the thread's last task (the task's
        row and the notes of its checkpoint), when the thread has one."""
        from conch.orchestration.errors import Conflict

        with self.tx() as conn:
            thread = row.get("thread_id")
            if thread is not None:
                self._lock_thread(conn, thread)
                tk = t.tasks
                earlier = conn.execute(
                    sa.select(tk.c.id, tk.c.status, tk.c.created_at)
                    .where(tk.c.thread_id == thread)
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
                    # A thread's order is its tasks' creation times: later than the last,
                    # whatever the clocks of the servers that created them say.
                    row = {**row, "created_at": max(row["created_at"], earlier[-1].created_at + 1e-3)}
                if earlier and continues is not None:
                    last = conn.execute(sa.select(tk).where(tk.c.id == earlier[-1].id)).one()
                    row = {**row, "history": continues(last, self._notes(conn, last.id))}
            conn.execute(sa.insert(t.tasks).values(**row))
            if entries:
                self._checkpoint(conn, row["id"], entries)
            got = conn.execute(sa.select(t.tasks).where(t.tasks.c.id == row["id"])).one()
        return task_record(got)

    def _lock_thread(self, conn: Connection, thread: str) -> None:
        """Serialise the tasks added to one thread (PostgreSQL: a transaction-scoped advisory
        lock on the thread id's hash; SQLite has one writer anyway)."""
        if not self.postgres:
            return
        digest = hashlib.blake2b(f"conch-thread:{thread}".encode(), digest_size=8).digest()
        key = int.from_bytes(digest, "big", signed=True)
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))

    def _notes(self, conn: Connection, id: str) -> dict[int, list[str]]:
        """The user messages a task's checkpoint added, by the step they came before."""
        c = t.checkpoints
        out: dict[int, list[str]] = {}
        for data in conn.execute(
            sa.select(c.c.data).where(c.c.task_id == id, c.c.kind == "message").order_by(c.c.seq)
        ).scalars():
            out.setdefault(int(data["before"]), []).append(str(data["content"]))
        return out

    def thread(self, thread: str) -> list[dict[str, Any]]:
        """The tasks of a thread, oldest first."""
        tk = t.tasks
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(tk).where(tk.c.thread_id == thread).order_by(tk.c.created_at, tk.c.id)
            ).all()
        return [task_record(r) for r in rows]

    def start_task(self, id: str, owner: str, lease_until: float) -> bool:
        now = time.time()
        with self.tx() as conn:
            row = self._lock_row(conn, t.tasks, id)
            if row is None or row.status != "pending":
                return False
            conn.execute(
                sa.update(t.tasks)
                .where(t.tasks.c.id == id)
                .values(status="running", started_at=now, owner=owner, lease_until=lease_until)
            )
            self._emit(conn, f"task:{id}", "start", {"id": id, "status": "running"})
        return True

    def add_task_step(
        self,
        id: str,
        step: dict[str, Any],
        usage: dict[str, int],
        entries: list[tuple[str, dict[str, Any]]] | None = None,
        owner: str | None = None,
        seq: CheckpointSeq | None = None,
    ) -> bool:
        """Record a step, and the checkpoint ``entries`` that completed it (a tool call's
        result), in one transaction; False if the task is no longer running (cancelled
        meanwhile) or no longer ``owner``'s. ``seq``: the running task's checkpoint number
        (:class:`CheckpointSeq`), kept up to date."""
        h = _TaskHot
        with self.tx() as conn:
            row = conn.execute(h.lock_steps, {"id": id}).first()
            if row is None or row.status != "running":
                return False
            if owner is not None and row.owner != owner:
                return False
            conn.execute(h.set_steps, {"k_id": id, "k_steps": [*row.steps, step], "k_usage": usage})
            last = self._checkpoint(conn, id, entries, seq) if entries else None
            self._emit(conn, f"task:{id}", "step", step)
        if seq is not None and last is not None:
            seq.last = last
        return True

    # -- checkpoints and approvals ----------------------------------------------------------

    def _checkpoint(
        self,
        conn: Connection,
        id: str,
        entries: list[tuple[str, dict[str, Any]]],
        seq: CheckpointSeq | None = None,
    ) -> int:
        """Append entries to a task's checkpoint, after its last ``seq`` as ``seq`` knows it
        (or as read here); returns the new last ``seq``. Callers hold the task row's lock. A
        wrong ``seq`` cannot overwrite an entry: ``(task_id, seq)`` is the key, and the
        transaction fails."""
        last = None if seq is None else seq.last
        if last is None:
            last = conn.execute(_TaskHot.last_seq, {"id": id}).scalar_one()
        now = time.time()
        conn.execute(
            _TaskHot.insert,
            [
                {"task_id": id, "seq": last + i, "kind": kind, "data": data, "created_at": now}
                for i, (kind, data) in enumerate(entries, start=1)
            ],
        )
        return int(last) + len(entries)

    def set_task_protocol(self, id: str, owner: str, protocol: str, *, chosen: bool = False) -> bool:
        """Record the tool-call protocol (native | json) a running task of ``owner`` uses;
        False if it is no longer running as ``owner``'s. ``chosen``: the server chose it (the
        task asked for ``auto``), which its checkpoint keeps, so that a resumed task may
        still fall back to JSON actions before the model's first answer."""
        with self.tx() as conn:
            row = self._lock_row(conn, t.tasks, id, "owner")
            if row is None or row.status != "running" or row.owner != owner:
                return False
            conn.execute(sa.update(t.tasks).where(t.tasks.c.id == id).values(protocol=protocol))
            if chosen:
                self._checkpoint(conn, id, [("protocol", {"protocol": protocol})], None)
        return True

    def add_checkpoint(
        self,
        id: str,
        owner: str,
        entries: list[tuple[str, dict[str, Any]]],
        seq: CheckpointSeq | None = None,
    ) -> bool:
        """Record checkpoint entries ``(kind, data)`` of a running task held by ``owner``;
        False if the task is no longer running or no longer its (cancelled, or taken over).
        ``seq``: the running task's checkpoint number, kept up to date."""
        with self.tx() as conn:
            row = conn.execute(_TaskHot.lock, {"id": id}).first()
            if row is None or row.status != "running" or row.owner != owner:
                return False
            last = self._checkpoint(conn, id, entries, seq)
        if seq is not None:
            seq.last = last
        return True

    def checkpoint(self, id: str) -> tuple[Any, list[tuple[str, Any]]] | None:
        """A task's row and its checkpoint entries ``(kind, data)`` in order."""
        c = t.checkpoints
        with self.engine.connect() as conn:
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
        with self.engine.connect() as conn:
            if conn.execute(sa.select(t.tasks.c.id).where(t.tasks.c.id == id)).first() is None:
                return None
            rows = conn.execute(sa.select(c).where(c.c.task_id == id).order_by(c.c.seq)).all()
        return [
            {"seq": r.seq, "kind": r.kind, "data": r.data, "created_at": iso(r.created_at)}
            for r in rows
        ]

    def wait_task(
        self,
        id: str,
        owner: str,
        pending: list[dict[str, Any]],
        wait_until: float | None,
        usage: dict[str, int],
        entries: list[tuple[str, dict[str, Any]]] | None = None,
    ) -> bool:
        """A running task of ``owner`` stops to wait for a person: ``entries`` (results of
        calls of the same model turn that completed meanwhile) and ``ask`` entries in its
        checkpoint, status ``waiting`` with its ``pending`` calls, no server holding it, an
        ``interrupt`` event. False if it was no longer running as ``owner``'s."""
        with self.tx() as conn:
            row = self._lock_row(conn, t.tasks, id, "owner")
            if row is None or row.status != "running" or row.owner != owner:
                return False
            self._checkpoint(conn, id, [*(entries or []), *(("ask", dict(p)) for p in pending)])
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
            self._emit(
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
        check: Any = None,
        by: str = "person",
    ) -> dict[str, Any]:
        """Record a decision on one pending call of a waiting task (``call_id``, or the
        only one). Once none is pending the task is ``running`` again, held by ``owner``
        (who resumes it), with a ``resume`` event. ``check(item, args)`` may refuse edited
        arguments with ``(where, message)``. Returns ``{record, resumed}``; raises
        NotFound, Conflict or Invalid."""
        from conch.orchestration.errors import Conflict, Invalid, NotFound

        with self.tx() as conn:
            row = self._lock_row(conn, t.tasks, id, "pending")
            if row is None:
                raise NotFound(f"no task {id!r}")
            if row.status != "waiting":
                raise Conflict(f"task {id!r} is {row.status}, not waiting for an approval")
            pending: list[dict[str, Any]] = list(row.pending or [])
            ids = [p["call_id"] for p in pending]
            if call_id is None:
                if len(pending) != 1:
                    raise Invalid(
                        f"call_id: {len(pending)} calls are pending ({', '.join(ids)}); "
                        "say which one",
                        where="call_id",
                    )
                item = pending[0]
            else:
                found = [p for p in pending if p["call_id"] == call_id]
                if not found:
                    raise Invalid(
                        f"call_id: no pending call {call_id!r} (pending: {', '.join(ids)})",
                        where="call_id",
                    )
                item = found[0]
            decision: dict[str, Any] = {
                "call_id": item["call_id"],
                "decision": "approve" if approve else "reject",
                "by": by,
            }
            if approve:
                if args is not None and check is not None:
                    problem = check(item, args)
                    if problem is not None:
                        raise Invalid(problem[1], where=problem[0])
                decision["args"] = item["args"] if args is None else args
                decision["edited"] = args is not None and args != item["args"]
            else:
                decision["message"] = message
            self._checkpoint(conn, id, [("decision", decision)])
            rest = [p for p in pending if p["call_id"] != item["call_id"]]
            values: dict[str, Any] = {"pending": rest}
            resumed = not rest
            if resumed:
                values.update(
                    status="running", pending=None, wait_until=None, owner=owner,
                    lease_until=lease_until,
                )  # fmt: skip
            conn.execute(sa.update(t.tasks).where(t.tasks.c.id == id).values(**values))
            if resumed:
                reason = {"approve": "approved", "reject": "rejected"}[decision["decision"]]
                if by == "timeout":
                    reason = "timeout"
                event = {"id": id, "status": "running", "reason": reason, **decision}
                self._emit(conn, f"task:{id}", "resume", event)
            got = conn.execute(sa.select(t.tasks).where(t.tasks.c.id == id)).one()
        return {"record": task_record(got), "resumed": resumed}

    def overdue_waits(self, now: float) -> list[tuple[str, list[dict[str, Any]]]]:
        """Waiting tasks whose approval timeout has passed, with their pending calls."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.tasks.c.id, t.tasks.c.pending).where(
                    t.tasks.c.status == "waiting",
                    t.tasks.c.wait_until.is_not(None),
                    t.tasks.c.wait_until <= now,
                )
            ).all()
        return [(r.id, list(r.pending or [])) for r in rows]

    def task_step_event(self, task_id: str, status: str) -> str | None:
        """Tell the workflow whose step runs this task that the step is now ``status``
        (``waiting`` or ``running``); returns the workflow's id."""
        s = t.workflow_steps
        with self.tx() as conn:
            step = conn.execute(
                sa.select(s.c.workflow_id, s.c.id).where(
                    s.c.task_id == task_id, s.c.status == "running"
                )
            ).first()
            if step is None:
                return None
            self._lock_row(conn, t.workflows, step.workflow_id)
            self._emit(
                conn,
                f"workflow:{step.workflow_id}",
                "step",
                {"id": step.id, "status": status, "task_id": task_id},
            )
        return str(step.workflow_id)

    def claim_task(
        self, id: str, owner: str, lease_until: float, *, everything: bool = False
    ) -> str | None:
        """Take over a pending or running task whose lease ran out (``everything``: whatever
        its lease); returns its status, or None if it was not taken."""
        now = time.time()
        tk = t.tasks
        cond = [tk.c.id == id, tk.c.status.in_(TASK_HELD)]
        if not everything:
            cond.append(sa.or_(tk.c.lease_until.is_(None), tk.c.lease_until < now))
        with self.tx() as conn:
            got = conn.execute(
                sa.update(tk)
                .where(*cond)
                .values(owner=owner, lease_until=lease_until)
                .returning(tk.c.status)
            ).first()
            if got is not None and got.status == "running":
                self._emit(
                    conn, f"task:{id}", "resume",
                    {"id": id, "status": "running", "reason": "recovered"},
                )  # fmt: skip
        return None if got is None else str(got.status)

    def release_task(self, id: str, owner: str) -> None:
        """Give a task back (this server stops): the next server to look claims it at once."""
        with self.tx() as conn:
            conn.execute(
                sa.update(t.tasks)
                .where(t.tasks.c.id == id, t.tasks.c.owner == owner,
                       t.tasks.c.status.in_(TASK_HELD))
                .values(owner=None, lease_until=0.0)
            )  # fmt: skip

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
        with self.tx() as conn:
            row = self._lock_row(conn, t.tasks, id, "started_at")
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
            if status == "succeeded":
                self._emit(
                    conn,
                    f"task:{id}",
                    "complete",
                    {
                        "id": id,
                        "status": status,
                        "result": result,
                        "elapsed_ms": record["duration_ms"],
                        "usage": record["usage"],
                    },
                )
            else:
                err = error or {}
                self._emit(
                    conn,
                    f"task:{id}",
                    "error",
                    {
                        "id": id,
                        "status": status,
                        "kind": err.get("kind"),
                        "message": err.get("message", ""),
                        "reason": err.get("reason"),
                    },
                )
        return record

    def task_row(self, id: str) -> dict[str, Any] | None:
        """A task's columns as they are stored."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t.tasks).where(t.tasks.c.id == id)).first()
        return None if row is None else dict(row._mapping)

    def step_task(self, wf_id: str, step_id: str) -> dict[str, Any] | None:
        """The record of the task a workflow step started, if it did."""
        s = t.workflow_steps
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(t.tasks)
                .join(s, s.c.task_id == t.tasks.c.id)
                .where(s.c.workflow_id == wf_id, s.c.id == step_id)
            ).first()
        return None if row is None else task_record(row)

    def get_task(self, id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t.tasks).where(t.tasks.c.id == id)).first()
        return task_record(row) if row is not None else None

    def task_status(self, id: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(  # type: ignore[no-any-return]
                sa.select(t.tasks.c.status).where(t.tasks.c.id == id)
            ).scalar_one_or_none()

    def list_tasks(
        self, status: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return [task_record(r) for r in conn.execute(_page(t.tasks, status, limit, offset))]

    # -- workflows ------------------------------------------------------------------------

    def insert_workflow(self, id: str, plan: Plan) -> None:
        now = time.time()
        rows = [
            {
                "workflow_id": id,
                "id": sid,
                "position": i,
                "status": "pending",
                "blocked": len(plan.deps[sid]),
                "result": None,
                "error": None,
                "attempts": 0,
                "max_attempts": plan.steps[sid].retries + 1,
                "started_at": None,
                "finished_at": None,
                "not_before": 0.0,
                "owner": None,
                "lease_until": None,
                "task_id": None,
            }
            for i, sid in enumerate(plan.steps)
        ]
        with self.tx() as conn:
            conn.execute(
                sa.insert(t.workflows).values(
                    id=id,
                    name=plan.name,
                    status="running",
                    definition=plan.definition(),
                    error=None,
                    created_at=now,
                    finished_at=None,
                )
            )
            conn.execute(sa.insert(t.workflow_steps), rows)
            self._emit(conn, f"workflow:{id}", "start", {"id": id, "name": plan.name})

    def definition(self, id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            return conn.execute(  # type: ignore[no-any-return]
                sa.select(t.workflows.c.definition).where(t.workflows.c.id == id)
            ).scalar_one_or_none()

    def get_workflow(self, id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            wf = conn.execute(sa.select(t.workflows).where(t.workflows.c.id == id)).first()
            if wf is None:
                return None
            steps = conn.execute(
                _steps_with_task_status()
                .where(t.workflow_steps.c.workflow_id == id)
                .order_by(t.workflow_steps.c.position)
            ).all()
        return self._workflow_record(wf, steps)

    @staticmethod
    def _workflow_record(wf: Any, steps: Any) -> dict[str, Any]:
        # Each step carries its definition as submitted (depends_on, run | task, retries…),
        # so a reader can draw the DAG and re-submit the workflow from the record alone.
        defs = {
            d.get("id"): d for d in (wf.definition or {}).get("steps", []) if isinstance(d, dict)
        }
        return {
            "id": wf.id,
            "name": wf.name,
            "status": wf.status,
            "inputs": (wf.definition or {}).get("inputs", {}),
            "steps": [step_record(s, defs.get(s.id)) for s in steps],
            "error": wf.error,
            "created_at": iso(wf.created_at),
            "finished_at": iso(wf.finished_at),
        }

    def list_workflows(
        self, status: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            wfs = conn.execute(_page(t.workflows, status, limit, offset)).all()
            ids = [w.id for w in wfs]
            steps: dict[str, list[Any]] = {i: [] for i in ids}
            if ids:
                for s in conn.execute(
                    _steps_with_task_status()
                    .where(t.workflow_steps.c.workflow_id.in_(ids))
                    .order_by(t.workflow_steps.c.position)
                ).all():
                    steps[s.workflow_id].append(s)
        return [self._workflow_record(w, steps[w.id]) for w in wfs]

    def claim_steps(self, owner: str, lease_until: float, limit: int) -> list[tuple[str, str, int]]:
        """Hand up to ``limit`` runnable steps to ``owner``: ``(workflow_id, step_id, attempt)``.

        One statement claims them all: ``UPDATE … WHERE status = 'pending' … RETURNING`` is
        atomic on both databases (on PostgreSQL the rows are also locked by the ``SELECT …
        FOR UPDATE SKIP LOCKED`` that found them, so servers claiming at once skip each
        other's rows instead of waiting)."""
        if limit <= 0:
            return []
        now = time.time()
        w = t.workflows
        with self.tx() as conn:
            claimed = self._claim_in(conn, limit, owner, lease_until, now)
        # The events in a transaction of their own, under the workflow's lock (which numbers
        # its stream): a claim that held step rows while waiting for a workflow row could
        # deadlock with a cancel, which holds the workflow row and updates step rows.
        for wf_id, events in self._claim_events(claimed).items():
            with self.tx() as conn:
                self._lock_row(conn, w, wf_id)
                self._emit_many(conn, f"workflow:{wf_id}", events)
        return claimed

    def _claim_in(
        self, conn: Connection, limit: int, owner: str, lease_until: float, now: float
    ) -> list[tuple[str, str, int]]:
        rows = conn.execute(_Hot.claimable, {"now": now, "lim": limit}).all()
        if not rows:
            return []
        order = {(r.workflow_id, r.id): i for i, r in enumerate(rows)}
        got = conn.execute(
            _Hot.claim, {"keys": list(order), "owner": owner, "lease": lease_until, "now": now}
        ).all()
        return sorted(
            ((r.workflow_id, r.id, r.attempts) for r in got), key=lambda c: order[(c[0], c[1])]
        )

    @staticmethod
    def _claim_events(
        claimed: list[tuple[str, str, int]],
    ) -> dict[str, list[tuple[str, dict[str, Any]]]]:
        by_wf: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for wf_id, sid, attempt in claimed:
            by_wf.setdefault(wf_id, []).append(
                ("step", {"id": sid, "status": "running", "attempts": attempt})
            )
        return by_wf

    def step_round(
        self, outcomes: list[StepOutcome], owner: str, lease_until: float, limit: int
    ) -> tuple[set[tuple[str, str]], dict[str, str], list[tuple[str, str, int]]]:
        """One scheduling round: record ``outcomes`` (:meth:`finish_steps`), then claim up to
        ``limit`` runnable steps (:meth:`claim_steps`). On SQLite, one writer at a time, both
        and the claims' events are one transaction; PostgreSQL keeps claims apart from
        transactions that lock workflow rows (see :meth:`claim_steps`)."""
        if self.postgres:
            succeeded, ended = self.finish_steps(outcomes, owner) if outcomes else (set(), {})
            return succeeded, ended, self.claim_steps(owner, lease_until, limit)
        now = time.time()
        with self.tx() as conn:
            succeeded, ended = self._finish_in(conn, outcomes, owner, now)
            claimed: list[tuple[str, str, int]] = []
            if limit > 0:
                claimed = self._claim_in(conn, limit, owner, lease_until, now)
            for wf_id, events in self._claim_events(claimed).items():
                self._emit_many(conn, f"workflow:{wf_id}", events)
        return succeeded, ended, claimed

    def step_scope(self, wf_id: str, ids: list[str]) -> dict[str, Any]:
        """``{id: {"result": …}}`` for the given finished steps."""
        s = t.workflow_steps
        out: dict[str, Any] = {}
        with self.engine.connect() as conn:
            for chunk_start in range(0, len(ids), 500):
                chunk = ids[chunk_start : chunk_start + 500]
                for r in conn.execute(
                    sa.select(s.c.id, s.c.result).where(
                        s.c.workflow_id == wf_id, s.c.id.in_(chunk), s.c.status == "succeeded"
                    )
                ).all():
                    out[r.id] = {"result": r.result}
        return out

    def set_step_task(self, wf_id: str, step_id: str, task_id: str) -> None:
        s = t.workflow_steps
        with self.tx() as conn:
            conn.execute(
                sa.update(s)
                .where(s.c.workflow_id == wf_id, s.c.id == step_id)
                .values(task_id=task_id)
            )

    def finish_step(
        self,
        plan: Plan,
        wf_id: str,
        step_id: str,
        owner: str | None,
        *,
        ok: bool,
        result: Any = None,
        error: dict[str, Any] | None = None,
        backoff_s: float = 1.0,
    ) -> str | None:
        """Record one step's outcome (see :meth:`finish_steps`); returns the workflow's new
        final status when this ended it."""
        outcome = StepOutcome(plan, wf_id, step_id, ok, result, error, backoff_s)
        _recorded, ended = self.finish_steps([outcome], owner)
        return ended.get(wf_id)

    def finish_steps(
        self, outcomes: list[StepOutcome], owner: str | None
    ) -> tuple[set[tuple[str, str]], dict[str, str]]:
        """Record the outcomes of several steps in one transaction: a failure with attempts
        left goes back to pending after a backoff; a failure for good skips the step's
        pending descendants. A step that is no longer ``owner``'s (cancelled, or taken over
        after its lease ran out) is left alone. Returns the steps recorded as succeeded and
        the workflows that these outcomes ended, with their final status."""
        with self.tx() as conn:
            return self._finish_in(conn, outcomes, owner, time.time())

    def _finish_in(
        self, conn: Connection, outcomes: list[StepOutcome], owner: str | None, now: float
    ) -> tuple[set[tuple[str, str]], dict[str, str]]:
        s = t.workflow_steps
        by_wf: dict[str, list[StepOutcome]] = {}
        for o in outcomes:
            by_wf.setdefault(o.workflow_id, []).append(o)
        succeeded: set[tuple[str, str]] = set()
        ended: dict[str, str] = {}
        # Workflows in a fixed order: two servers finishing steps of the same two
        # workflows lock them in the same order and cannot deadlock.
        for wf_id in sorted(by_wf):
            items = by_wf[wf_id]
            wf = conn.execute(_Hot.lock_workflow, {"id": wf_id}).first()
            if wf is None:
                continue
            ids = list(dict.fromkeys(o.step_id for o in items))
            rows: dict[str, Any] = {}
            for chunk_start in range(0, len(ids), 500):
                chunk = ids[chunk_start : chunk_start + 500]
                for r in conn.execute(_Hot.step_rows, {"wf": wf_id, "ids": chunk}).all():
                    rows[r.id] = r
            events: list[tuple[str, dict[str, Any]]] = []
            done_rows: list[dict[str, Any]] = []
            unblock: dict[str, int] = {}
            failed: list[tuple[Plan, str]] = []
            seen: set[str] = set()
            for o in items:
                row = rows.get(o.step_id)
                if o.step_id in seen or row is None or row.status != "running":
                    continue
                if owner is not None and row.owner != owner:
                    continue
                seen.add(o.step_id)
                sid = o.step_id
                if o.ok:
                    done_rows.append(
                        {"k_wf": wf_id, "k_id": sid, "k_result": o.result, "k_now": now}
                    )
                    events.append(
                        ("step", {"id": sid, "status": "succeeded", "attempts": row.attempts, "result": o.result})
                    )  # fmt: skip
                    for child in o.plan.dependents.get(sid, []):
                        unblock[child] = unblock.get(child, 0) + 1
                    succeeded.add((wf_id, sid))
                elif row.attempts < row.max_attempts and wf.status == "running":
                    delay = min(60.0, o.backoff_s * (2 ** (row.attempts - 1)))
                    conn.execute(
                        sa.update(s)
                        .where(s.c.workflow_id == wf_id, s.c.id == sid)
                        .values(
                            status="pending",
                            error=o.error,
                            not_before=now + delay,
                            owner=None,
                            lease_until=None,
                        )
                    )
                    events.append(
                        ("step", {"id": sid, "status": "pending", "attempts": row.attempts, "error": o.error, "retry_in_s": delay})
                    )  # fmt: skip
                else:
                    conn.execute(
                        sa.update(s)
                        .where(s.c.workflow_id == wf_id, s.c.id == sid)
                        .values(status="failed", error=o.error, finished_at=now, lease_until=None)
                    )  # fmt: skip
                    events.append(
                        ("step", {"id": sid, "status": "failed", "attempts": row.attempts, "error": o.error})
                    )  # fmt: skip
                    failed.append((o.plan, sid))
            if not seen:
                continue
            if done_rows:
                conn.execute(_Hot.succeed, done_rows)
            if unblock:
                conn.execute(
                    _Hot.unblock,
                    [{"k_wf": wf_id, "k_id": child, "k_n": n} for child, n in unblock.items()],
                )
            self._emit_many(conn, f"workflow:{wf_id}", events)
            for plan, sid in failed:
                self._skip(conn, wf_id, plan.descendants(sid), f"step {sid!r} failed")
            status = self._maybe_finish(conn, wf_id, now)
            if status is not None:
                ended[wf_id] = status
        return succeeded, ended

    def _skip(self, conn: Connection, wf_id: str, ids: list[str], why: str) -> None:
        if not ids:
            return
        s = t.workflow_steps
        pending = conn.execute(
            sa.select(s.c.id).where(
                s.c.workflow_id == wf_id, s.c.id.in_(ids), s.c.status == "pending"
            )
        ).all()
        names = [r.id for r in pending]
        if not names:
            return
        error = {"kind": "SkippedError", "message": why}
        conn.execute(
            sa.update(s)
            .where(s.c.workflow_id == wf_id, s.c.id.in_(names), s.c.status == "pending")
            .values(status="skipped", error=error, finished_at=time.time())
        )
        for sid in names:
            self._emit(
                conn, f"workflow:{wf_id}", "step", {"id": sid, "status": "skipped", "error": error}
            )

    def _maybe_finish(self, conn: Connection, wf_id: str, now: float) -> str | None:
        s, w = t.workflow_steps, t.workflows
        # Usually some step is still to run: found at once, without counting them all.
        active = conn.execute(_Hot.any_active, {"wf": wf_id}).first()
        if active is not None:
            return None
        counts: dict[str, int] = dict(
            conn.execute(
                sa.select(s.c.status, sa.func.count())
                .where(s.c.workflow_id == wf_id)
                .group_by(s.c.status)
            ).all()
        )
        if any(status not in STEP_DONE for status in counts):
            return None
        status = "succeeded" if set(counts) <= {"succeeded"} else "failed"
        error = None
        if status == "failed":
            failed = conn.execute(
                sa.select(s.c.id)
                .where(s.c.workflow_id == wf_id, s.c.status == "failed")
                .order_by(s.c.position)
            ).all()
            error = {
                "kind": "StepError",
                "message": "failed steps: " + ", ".join(r.id for r in failed),
            }
        conn.execute(
            sa.update(w).where(w.c.id == wf_id).values(status=status, error=error, finished_at=now)
        )
        stream = f"workflow:{wf_id}"
        if status == "succeeded":
            wf = conn.execute(sa.select(w.c.created_at).where(w.c.id == wf_id)).one()
            self._emit(
                conn, stream, "complete",
                {"id": wf_id, "status": status, "elapsed_ms": int((now - wf.created_at) * 1000)},
            )  # fmt: skip
        else:
            assert error is not None
            self._emit(conn, stream, "error", {"id": wf_id, "status": status, **error})
        return status

    def cancel_workflow(self, wf_id: str) -> tuple[str | None, list[str]]:
        """``(previous status, steps that were running)``; nothing changes unless running."""
        now = time.time()
        s, w = t.workflow_steps, t.workflows
        with self.tx() as conn:
            wf = self._lock_row(conn, w, wf_id)
            if wf is None:
                return None, []
            if wf.status not in ("pending", "running"):
                return wf.status, []
            running = [
                r.id
                for r in conn.execute(
                    sa.select(s.c.id).where(s.c.workflow_id == wf_id, s.c.status == "running")
                ).all()
            ]
            error = {"kind": "CancelledError", "message": "the workflow was cancelled"}
            conn.execute(
                sa.update(s)
                .where(s.c.workflow_id == wf_id, s.c.status == "running")
                .values(status="cancelled", error=error, finished_at=now, lease_until=None)
            )
            pending = [
                r.id
                for r in conn.execute(
                    sa.select(s.c.id).where(s.c.workflow_id == wf_id, s.c.status == "pending")
                ).all()
            ]
            conn.execute(
                sa.update(s)
                .where(s.c.workflow_id == wf_id, s.c.status == "pending")
                .values(
                    status="skipped",
                    error={
                        "kind": "CancelledError",
                        "message": "the workflow was cancelled before this step ran",
                    },
                    finished_at=now,
                )
            )
            conn.execute(
                sa.update(w)
                .where(w.c.id == wf_id)
                .values(status="cancelled", error=error, finished_at=now)
            )
            stream = f"workflow:{wf_id}"
            for sid in running:
                self._emit(conn, stream, "step", {"id": sid, "status": "cancelled"})
            for sid in pending:
                self._emit(conn, stream, "step", {"id": sid, "status": "skipped"})
            self._emit(conn, stream, "error", {"id": wf_id, "status": "cancelled", **error})
            return wf.status, running

    def step_statuses(self, owner: str) -> dict[tuple[str, str], str]:
        s = t.workflow_steps
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(s.c.workflow_id, s.c.id, s.c.status, s.c.owner).where(s.c.owner == owner)
            ).all()
        return {(r.workflow_id, r.id): r.status for r in rows}

    # -- leases ---------------------------------------------------------------------------

    def renew(self, owner: str, lease_until: float) -> None:
        with self.tx() as conn:
            conn.execute(
                sa.update(t.tasks)
                .where(t.tasks.c.owner == owner, t.tasks.c.status.in_(TASK_HELD))
                .values(lease_until=lease_until)
            )
            conn.execute(
                sa.update(t.workflow_steps)
                .where(t.workflow_steps.c.owner == owner, t.workflow_steps.c.status == "running")
                .values(lease_until=lease_until)
            )

    def reclaim(
        self,
        plans: dict[str, Plan],
        load_plan: Any,
        owner: str,
        lease_until: float,
        *,
        everything: bool = False,
    ) -> tuple[list[str], list[tuple[str, str]]]:
        """Take over work whose lease ran out (``everything``: all pending and running work,
        for a single-server database at start). Tasks are claimed for ``owner`` to resume
        from their checkpoints (those the ``agent`` builtin ran inside a sandbox run cannot
        be, and fail as interrupted). A running step whose agent task lives on (or already
        succeeded) goes back to pending without spending an attempt: its next run waits on
        that task instead of starting another. Returns the workflows that changed and the
        tasks claimed, with their status (``pending``: not started yet)."""
        now = time.time()
        tk, s = t.tasks, t.workflow_steps
        expired = (
            sa.true() if everything else sa.or_(tk.c.lease_until.is_(None), tk.c.lease_until < now)
        )
        with self.engine.connect() as conn:
            found = conn.execute(
                sa.select(tk.c.id, tk.c.origin).where(tk.c.status.in_(TASK_HELD), expired)
            ).all()
            step_expired = (
                sa.true()
                if everything
                else sa.or_(s.c.lease_until.is_(None), s.c.lease_until < now)
            )
            steps = conn.execute(
                sa.select(s.c.workflow_id, s.c.id, s.c.owner, tk.c.status.label("task_status"))
                .select_from(s.outerjoin(tk, tk.c.id == s.c.task_id))
                .where(s.c.status == "running", step_expired)
            ).all()
        claimed: list[tuple[str, str]] = []
        for r in found:
            if r.origin == "builtin":
                self.finish_task(r.id, "failed", error=dict(INTERRUPTED))
                continue
            status = self.claim_task(r.id, owner, lease_until, everything=everything)
            if status is not None:
                claimed.append((r.id, status))
        changed: list[str] = []
        for st in steps:
            if st.task_status in ("pending", "running", "waiting", "succeeded"):
                if self.release_step(st.workflow_id, st.id, st.owner, spend=False):
                    changed.append(st.workflow_id)
                continue
            plan = plans.get(st.workflow_id) or load_plan(st.workflow_id)
            if plan is None:
                continue
            self.finish_step(
                plan, st.workflow_id, st.id, st.owner, ok=False, error=dict(INTERRUPTED),
                backoff_s=0.0,
            )  # fmt: skip
            changed.append(st.workflow_id)
        return changed, claimed

    def release_step(self, wf_id: str, sid: str, owner: str | None, *, spend: bool) -> bool:
        """A running step goes back to pending (its attempt given back unless ``spend``)."""
        s = t.workflow_steps
        with self.tx() as conn:
            self._lock_row(conn, t.workflows, wf_id)
            cond = [s.c.workflow_id == wf_id, s.c.id == sid, s.c.status == "running"]
            if owner is not None:
                cond.append(s.c.owner == owner)
            values: dict[str, Any] = {
                "status": "pending", "owner": None, "lease_until": None, "started_at": None,
            }  # fmt: skip
            if not spend:
                values["attempts"] = s.c.attempts - 1
            done = conn.execute(sa.update(s).where(*cond).values(**values)).rowcount > 0
            if done:
                self._emit(conn, f"workflow:{wf_id}", "step", {"id": sid, "status": "pending"})
        return done

    # -- metrics --------------------------------------------------------------------------

    def active_counts(self) -> dict[str, int]:
        """Tasks pending or running (``active_tasks``) and waiting for a person
        (``waiting_tasks``): read every 2 s for the status history, so a range of the status
        index, where :meth:`metrics` scans every task."""
        tk = t.tasks
        with self.engine.connect() as conn:
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

    def metrics(self) -> dict[str, int]:
        tk, wf = t.tasks, t.workflows
        with self.engine.connect() as conn:
            by_status: dict[str, int] = dict(
                conn.execute(sa.select(tk.c.status, sa.func.count()).group_by(tk.c.status)).all()
            )
            avg = conn.execute(
                sa.select(sa.func.avg(tk.c.finished_at - tk.c.started_at)).where(
                    tk.c.status == "succeeded", tk.c.started_at.is_not(None)
                )
            ).scalar_one()
            wf_status: dict[str, int] = dict(
                conn.execute(sa.select(wf.c.status, sa.func.count()).group_by(wf.c.status)).all()
            )
            agents = conn.execute(sa.select(sa.func.count()).select_from(t.agents)).scalar_one()
        return {
            "registered_agents": int(agents),
            "active_tasks": int(by_status.get("pending", 0) + by_status.get("running", 0)),
            "waiting_tasks": int(by_status.get("waiting", 0)),
            "completed_tasks": int(by_status.get("succeeded", 0)),
            "avg_task_duration_ms": round(float(avg) * 1000) if avg is not None else 0,
            "failed_tasks": int(by_status.get("failed", 0)),
            "cancelled_tasks": int(by_status.get("cancelled", 0)),
            "total_workflows": int(sum(wf_status.values())),
            "running_workflows": int(wf_status.get("running", 0) + wf_status.get("pending", 0)),
        }
