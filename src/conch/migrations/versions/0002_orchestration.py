"""Orchestration: agents, tasks, workflows, workflow steps and their event log."""

from __future__ import annotations

from conch.migrations.snapshot import creating
from conch.orchestration import tables as t

revision = "0002_orchestration"
down_revision = "0001_baseline"
branch_labels = ("orchestration",)
depends_on = None

# The orchestration tables are still those of this revision (conch.migrations.snapshot says
# why that is enough, and what to do when one changes).
upgrade, downgrade = creating(
    revision, [t.agents, t.tasks, t.workflows, t.workflow_steps, t.events], "9c199309184f6f47"
)
