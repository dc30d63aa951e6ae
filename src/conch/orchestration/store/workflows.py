"""The workflow store: workflows and their steps as submitted, read back and cancelled, and
the agent task a step runs.

Their scheduling (claiming runnable steps, recording outcomes) is the step store's
(:mod:`.steps`).
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from conch.orchestration import tables as t
from conch.orchestration.spec import Plan
from conch.orchestration.store.base import Database, page
from conch.orchestration.store.records import steps_with_task_status, task_record, workflow_record


class WorkflowStore:
    """Workflows and their steps: created, read, cancelled."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def insert_workflow(
        self, id: str, plan: Plan, tenant: str | None = None, key_id: str | None = None
    ) -> None:
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
        with self.db.tx() as conn:
            conn.execute(
                sa.insert(t.workflows).values(
                    id=id,
                    name=plan.name,
                    status="running",
                    definition=plan.definition(),
                    error=None,
                    created_at=now,
                    finished_at=None,
                    tenant=tenant,
                    key_id=key_id,
                )
            )
            conn.execute(sa.insert(t.workflow_steps), rows)
            self.db.emit(conn, f"workflow:{id}", "start", {"id": id, "name": plan.name})

    def definition(self, id: str) -> dict[str, Any] | None:
        with self.db.read() as conn:
            return conn.execute(  # type: ignore[no-any-return]
                sa.select(t.workflows.c.definition).where(t.workflows.c.id == id)
            ).scalar_one_or_none()

    def owner(self, id: str) -> tuple[str | None, str | None] | None:
        """``(tenant, key_id)`` of a workflow (what its steps' tasks are made as)."""
        w = t.workflows
        with self.db.read() as conn:
            row = conn.execute(sa.select(w.c.tenant, w.c.key_id).where(w.c.id == id)).first()
        return None if row is None else (row.tenant, row.key_id)

    def get_workflow(self, id: str, tenant: str | None = None) -> dict[str, Any] | None:
        """The workflow, if ``tenant`` (None: any) may see it."""
        with self.db.read() as conn:
            wf = conn.execute(sa.select(t.workflows).where(t.workflows.c.id == id)).first()
            if wf is None or (tenant is not None and wf.tenant != tenant):
                return None
            steps = conn.execute(
                steps_with_task_status()
                .where(t.workflow_steps.c.workflow_id == id)
                .order_by(t.workflow_steps.c.position)
            ).all()
        return workflow_record(wf, steps)

    def list_workflows(
        self, status: str | None = None, limit: int = 100, offset: int = 0,
        tenant: str | None = None,
    ) -> list[dict[str, Any]]:
        with self.db.read() as conn:
            wfs = conn.execute(page(t.workflows, status, limit, offset, tenant)).all()
            ids = [w.id for w in wfs]
            steps: dict[str, list[Any]] = {i: [] for i in ids}
            if ids:
                for s in conn.execute(
                    steps_with_task_status()
                    .where(t.workflow_steps.c.workflow_id.in_(ids))
                    .order_by(t.workflow_steps.c.position)
                ).all():
                    steps[s.workflow_id].append(s)
        return [workflow_record(w, steps[w.id]) for w in wfs]
    def step_scope(self, wf_id: str, ids: list[str]) -> dict[str, Any]:
        """``{id: {"result": …}}`` for the given finished steps."""
        s = t.workflow_steps
        out: dict[str, Any] = {}
        with self.db.read() as conn:
            for chunk_start in range(0, len(ids), 500):
                chunk = ids[chunk_start : chunk_start + 500]
                for r in conn.execute(
                    sa.select(s.c.id, s.c.result).where(
                        s.c.workflow_id == wf_id, s.c.id.in_(chunk), s.c.status == "succeeded"
                    )
                ).all():
                    out[r.id] = {"result": r.result}
        return out

    # -- a step's agent task --------------------------------------------------------------

    def set_step_task(self, wf_id: str, step_id: str, task_id: str) -> None:
        s = t.workflow_steps
        with self.db.tx() as conn:
            conn.execute(
                sa.update(s)
                .where(s.c.workflow_id == wf_id, s.c.id == step_id)
                .values(task_id=task_id)
            )

    def step_task(self, wf_id: str, step_id: str) -> dict[str, Any] | None:
        """The record of the task a workflow step started, if it did."""
        s = t.workflow_steps
        with self.db.read() as conn:
            row = conn.execute(
                sa.select(t.tasks)
                .join(s, s.c.task_id == t.tasks.c.id)
                .where(s.c.workflow_id == wf_id, s.c.id == step_id)
            ).first()
        return None if row is None else task_record(row)

    def task_step_event(self, task_id: str, status: str) -> str | None:
        """Tell the workflow whose step runs this task that the step is now ``status``
        (``waiting`` or ``running``); returns the workflow's id."""
        s = t.workflow_steps
        with self.db.tx() as conn:
            step = conn.execute(
                sa.select(s.c.workflow_id, s.c.id).where(
                    s.c.task_id == task_id, s.c.status == "running"
                )
            ).first()
            if step is None:
                return None
            self.db.lock_row(conn, t.workflows, step.workflow_id)
            self.db.emit(
                conn,
                f"workflow:{step.workflow_id}",
                "step",
                {"id": step.id, "status": status, "task_id": task_id},
            )
        return str(step.workflow_id)

    # -- cancelling -----------------------------------------------------------------------

    def cancel_workflow(self, wf_id: str) -> tuple[str | None, list[str]]:
        """``(previous status, steps that were running)``; nothing changes unless running."""
        now = time.time()
        w = t.workflows
        with self.db.tx() as conn:
            wf = self.db.lock_row(conn, w, wf_id)
            if wf is None:
                return None, []
            if wf.status not in ("pending", "running"):
                return wf.status, []
            error = {"kind": "CancelledError", "message": "the workflow was cancelled"}
            running = self._end_steps(conn, wf_id, "running", "cancelled", error, now)
            pending = self._end_steps(
                conn, wf_id, "pending", "skipped",
                {"kind": "CancelledError", "message": "the workflow was cancelled before this step ran"},
                now,
            )  # fmt: skip
            conn.execute(
                sa.update(w)
                .where(w.c.id == wf_id)
                .values(status="cancelled", error=error, finished_at=now)
            )
            stream = f"workflow:{wf_id}"
            for sid in running:
                self.db.emit(conn, stream, "step", {"id": sid, "status": "cancelled"})
            for sid in pending:
                self.db.emit(conn, stream, "step", {"id": sid, "status": "skipped"})
            self.db.emit(conn, stream, "error", {"id": wf_id, "status": "cancelled", **error})
            return wf.status, running

    @staticmethod
    def _end_steps(
        conn: Connection, wf_id: str, status: str, to: str, error: dict[str, Any], now: float
    ) -> list[str]:
        """Move a cancelled workflow's steps in ``status`` to ``to``; their ids."""
        s = t.workflow_steps
        ids = [
            r.id
            for r in conn.execute(
                sa.select(s.c.id).where(s.c.workflow_id == wf_id, s.c.status == status)
            ).all()
        ]
        values: dict[str, Any] = {"status": to, "error": error, "finished_at": now}
        if status == "running":
            values["lease_until"] = None
        conn.execute(
            sa.update(s).where(s.c.workflow_id == wf_id, s.c.status == status).values(**values)
        )
        return ids

    def step_statuses(self, owner: str) -> dict[tuple[str, str], str]:
        s = t.workflow_steps
        with self.db.read() as conn:
            rows = conn.execute(
                sa.select(s.c.workflow_id, s.c.id, s.c.status, s.c.owner).where(s.c.owner == owner)
            ).all()
        return {(r.workflow_id, r.id): r.status for r in rows}
