"""Orchestration: threads, forks and the tool-call protocol of agent tasks.

``orch_tasks`` gains the thread a task continues (``thread_id``), the task and checkpoint step
it was forked from (``forked_from``, ``fork_checkpoint``), the messages its conversation starts
from before its goal (``history``: earlier tasks of its thread, or a fork's edited history),
and the tool-call protocol it ran with (``protocol``: ``native`` or ``json``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_task_threads"
down_revision = "0004_checkpoints"
branch_labels = None
depends_on = None

TASK_COLUMNS = [
    ("thread_id", sa.String),
    ("forked_from", sa.String),
    ("fork_checkpoint", sa.Integer),
    ("history", sa.JSON),
    ("protocol", sa.String),
]


def upgrade() -> None:
    with op.batch_alter_table("orch_tasks") as batch:
        for name, type_ in TASK_COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))
        batch.create_index("ix_orch_tasks_thread_id", ["thread_id"])


def downgrade() -> None:
    with op.batch_alter_table("orch_tasks") as batch:
        batch.drop_index("ix_orch_tasks_thread_id")
        for name, _type in reversed(TASK_COLUMNS):
            batch.drop_column(name)
