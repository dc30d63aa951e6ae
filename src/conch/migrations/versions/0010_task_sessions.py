"""Orchestration: the session an agent task's tool calls run in.

``orch_tasks`` gains ``session``: the session (``conch.sessions``) given to the task, or its
thread's, made with the thread's first task; NULL for a task that runs statelessly.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_task_sessions"
down_revision = "0009_orchestration_tenants"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("orch_tasks") as batch:
        batch.add_column(sa.Column("session", sa.String, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("orch_tasks") as batch:
        batch.drop_column("session")
