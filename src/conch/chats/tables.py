"""The ``chats`` table: one row per chat, its messages and settings as JSON.

A chat belongs to a tenant (the key's that made it; ``None`` for the admin's). ``search_text``
is the title and every message's text, what full-text search reads: on SQLite an FTS5 index
over it (``chats_fts``, external content, kept in step by triggers), on PostgreSQL a GIN
index of its ``tsvector``, both made by the migration ``0008_chats``. ``client_id`` is the
id a chat had in the browser it was imported from, so that importing twice changes nothing.
Times are Unix seconds (floats), as in the other domains.
"""

from __future__ import annotations

import sqlalchemy as sa

from conch.db import metadata

chats = sa.Table(
    "chats",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("tenant", sa.String(200), nullable=True),
    sa.Column("title", sa.String(500), nullable=False),
    # The chat's model settings as the client keeps them ({model, system, temperature, ...}).
    sa.Column("settings", sa.JSON, nullable=False),
    # [{id, role, content, ...}] in order; fields other than role and content are the client's.
    sa.Column("messages", sa.JSON, nullable=False),
    sa.Column("message_count", sa.Integer, nullable=False),
    sa.Column("renamed", sa.Boolean, nullable=False),
    sa.Column("search_text", sa.Text, nullable=False),
    sa.Column("client_id", sa.String(200), nullable=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Index("ix_chats_tenant_updated", "tenant", "updated_at"),
    sa.Index("ix_chats_tenant_client_id", "tenant", "client_id"),
)
