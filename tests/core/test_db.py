"""The database: SQLite in WAL mode, schema created and upgraded by Alembic on first use."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from conch import db


def test_schema_created_in_wal_mode(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sub' / 'conch.db'}"
    eng = db.engine_for(url)
    try:
        with eng.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert db.current_revisions(conn) == db.heads()
            tables = set(sa.inspect(conn).get_table_names())
        assert {"alembic_version", "models"} <= tables
        assert db.engine_for(url) is eng  # one engine per URL
    finally:
        db.dispose_all()


def test_migration_is_idempotent(tmp_path: Path) -> None:
    eng = db.create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    assert db.migrate(eng) == db.heads()
    assert db.migrate(eng) == db.heads()
    with eng.connect() as conn:
        rows = conn.exec_driver_sql("SELECT version_num FROM alembic_version").all()
    assert {r[0] for r in rows} == db.heads()
    eng.dispose()


def test_database_of_the_first_release_upgrades_in_place(tmp_path: Path) -> None:
    """The first release created its tables itself and kept a ``schema_version`` row; its
    models survive the move to Alembic and the database ends at every head."""
    eng = db.create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    with eng.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at FLOAT NOT NULL)"
        )
        conn.exec_driver_sql("INSERT INTO schema_version VALUES (1, 0)")
        conn.exec_driver_sql(
            "CREATE TABLE models (id VARCHAR PRIMARY KEY, created INTEGER NOT NULL, status VARCHAR "
            "NOT NULL, format VARCHAR NOT NULL, path VARCHAR NOT NULL, size_bytes BIGINT NOT NULL, "
            "sha256 VARCHAR, details JSON NOT NULL)"
        )
        conn.exec_driver_sql(
            "INSERT INTO models VALUES ('m', 1, 'ready', 'gguf', '/x.gguf', 3, NULL, '{}')"
        )
    assert db.migrate(eng) == db.heads()
    with eng.connect() as conn:
        assert conn.execute(sa.select(db.models.c.id)).scalars().all() == ["m"]
    eng.dispose()
