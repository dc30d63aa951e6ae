"""The step store: the scheduling rounds that hand out workflow steps and record what their
runs came to.

Servers claim runnable steps with ``SELECT … FOR UPDATE SKIP LOCKED`` so that no step is
handed out twice on PostgreSQL; claims lock only step rows (never the workflow row) and the
transitions of one workflow lock its row first, so the two kinds of transaction cannot
deadlock. A round records the outcomes of the steps that finished and claims new ones: on
SQLite (one writer) in one transaction. A step's outcome may retry it (after a backoff),
fail it for good (skipping its pending descendants) or end its workflow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from conch.orchestration import tables as t
from conch.orchestration.spec import Plan
from conch.orchestration.store.base import Database

STEP_DONE = ("succeeded", "failed", "skipped", "cancelled")
Claimed = list[tuple[str, str, int]]  # (workflow id, step id, attempt)
Events = list[tuple[str, dict[str, Any]]]


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


class _StepSQL:
    """The statements of a scheduling round, built once (see :class:`.base._EventSQL`); its
    parameters come in as bind values."""

    s, w = t.workflow_steps, t.workflows
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
            # An attempt given back by a server that stopped keeps its start.
            started_at=sa.func.coalesce(s.c.started_at, sa.bindparam("now", type_=sa.Float)),
            finished_at=None,
        )
        .returning(s.c.workflow_id, s.c.id, s.c.attempts)
    )


@dataclass
class _Finishing:
    """What the outcomes of one workflow's steps come to in a round, written together."""

    events: Events = field(default_factory=list)
    done_rows: list[dict[str, Any]] = field(default_factory=list)
    unblock: dict[str, int] = field(default_factory=dict)
    failed: list[tuple[Plan, str]] = field(default_factory=list)


class StepStore:
    """Workflow steps handed to servers and their outcomes recorded, a round at a time."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def claim_steps(self, owner: str, lease_until: float, limit: int) -> Claimed:
        """Hand up to ``limit`` runnable steps to ``owner``: ``(workflow_id, step_id, attempt)``.

        One statement claims them all: ``UPDATE … WHERE status = 'pending' … RETURNING`` is
        atomic on both databases (on PostgreSQL the rows are also locked by the ``SELECT …
        FOR UPDATE SKIP LOCKED`` that found them, so servers claiming at once skip each
        other's rows instead of waiting)."""
        if limit <= 0:
            return []
        now = time.time()
        with self.db.tx() as conn:
            claimed = self._claim_in(conn, limit, owner, lease_until, now)
        # The events in a transaction of their own, under the workflow's lock (which numbers
        # its stream): a claim that held step rows while waiting for a workflow row could
        # deadlock with a cancel, which holds the workflow row and updates step rows.
        for wf_id, events in _claim_events(claimed).items():
            with self.db.tx() as conn:
                self.db.lock_row(conn, t.workflows, wf_id)
                self.db.emit_many(conn, f"workflow:{wf_id}", events)
        return claimed

    def _claim_in(
        self, conn: Connection, limit: int, owner: str, lease_until: float, now: float
    ) -> Claimed:
        rows = conn.execute(_StepSQL.claimable, {"now": now, "lim": limit}).all()
        if not rows:
            return []
        order = {(r.workflow_id, r.id): i for i, r in enumerate(rows)}
        got = conn.execute(
            _StepSQL.claim, {"keys": list(order), "owner": owner, "lease": lease_until, "now": now}
        ).all()
        return sorted(
            ((r.workflow_id, r.id, r.attempts) for r in got), key=lambda c: order[(c[0], c[1])]
        )

    def step_round(
        self, outcomes: list[StepOutcome], owner: str, lease_until: float, limit: int
    ) -> tuple[set[tuple[str, str]], dict[str, str], Claimed]:
        """One scheduling round: record ``outcomes`` (:meth:`finish_steps`), then claim up to
        ``limit`` runnable steps (:meth:`claim_steps`). On SQLite, one writer at a time, both
        and the claims' events are one transaction; PostgreSQL keeps claims apart from
        transactions that lock workflow rows (see :meth:`claim_steps`)."""
        if self.db.postgres:
            succeeded, ended = self.finish_steps(outcomes, owner) if outcomes else (set(), {})
            return succeeded, ended, self.claim_steps(owner, lease_until, limit)
        now = time.time()
        with self.db.tx() as conn:
            succeeded, ended = self._finish_in(conn, outcomes, owner, now)
            claimed: Claimed = []
            if limit > 0:
                claimed = self._claim_in(conn, limit, owner, lease_until, now)
            for wf_id, events in _claim_events(claimed).items():
                self.db.emit_many(conn, f"workflow:{wf_id}", events)
        return succeeded, ended, claimed

    # -- outcomes -------------------------------------------------------------------------

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
        with self.db.tx() as conn:
            return self._finish_in(conn, outcomes, owner, time.time())

    def _finish_in(
        self, conn: Connection, outcomes: list[StepOutcome], owner: str | None, now: float
    ) -> tuple[set[tuple[str, str]], dict[str, str]]:
        by_wf: dict[str, list[StepOutcome]] = {}
        for o in outcomes:
            by_wf.setdefault(o.workflow_id, []).append(o)
        succeeded: set[tuple[str, str]] = set()
        ended: dict[str, str] = {}
        # Workflows in a fixed order: two servers finishing steps of the same two
        # workflows lock them in the same order and cannot deadlock.
        for wf_id in sorted(by_wf):
            status = self._finish_workflow_steps(conn, wf_id, by_wf[wf_id], owner, now, succeeded)
            if status is not None:
                ended[wf_id] = status
        return succeeded, ended

    def _finish_workflow_steps(
        self,
        conn: Connection,
        wf_id: str,
        items: list[StepOutcome],
        owner: str | None,
        now: float,
        succeeded: set[tuple[str, str]],
    ) -> str | None:
        """Record the outcomes of one workflow's steps (adding those that succeeded to
        ``succeeded``); the workflow's final status when they ended it."""
        wf = conn.execute(_StepSQL.lock_workflow, {"id": wf_id}).first()
        if wf is None:
            return None
        ids = list(dict.fromkeys(o.step_id for o in items))
        rows: dict[str, Any] = {}
        for chunk_start in range(0, len(ids), 500):
            chunk = ids[chunk_start : chunk_start + 500]
            for r in conn.execute(_StepSQL.step_rows, {"wf": wf_id, "ids": chunk}).all():
                rows[r.id] = r
        out = _Finishing()
        seen: set[str] = set()
        for o in items:
            row = rows.get(o.step_id)
            if o.step_id in seen or row is None or row.status != "running":
                continue
            if owner is not None and row.owner != owner:
                continue
            seen.add(o.step_id)
            if o.ok:
                succeeded.add((wf_id, o.step_id))
            self._outcome(conn, out, o, row, wf.status, now)
        if not seen:
            return None
        if out.done_rows:
            conn.execute(_StepSQL.succeed, out.done_rows)
        if out.unblock:
            conn.execute(
                _StepSQL.unblock,
                [{"k_wf": wf_id, "k_id": child, "k_n": n} for child, n in out.unblock.items()],
            )
        self.db.emit_many(conn, f"workflow:{wf_id}", out.events)
        for plan, sid in out.failed:
            self._skip(conn, wf_id, plan.descendants(sid), f"step {sid!r} failed")
        return self._maybe_finish(conn, wf_id, now)

    @staticmethod
    def _outcome(
        conn: Connection, out: _Finishing, o: StepOutcome, row: Any, wf_status: str, now: float
    ) -> None:
        """One running step's outcome: succeeded (written with the round's others), back to
        pending after a backoff (attempts left), or failed for good."""
        s, wf_id, sid = t.workflow_steps, o.workflow_id, o.step_id
        if o.ok:
            out.done_rows.append({"k_wf": wf_id, "k_id": sid, "k_result": o.result, "k_now": now})
            out.events.append(
                ("step", {"id": sid, "status": "succeeded", "attempts": row.attempts, "result": o.result})
            )  # fmt: skip
            for child in o.plan.dependents.get(sid, []):
                out.unblock[child] = out.unblock.get(child, 0) + 1
        elif row.attempts < row.max_attempts and wf_status == "running":
            delay = min(60.0, o.backoff_s * (2 ** (row.attempts - 1)))
            conn.execute(
                sa.update(s)
                .where(s.c.workflow_id == wf_id, s.c.id == sid)
                .values(
                    status="pending", error=o.error, not_before=now + delay, owner=None,
                    lease_until=None,
                )
            )  # fmt: skip
            out.events.append(
                ("step", {"id": sid, "status": "pending", "attempts": row.attempts, "error": o.error, "retry_in_s": delay})
            )  # fmt: skip
        else:
            conn.execute(
                sa.update(s)
                .where(s.c.workflow_id == wf_id, s.c.id == sid)
                .values(status="failed", error=o.error, finished_at=now, lease_until=None)
            )  # fmt: skip
            out.events.append(
                ("step", {"id": sid, "status": "failed", "attempts": row.attempts, "error": o.error})
            )  # fmt: skip
            out.failed.append((o.plan, sid))

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
            self.db.emit(
                conn, f"workflow:{wf_id}", "step", {"id": sid, "status": "skipped", "error": error}
            )

    def _maybe_finish(self, conn: Connection, wf_id: str, now: float) -> str | None:
        s, w = t.workflow_steps, t.workflows
        # Usually some step is still to run: found at once, without counting them all.
        active = conn.execute(_StepSQL.any_active, {"wf": wf_id}).first()
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
            self.db.emit(
                conn, stream, "complete",
                {"id": wf_id, "status": status, "elapsed_ms": int((now - wf.created_at) * 1000)},
            )  # fmt: skip
        else:
            assert error is not None
            self.db.emit(conn, stream, "error", {"id": wf_id, "status": status, **error})
        return status


def _claim_events(claimed: Claimed) -> dict[str, Events]:
    by_wf: dict[str, Events] = {}
    for wf_id, sid, attempt in claimed:
        by_wf.setdefault(wf_id, []).append(
            ("step", {"id": sid, "status": "running", "attempts": attempt})
        )
    return by_wf
