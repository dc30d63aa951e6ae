"""The database: SQLAlchemy Core over SQLite (WAL) or PostgreSQL, schema managed by Alembic.

Tables are declared on one :data:`metadata`; each domain declares its own tables in its package
(``inference`` here, ``orchestration/tables.py``, ``marketplace/tables.py``) and ships the
Alembic migration that creates them under ``conch/migrations/versions``. Every domain's
migrations branch from the baseline, so the schema is "all heads" (``upgrade heads``), and a
database made by an earlier release upgrades in place on start.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

metadata = sa.MetaData()

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

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
BASELINE = "0001_baseline"


def _sqlite_pragmas(dbapi_conn: object, _record: object) -> None:
    cur = dbapi_conn.cursor()  # type: ignore[attr-defined]
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.close()


_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def create_engine(url: str) -> Engine:
    """A new engine for ``url`` (SQLite gets WAL and a busy timeout), schema not touched."""
    if url.startswith("sqlite:///"):
        _private_database(Path(url.removeprefix("sqlite:///").split("?", 1)[0]))
        eng = sa.create_engine(url, connect_args={"check_same_thread": False})
        sa.event.listen(eng, "connect", _sqlite_pragmas)
        return eng
    return sa.create_engine(url, pool_pre_ping=True)


def _private_database(path: Path) -> None:
    """Create a new SQLite database file readable by its owner alone. SQLite gives its WAL,
    shared-memory and journal files the database file's mode, so they are private too; an
    existing database keeps its mode (the agent server warns about a readable one)."""
    if str(path) in ("", ":memory:") or path.exists():
        return
    from conch.config import make_data_dir

    if not path.parent.exists():
        make_data_dir(path.parent)  # normally the data dir; made searchable, not listable
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))


def engine_for(url: str) -> Engine:
    """One engine per URL, with the schema created or migrated on first use."""
    with _lock:
        eng = _engines.get(url)
        if eng is not None:
            return eng
        eng = create_engine(url)
        migrate(eng)
        _engines[url] = eng
        return eng


def _alembic_config(conn: Connection):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = conn
    return cfg


def heads() -> set[str]:
    """The revisions a current database is at: one head per domain branch."""
    from alembic.script import ScriptDirectory

    return set(ScriptDirectory(str(MIGRATIONS_DIR)).get_heads())


def current_revisions(conn: Connection) -> set[str]:
    from alembic.migration import MigrationContext

    return set(MigrationContext.configure(conn).get_current_heads())


def migrate(eng: Engine) -> set[str]:
    """Bring the schema to every head; returns the revisions applied in the database.

    A database made before conch used Alembic (it has ``models`` and ``schema_version`` but no
    ``alembic_version``) is stamped at the baseline first, then upgraded like any other.
    """
    from alembic import command

    with eng.begin() as conn:
        if eng.dialect.name == "postgresql":
            # Several servers may start at once on one database: one migrates, the others wait.
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7262012)")
        cfg = _alembic_config(conn)
        tables = set(sa.inspect(conn).get_table_names())
        if "alembic_version" not in tables and "models" in tables:
            command.stamp(cfg, BASELINE)
        command.upgrade(cfg, "heads")
        return current_revisions(conn)


def dispose_all() -> None:
    """Close every engine (tests and shutdown)."""
    with _lock:
        for eng in _engines.values():
            eng.dispose()
        _engines.clear()
