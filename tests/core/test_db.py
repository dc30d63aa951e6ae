"""The database: SQLite in WAL mode, schema created on first use, versioned."""

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
            version = conn.execute(sa.select(sa.func.max(db.schema_version.c.version))).scalar()
            assert version == db.SCHEMA_VERSION
            tables = set(sa.inspect(conn).get_table_names())
        assert {"schema_version", "models"} <= tables
        assert db.engine_for(url) is eng  # one engine per URL
    finally:
        db.dispose_all()


def test_migration_is_idempotent(tmp_path: Path) -> None:
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    assert db.migrate(eng) == db.SCHEMA_VERSION
    assert db.migrate(eng) == db.SCHEMA_VERSION
    with eng.connect() as conn:
        rows = conn.execute(sa.select(db.schema_version)).all()
    assert len(rows) == 1
    eng.dispose()


def test_pending_migrations_run_in_order(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'y.db'}")
    db.migrate(eng)
    applied: list[int] = []
    monkeypatch.setattr(db, "SCHEMA_VERSION", db.SCHEMA_VERSION + 2)
    monkeypatch.setattr(
        db,
        "MIGRATIONS",
        {db.SCHEMA_VERSION - 1: lambda c: applied.append(1), db.SCHEMA_VERSION: lambda c: applied.append(2)},
    )
    assert db.migrate(eng) == db.SCHEMA_VERSION
    assert applied == [1, 2]
    eng.dispose()
