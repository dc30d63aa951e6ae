"""Orchestration: tenants own agents, tasks and workflows.

``orch_agents``, ``orch_tasks`` and ``orch_workflows`` gain ``tenant`` (the tenant of the key
that made the row; NULL, the admin's, for every row made before keys), and tasks and
workflows the making key's id (``key_id``), with an index for each tenant's newest first.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_orchestration_tenants"
down_revision = "0005_task_threads"
branch_labels = None
depends_on = None

COLUMNS = {
    "orch_agents": [("tenant", sa.String)],
    "orch_tasks": [("tenant", sa.String), ("key_id", sa.String)],
    "orch_workflows": [("tenant", sa.String), ("key_id", sa.String)],
}
INDEXES = {"orch_tasks": "ix_orch_tasks_tenant", "orch_workflows": "ix_orch_workflows_tenant"}


def upgrade() -> None:
    for table, columns in COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            for name, type_ in columns:
                batch.add_column(sa.Column(name, type_, nullable=True))
            if table in INDEXES:
                batch.create_index(INDEXES[table], ["tenant", "created_at"])


def downgrade() -> None:
    for table, columns in COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            if table in INDEXES:
                batch.drop_index(INDEXES[table])
            for name, _type in reversed(columns):
                batch.drop_column(name)
