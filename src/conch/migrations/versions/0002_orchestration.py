"""Orchestration: agents, tasks, workflows, workflow steps and their event log."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from conch.migrations.snapshot import drop_tables

revision = "0002_orchestration"
down_revision = "0001_baseline"
branch_labels = ("orchestration",)
depends_on = None

# The tables as this revision created them (fingerprint 9c199309184f6f47), restated when
# 0004_checkpoints changed orch_agents and orch_tasks. Their own MetaData: they are history,
# not the live definitions of conch.orchestration.tables.
_m = sa.MetaData()


def _outcome() -> list[sa.Column[object]]:
    return [sa.Column("result", sa.JSON, nullable=True), sa.Column("error", sa.JSON, nullable=True)]


def _span() -> list[sa.Column[object]]:
    return [
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
    ]


def _lease() -> list[sa.Column[object]]:
    return [
        sa.Column("owner", sa.String, nullable=True),
        sa.Column("lease_until", sa.Float, nullable=True),
    ]


def _keyed_by_id(name: str, *columns: sa.Column[object]) -> sa.Table:
    return sa.Table(name, _m, sa.Column("id", sa.String, primary_key=True), *columns)


TABLES = [
    _keyed_by_id(
        "orch_agents",
        sa.Column("description", sa.String, nullable=False, default=""),
        sa.Column("system_prompt", sa.Text, nullable=False, default=""),
        sa.Column("tools", sa.JSON, nullable=False),
        sa.Column("model", sa.String, nullable=False),
        sa.Column("source", sa.String, nullable=False),
        sa.Column("version", sa.String, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
    ),
    _keyed_by_id(
        "orch_tasks",
        sa.Column("goal", sa.Text, nullable=False),
        sa.Column("tools", sa.JSON, nullable=False),
        sa.Column("max_steps", sa.Integer, nullable=False),
        sa.Column("agent", sa.String, nullable=False),
        sa.Column("model", sa.String, nullable=False),
        sa.Column("status", sa.String, nullable=False, index=True),
        sa.Column("steps", sa.JSON, nullable=False),
        *_outcome(),
        sa.Column("usage", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        *_span(),
        sa.Column("origin", sa.String, nullable=False),
        *_lease(),
    ),
    _keyed_by_id(
        "orch_workflows",
        sa.Column("name", sa.String, nullable=False),
        sa.Column("status", sa.String, nullable=False, index=True),
        sa.Column("definition", sa.JSON, nullable=False),
        sa.Column("error", sa.JSON, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=True),
    ),
    sa.Table(
        "orch_workflow_steps",
        _m,
        sa.Column("workflow_id", sa.String, primary_key=True),
        sa.Column("id", sa.String, primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("status", sa.String, nullable=False),
        sa.Column("blocked", sa.Integer, nullable=False),
        *_outcome(),
        sa.Column("attempts", sa.Integer, nullable=False, default=0),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        *_span(),
        sa.Column("not_before", sa.Float, nullable=False, default=0.0),
        *_lease(),
        sa.Column("task_id", sa.String, nullable=True),
        sa.Index("ix_orch_steps_claim", "status", "blocked", "not_before"),
    ),
    sa.Table(
        "orch_events",
        _m,
        sa.Column("stream", sa.String, primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("event", sa.String, nullable=False),
        sa.Column("data", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    ),
]


def upgrade() -> None:
    for table in TABLES:
        op.get_context().impl.create_table(table)


def downgrade() -> None:
    drop_tables(TABLES)
