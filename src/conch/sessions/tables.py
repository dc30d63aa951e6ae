"""The ``sessions`` table: one row per session, on the project's one MetaData.

A row says what a session is (its tenant, TTL, lowered limits and permissions), how it has
been used (``runs``, ``last_used_at``, the ``workspace_bytes`` last measured, the
``state_version`` of its saved bindings) and which server may run it now (``lease_owner``
until ``lease_expires_at``). Its files and saved bindings live on disk under
``sessions_dir`` (:mod:`conch.sessions.layout`); the row is what several servers sharing one
database agree on.

Times are Unix seconds (floats), as in the orchestration tables, so that leases and expiry
compare without time-zone parsing. Created by the ``sessions`` Alembic branch
(``0006_sessions``), never by ``metadata.create_all``.
"""

from __future__ import annotations

import sqlalchemy as sa

from conch.db import metadata

# active: used (or created) and not yet paused; paused: idle, no process holds it, its state
# on disk; deleting: deleted or expired, its files being removed (invisible to every reader;
# the row goes once the files have).
ACTIVE, PAUSED, DELETING = "active", "paused", "deleting"
LIVE = (ACTIVE, PAUSED)

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("id", sa.String, primary_key=True),
    # Whose session it is (the API key's tenant); None: made without one (single-user servers).
    sa.Column("tenant", sa.String, nullable=True),
    sa.Column("status", sa.String, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("last_used_at", sa.Float, nullable=False),
    # last_used_at + ttl_s, moved by every use; past it the session is deleted.
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("ttl_s", sa.Float, nullable=False),
    # The run limits of the session's runs: {wall_time_s, steps, recursion, output_bytes,
    # collection_size}, each at most the server's when the session was made.
    sa.Column("limits", sa.JSON, nullable=False),
    sa.Column("allow_network", sa.Boolean, nullable=False),
    sa.Column("allow_process", sa.Boolean, nullable=False),
    sa.Column("workspace_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("runs", sa.Integer, nullable=False, server_default="0"),
    # Bumped by every run that saved bindings: a server holding a warm worker for the session
    # compares it with the version its worker has, so a run made elsewhere is never missed.
    sa.Column("state_version", sa.Integer, nullable=False, server_default="0"),
    sa.Column("lease_owner", sa.String, nullable=True),  # the server instance running it
    sa.Column("lease_expires_at", sa.Float, nullable=True),
    sa.Index("ix_sessions_tenant", "tenant", "created_at"),
    sa.Index("ix_sessions_expires_at", "status", "expires_at"),
)
