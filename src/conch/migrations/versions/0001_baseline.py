"""Baseline: the model registry, as the first release created it.

Revision ID: 0001_baseline
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.String, primary_key=True),
        sa.Column("created", sa.Integer, nullable=False),
        sa.Column("status", sa.String, nullable=False),
        sa.Column("format", sa.String, nullable=False),
        sa.Column("path", sa.String, nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False, default=0),
        sa.Column("sha256", sa.String, nullable=True),
        sa.Column("details", sa.JSON, nullable=False, default=dict),
    )


def downgrade() -> None:
    op.drop_table("models")
