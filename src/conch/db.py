"""The database: SQLAlchemy Core over SQLite (WAL) or PostgreSQL.

All tables are declared here on one :data:`metadata`, so the whole schema reads in one place.
``schema_version`` records the applied migrations; :data:`MIGRATIONS` lists the steps that
bring an older database forward (each runs once, in order, inside a transaction).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

metadata = sa.MetaData()

schema_version = sa.Table(
    "schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("applied_at", sa.Float, nullable=False),
)

# The model registry (inference server).
models = sa.Table(
    "models",
    metadata,
    sa.Column("id", sa.String, primary_key=True),
    sa.Column("created", sa.Integer, nullable=False),
    sa.Column("status", sa.String, nullable=False),  # ready | downloading | converting | failed
    sa.Column("format", sa.String, nullable=False),  # gguf | safetensors | onnx
    sa.Column("path", sa.String, nullable=False),  # main file (or directory) of the model
    sa.Column("size_bytes", sa.BigInteger, nullable=False, default=0),
    sa.Column("sha256", sa.String, nullable=True),
    sa.Column("details", sa.JSON, nullable=False, default=dict),
)

SCHEMA_VERSION = 1

# version -> function applied to reach it from version - 1. Version 1 is the initial schema.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {}


def _sqlite_pragmas(dbapi_conn: object, _record: object) -> None:
    cur = dbapi_conn.cursor()  # type: ignore[attr-defined]
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.close()


_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def engine_for(url: str) -> Engine:
    """One engine per URL, with the schema created or migrated on first use."""
    with _lock:
        eng = _engines.get(url)
        if eng is not None:
            return eng
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            eng = sa.create_engine(url, connect_args={"check_same_thread": False})
            sa.event.listen(eng, "connect", _sqlite_pragmas)
        else:
            eng = sa.create_engine(url, pool_pre_ping=True)
        migrate(eng)
        _engines[url] = eng
        return eng


def migrate(eng: Engine) -> int:
    """Create missing tables and apply pending migrations; returns the schema version."""
    import time

    metadata.create_all(eng)
    with eng.begin() as conn:
        current = conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar()
        if current is None:
            conn.execute(schema_version.insert().values(version=SCHEMA_VERSION, applied_at=time.time()))
            return SCHEMA_VERSION
        for version in range(current + 1, SCHEMA_VERSION + 1):
            MIGRATIONS[version](conn)
            conn.execute(schema_version.insert().values(version=version, applied_at=time.time()))
    return SCHEMA_VERSION


def dispose_all() -> None:
    """Close every engine (tests and shutdown)."""
    with _lock:
        for eng in _engines.values():
            eng.dispose()
        _engines.clear()
