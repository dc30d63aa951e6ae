"""Every read and write of orchestration state (synchronous SQLAlchemy Core; the
orchestrator calls these on its event loop for SQLite, from worker threads for PostgreSQL).

One store per job, all over one :class:`~.base.Database` (the transaction helper):

- :mod:`.tasks`        agent tasks and the steps their runs record (:class:`TaskStore`);
- :mod:`.checkpoints`  a task's checkpoint, and the waits for a person's approval
  (:class:`CheckpointStore`);
- :mod:`.workflows`    workflows and their steps as submitted (:class:`WorkflowStore`);
- :mod:`.steps`        the scheduling rounds: steps claimed, their outcomes recorded
  (:class:`StepStore`);
- :mod:`.leases`       which server holds what; taking over a dead server's work
  (:class:`LeaseStore`);
- :mod:`.records`      rows as the API shows them.

:class:`Stores` builds them over one engine.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from conch.orchestration import tables as t
from conch.orchestration.store.base import Database
from conch.orchestration.store.checkpoints import CheckpointSeq, CheckpointStore
from conch.orchestration.store.leases import LeaseStore
from conch.orchestration.store.steps import StepOutcome, StepStore
from conch.orchestration.store.tasks import (
    INTERRUPTED,
    TASK_ACTIVE,
    TASK_DONE,
    TASK_HELD,
    TaskStore,
)
from conch.orchestration.store.workflows import WorkflowStore

__all__ = [
    "INTERRUPTED",
    "TASK_ACTIVE",
    "TASK_DONE",
    "TASK_HELD",
    "CheckpointSeq",
    "CheckpointStore",
    "Database",
    "LeaseStore",
    "StepOutcome",
    "StepStore",
    "Stores",
    "TaskStore",
    "WorkflowStore",
]


class Stores:
    """The orchestration stores of one engine, sharing its :class:`Database`."""

    def __init__(self, engine: Engine) -> None:
        self.db = Database(engine)
        self.tasks = TaskStore(self.db)
        self.checkpoints = CheckpointStore(self.db)
        self.workflows = WorkflowStore(self.db)
        self.steps = StepStore(self.db)
        self.leases = LeaseStore(self.db, self.tasks, self.steps)

    def metrics(self, tenant: str | None = None) -> dict[str, int]:
        """Counts of agents, tasks and workflows by status, and the mean task duration
        (``tenant``: of that tenant's, and the agents it sees; ``None``: of every tenant's)."""
        tk, wf, ag = t.tasks, t.workflows, t.agents

        def mine(table: sa.Table) -> Any:
            return sa.true() if tenant is None else table.c.tenant == tenant

        agents_seen = sa.true() if tenant is None else sa.or_(
            ag.c.tenant == tenant, ag.c.source == "marketplace"
        )
        with self.db.read() as conn:
            by_status: dict[str, int] = dict(
                conn.execute(
                    sa.select(tk.c.status, sa.func.count()).where(mine(tk)).group_by(tk.c.status)
                ).all()
            )
            avg = conn.execute(
                sa.select(sa.func.avg(tk.c.finished_at - tk.c.started_at)).where(
                    tk.c.status == "succeeded", tk.c.started_at.is_not(None), mine(tk)
                )
            ).scalar_one()
            wf_status: dict[str, int] = dict(
                conn.execute(
                    sa.select(wf.c.status, sa.func.count()).where(mine(wf)).group_by(wf.c.status)
                ).all()
            )
            agents = conn.execute(
                sa.select(sa.func.count()).select_from(ag).where(agents_seen)
            ).scalar_one()
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

