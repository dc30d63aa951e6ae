"""Orchestration: agents, tasks, workflows, workflow steps and their event log.

Revision ID: 0002_orchestration
Revises: 0001_baseline
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_orchestration"
down_revision = "0001_baseline"
branch_labels = ("orchestration",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "orch_agents",
        sa.Column("id", sa.String, primary_key=True),
        sa.Column("description", sa.String, nullable=False),
        sa.Column("system_prompt", sa.Text, nullable=False),
        sa.Column("tools", sa.JSON, nullable=False),
        sa.Column("model", sa.String, nullable=False),
        sa.Column("source", sa.String, nullable=False),
        sa.Column("version", sa.String, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "orch_tasks",
        sa.Column("id", sa.String, primary_key=True),
        sa.Column("goal", sa.Text, nullable=False),
        sa.Column("tools", sa.JSON, nullable=False),
        sa.Column("max_steps", sa.Integer, nullable=False),
        sa.Column("agent", sa.String, nullable=False),
        sa.Column("model", sa.String, nullable=False),
        sa.Column("status", sa.String, nullable=False),
        sa.Column("steps", sa.JSON, nullable=False),
        sa.Column("result", sa.JSON, nullable=True),
        sa.Column("error", sa.JSON, nullable=True),
        sa.Column("usage", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("origin", sa.String, nullable=False),
        sa.Column("owner", sa.String, nullable=True),
        sa.Column("lease_until", sa.Float, nullable=True),
    )
    op.create_index("ix_orch_tasks_status", "orch_tasks", ["status"])
    op.create_table(
        "orch_workflows",
        sa.Column("id", sa.String, primary_key=True),
        sa.Column("name", sa.String, nullable=False),
        sa.Column("status", sa.String, nullable=False),
        sa.Column("definition", sa.JSON, nullable=False),
        sa.Column("error", sa.JSON, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=True),
    )
    op.create_index("ix_orch_workflows_status", "orch_workflows", ["status"])
    op.create_table(
        "orch_workflow_steps",
        sa.Column("workflow_id", sa.String, primary_key=True),
        sa.Column("id", sa.String, primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("status", sa.String, nullable=False),
        sa.Column("blocked", sa.Integer, nullable=False),
        sa.Column("result", sa.JSON, nullable=True),
        sa.Column("error", sa.JSON, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("not_before", sa.Float, nullable=False),
        sa.Column("owner", sa.String, nullable=True),
        sa.Column("lease_until", sa.Float, nullable=True),
        sa.Column("task_id", sa.String, nullable=True),
    )
    op.create_index(
        "ix_orch_steps_claim", "orch_workflow_steps", ["status", "blocked", "not_before"]
    )
    op.create_table(
        "orch_events",
        sa.Column("stream", sa.String, primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("event", sa.String, nullable=False),
        sa.Column("data", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("orch_events")
    op.drop_table("orch_workflow_steps")
    op.drop_table("orch_workflows")
    op.drop_table("orch_tasks")
    op.drop_table("orch_agents")
