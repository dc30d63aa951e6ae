"""The marketplace's tables: published versions, the search index and what is installed.

``marketplace_agents`` holds one row per published version; versions are immutable, so a row
is written once and only its ``downloads`` counter and ``latest`` flag change afterwards.
``latest`` marks the version that search and list show (the highest stable version, or the
highest prerelease while an agent has no stable one). The search index lives next to it: an
FTS5 table on SQLite (``marketplace_fts``, one row per agent, rowid = the latest version's id)
or a ``tsvector`` expression index on PostgreSQL; both are created by the migration
``0003_marketplace``.
"""

from __future__ import annotations

import sqlalchemy as sa

from conch.db import metadata

agents = sa.Table(
    "marketplace_agents",
    metadata,
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
    sa.Column("downloads", sa.Integer, nullable=False, default=0, server_default="0"),
    sa.Column("prerelease", sa.Boolean, nullable=False),
    sa.Column("latest", sa.Boolean, nullable=False, default=False, server_default=sa.false()),
    # name, description and tags as one text, for PostgreSQL's full-text index
    sa.Column("search_text", sa.Text, nullable=False),
    sa.UniqueConstraint("name", "version", name="uq_marketplace_agents_name_version"),
)
sa.Index("ix_marketplace_agents_latest", agents.c.latest, agents.c.category, agents.c.name)

installed = sa.Table(
    "marketplace_installed",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("version", sa.String(64), nullable=False),
    sa.Column("digest", sa.String(80), nullable=False),
    sa.Column("origin", sa.String(500), nullable=False),  # "local" or the upstream's URL
    # The verified manifest, so an agent installed from an upstream keeps working without it.
    sa.Column("manifest", sa.JSON, nullable=False),
    sa.Column("installed_at", sa.String(40), nullable=False),
)
