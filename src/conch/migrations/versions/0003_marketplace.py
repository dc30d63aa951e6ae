"""Marketplace: published agent versions, the search index, installed agents.

Revision ID: 0003_marketplace
Revises: 0001_baseline
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_marketplace"
down_revision = "0001_baseline"
branch_labels = ("marketplace",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "marketplace_agents",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("system_prompt", sa.Text, nullable=False),
        sa.Column("tools", sa.JSON, nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("category", sa.String(40), nullable=False),
        sa.Column("tags", sa.JSON, nullable=False),
        sa.Column("author", sa.String(100), nullable=True),
        sa.Column("digest", sa.String(80), nullable=False),
        sa.Column("published_at", sa.String(40), nullable=False),
        sa.Column("downloads", sa.Integer, nullable=False, server_default="0"),
        sa.Column("prerelease", sa.Boolean, nullable=False),
        sa.Column("latest", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("search_text", sa.Text, nullable=False),
        sa.UniqueConstraint("name", "version", name="uq_marketplace_agents_name_version"),
    )
    op.create_index(
        "ix_marketplace_agents_latest", "marketplace_agents", ["latest", "category", "name"]
    )
    op.create_table(
        "marketplace_installed",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("digest", sa.String(80), nullable=False),
        sa.Column("origin", sa.String(500), nullable=False),
        sa.Column("manifest", sa.JSON, nullable=False),
        sa.Column("installed_at", sa.String(40), nullable=False),
    )
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
    op.drop_table("marketplace_installed")
    op.drop_index("ix_marketplace_agents_latest", table_name="marketplace_agents")
    op.drop_table("marketplace_agents")
