"""The keys tables: API keys, their usage windows and leases, and the audit log.

``api_keys`` holds one row per key. The secret itself is never stored: only its SHA-256
(``secret_hash``, what authentication looks up) and a short display prefix (``ck-AbCd1234``,
too short to guess the rest from). ``version`` grows by one with every change to a key
(patch, rotation, revocation), so a server holding a key in its cache can tell from one
indexed read that its copy is stale. Times are Unix seconds (floats), as in orchestration.

Usage is kept per key, not per secret, so a rotation leaves every window as it was:

- ``key_usage``: one row per key, created with the key. Its lock (``SELECT … FOR UPDATE`` on
  PostgreSQL) serialises the admissions of one key across servers. It holds the running
  totals of the sliding windows (``*_m`` over the last minute, ``*_d`` over the last day)
  and the marks up to which each window has been pruned.
- ``key_events``: one row per admission that touched a window (its time and the requests,
  tokens and runs it counted, and the CPU seconds reserved or spent). A row leaves the
  minute totals 60 s after its time; it is deleted once it has left every window the key's
  limits read (a day with a day limit, a minute without).
- ``key_leases``: what a key holds right now (a run, a session); counted against
  ``concurrent_runs`` and ``sessions_max``, released by the holder, and expired when its
  holder died without releasing it.

``audit_log`` is append-only: the migration adds triggers that refuse ``UPDATE`` and
``DELETE`` on it (``0007_keys``).
"""

from __future__ import annotations

import sqlalchemy as sa

from conch.db import metadata

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("tenant", sa.String(100), nullable=True, index=True),
    sa.Column("scopes", sa.JSON, nullable=False),
    sa.Column("limits", sa.JSON, nullable=False),
    sa.Column("models", sa.JSON, nullable=True),  # an allow-list; NULL: every model
    sa.Column("expires_at", sa.Float, nullable=True),
    sa.Column("secret_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("prefix", sa.String(16), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("revoked_at", sa.Float, nullable=True),
    sa.Column("created_by", sa.String(100), nullable=True),  # the creating key's id, or "admin"
)


def _key_id() -> sa.Column[str]:
    return sa.Column(
        "key_id", sa.String(40), sa.ForeignKey("api_keys.id", ondelete="CASCADE"), nullable=False
    )


key_usage = sa.Table(
    "key_usage",
    metadata,
    sa.Column(
        "key_id",
        sa.String(40),
        sa.ForeignKey("api_keys.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    # Events at or before a mark are out of that window's totals (minute) or deleted (day).
    sa.Column("minute_mark", sa.Float, nullable=False),
    sa.Column("day_mark", sa.Float, nullable=False),
    sa.Column("requests_m", sa.BigInteger, nullable=False),
    sa.Column("tokens_m", sa.BigInteger, nullable=False),
    sa.Column("runs_m", sa.BigInteger, nullable=False),
    sa.Column("tokens_d", sa.BigInteger, nullable=False),
    sa.Column("cpu_d", sa.Float, nullable=False),
)

key_events = sa.Table(
    "key_events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    _key_id(),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("requests", sa.Integer, nullable=False),
    sa.Column("tokens", sa.BigInteger, nullable=False),
    sa.Column("runs", sa.Integer, nullable=False),
    sa.Column("cpu", sa.Float, nullable=False),
)
sa.Index("ix_key_events_key_at", key_events.c.key_id, key_events.c.at)

key_leases = sa.Table(
    "key_leases",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    _key_id(),
    sa.Column("kind", sa.String(20), nullable=False),  # run | session
    sa.Column("acquired_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=True),  # NULL: held until released
)
sa.Index("ix_key_leases_key_kind", key_leases.c.key_id, key_leases.c.kind)

audit_log = sa.Table(
    "audit_log",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float, nullable=False, index=True),
    sa.Column("actor_id", sa.String(40), nullable=True, index=True),
    sa.Column("actor_name", sa.String(100), nullable=True),
    sa.Column("tenant", sa.String(100), nullable=True),  # the actor's tenant
    sa.Column("action", sa.String(60), nullable=False, index=True),
    sa.Column("target", sa.String(300), nullable=True),
    sa.Column("details", sa.JSON, nullable=False),
)

TABLES = [api_keys, key_usage, key_events, key_leases, audit_log]
