"""Baseline: the model registry, as the first release created it.

Revision ID: 0001_baseline
Revises:
"""

from __future__ import annotations

from conch import db
from conch.migrations.snapshot import create_tables, drop_tables

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None

# ``conch.db.models`` is still the table of this revision (conch.migrations.snapshot says why
# that is enough, and what to do when it changes).
TABLES = [db.models]


def upgrade() -> None:
    create_tables(revision, TABLES, "cbc4d1e06bc03592")


def downgrade() -> None:
    drop_tables(TABLES)
