"""Orchestration: agents, tasks, workflows, workflow steps and their event log.

Revision ID: 0002_orchestration
Revises: 0001_baseline
"""

from __future__ import annotations

from conch.migrations.snapshot import create_tables, drop_tables
from conch.orchestration import tables as t

revision = "0002_orchestration"
down_revision = "0001_baseline"
branch_labels = ("orchestration",)
depends_on = None

# The orchestration tables are still those of this revision (conch.migrations.snapshot says
# why that is enough, and what to do when one changes).
TABLES = [t.agents, t.tasks, t.workflows, t.workflow_steps, t.events]


def upgrade() -> None:
    create_tables(revision, TABLES, "9c199309184f6f47")


def downgrade() -> None:
    drop_tables(TABLES)
