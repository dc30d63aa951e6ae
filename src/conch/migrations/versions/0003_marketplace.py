"""Marketplace: published agent versions, the search index, installed agents."""

from __future__ import annotations

from alembic import op

from conch.marketplace import tables as t
from conch.migrations.snapshot import create_tables, drop_tables

revision = "0003_marketplace"
down_revision = "0001_baseline"
branch_labels = ("marketplace",)
depends_on = None

# The marketplace tables are still those of this revision (conch.migrations.snapshot says why
# that is enough, and what to do when one changes). The search index is not a table of
# ``tables.py``: it is written out below, per database.
TABLES = [t.agents, t.installed]


def upgrade() -> None:
    create_tables(revision, TABLES, "9b7f7973f7d9d4b8")
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        # One row per agent (its latest version), kept in step by the marketplace service in
        # the same transaction as every publish. Hyphens split tokens, so "csv-analyst"
        # matches "csv"; porter stemming lets "summarise" find "summariser".
        op.execute(
            "CREATE VIRTUAL TABLE marketplace_fts USING fts5("
            "name, description, tags, tokenize = 'porter unicode61')"
        )
    elif dialect == "postgresql":
        op.execute(
            "CREATE INDEX ix_marketplace_agents_fts ON marketplace_agents "
            "USING GIN (to_tsvector('english', search_text)) WHERE latest"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TABLE IF EXISTS marketplace_fts")
    drop_tables(TABLES)
