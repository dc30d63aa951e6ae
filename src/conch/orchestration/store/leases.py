"""The lease store: which server holds which task and step, and taking over the dead's work.

A server that runs a task or a step holds it until ``lease_until`` and renews that while it
works. Work whose lease ran out belongs to a server that died: another server (or this one
restarted) claims its tasks and resumes them from their checkpoints; steps go back to
pending if they have attempts left, so workflows resume. A task whose checkpoint cannot be
read is failed with reason ``interrupted``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from conch.orchestration import tables as t
from conch.orchestration.spec import Plan
from conch.orchestration.store.base import Database
from conch.orchestration.store.steps import StepStore
from conch.orchestration.store.tasks import INTERRUPTED, TASK_HELD, TaskStore


class LeaseStore:
    """Leases of tasks and steps: renewed, given back, taken over."""

    def __init__(self, db: Database, tasks: TaskStore, steps: StepStore) -> None:
        self.db = db
        self.tasks = tasks
        self.steps = steps

    def renew(self, owner: str, lease_until: float) -> None:
        with self.db.tx() as conn:
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
        load_plan: Callable[[str], Plan | None],
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
        step_expired = (
            sa.true() if everything else sa.or_(s.c.lease_until.is_(None), s.c.lease_until < now)
        )
        with self.db.read() as conn:
            found = conn.execute(
                sa.select(tk.c.id, tk.c.origin).where(tk.c.status.in_(TASK_HELD), expired)
            ).all()
            steps = conn.execute(
                sa.select(s.c.workflow_id, s.c.id, s.c.owner, tk.c.status.label("task_status"))
                .select_from(s.outerjoin(tk, tk.c.id == s.c.task_id))
                .where(s.c.status == "running", step_expired)
            ).all()
        claimed: list[tuple[str, str]] = []
        for r in found:
            if r.origin == "builtin":
                self.tasks.finish_task(r.id, "failed", error=dict(INTERRUPTED))
                continue
            status = self.claim_task(r.id, owner, lease_until, everything=everything)
            if status is not None:
                claimed.append((r.id, status))
        return self._reclaim_steps(steps, plans, load_plan), claimed

    def _reclaim_steps(
        self, steps: Any, plans: dict[str, Plan], load_plan: Callable[[str], Plan | None]
    ) -> list[str]:
        """Running steps whose lease ran out: back to pending, or failed as interrupted (an
        attempt spent); returns the workflows that changed."""
        changed: list[str] = []
        for st in steps:
            if st.task_status in ("pending", "running", "waiting", "succeeded"):
                if self.release_step(st.workflow_id, st.id, st.owner, spend=False):
                    changed.append(st.workflow_id)
                continue
            plan = plans.get(st.workflow_id) or load_plan(st.workflow_id)
            if plan is None:
                continue
            self.steps.finish_step(
                plan, st.workflow_id, st.id, st.owner, ok=False, error=dict(INTERRUPTED),
                backoff_s=0.0,
            )  # fmt: skip
            changed.append(st.workflow_id)
        return changed

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
        with self.db.tx() as conn:
            got = conn.execute(
                sa.update(tk)
                .where(*cond)
                .values(owner=owner, lease_until=lease_until)
                .returning(tk.c.status)
            ).first()
            if got is not None and got.status == "running":
                self.db.emit(
                    conn, f"task:{id}", "resume",
                    {"id": id, "status": "running", "reason": "recovered"},
                )  # fmt: skip
        return None if got is None else str(got.status)

    def release_task(self, id: str, owner: str) -> None:
        """Give a task back (this server stops): the next server to look claims it at once."""
        with self.db.tx() as conn:
            conn.execute(
                sa.update(t.tasks)
                .where(t.tasks.c.id == id, t.tasks.c.owner == owner,
                       t.tasks.c.status.in_(TASK_HELD))
                .values(owner=None, lease_until=0.0)
            )  # fmt: skip

    def release_step(self, wf_id: str, sid: str, owner: str | None, *, spend: bool) -> bool:
        """A running step goes back to pending (its attempt given back unless ``spend``)."""
        s = t.workflow_steps
        with self.db.tx() as conn:
            self.db.lock_row(conn, t.workflows, wf_id)
            cond = [s.c.workflow_id == wf_id, s.c.id == sid, s.c.status == "running"]
            if owner is not None:
                cond.append(s.c.owner == owner)
            values: dict[str, Any] = {"status": "pending", "owner": None, "lease_until": None}
            if spend:
                values["started_at"] = None  # the next attempt starts afresh
            else:
                # The same attempt, taken up again (a restart): it keeps the time it started.
                values["attempts"] = s.c.attempts - 1
            done = conn.execute(sa.update(s).where(*cond).values(**values)).rowcount > 0
            if done:
                self.db.emit(conn, f"workflow:{wf_id}", "step", {"id": sid, "status": "pending"})
        return done
