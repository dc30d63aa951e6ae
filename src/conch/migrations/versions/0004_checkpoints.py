"""Orchestration: task checkpoints and human approvals.

``orch_checkpoints`` records every model reply and tool call of a task as it completes, so
that a task resumes after its server died; ``orch_tasks`` gains the task's approval policy,
its approval timeout, the calls waiting for a decision and when the wait times out;
``orch_agents`` gains the agent's approval policy.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_checkpoints"
down_revision = "0002_orchestration"
branch_labels = None
depends_on = None

TASK_COLUMNS = [
    ("approvals", sa.JSON),
    ("approval_timeout_s", sa.Float),
    ("pending", sa.JSON),
    ("wait_until", sa.Float),
]


def upgrade() -> None:
    op.create_table(
        "orch_checkpoints",
        sa.Column("task_id", sa.String, primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("kind", sa.String, nullable=False),
        sa.Column("data", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    with op.batch_alter_table("orch_tasks") as batch:
        for name, type_ in TASK_COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))
    with op.batch_alter_table("orch_agents") as batch:
        batch.add_column(sa.Column("approvals", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("orch_agents") as batch:
        batch.drop_column("approvals")
    with op.batch_alter_table("orch_tasks") as batch:
        for name, _type in reversed(TASK_COLUMNS):
            batch.drop_column(name)
    op.drop_table("orch_checkpoints")
