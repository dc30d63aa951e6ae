"""The sessions branch of the migrations: made from the baseline, downgraded on its own, and
refusing to run once the table has moved on from it (conch.migrations.snapshot)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

import conch.sessions.tables
from conch import db
from tests.core.test_migrations import _changed, schema_differences


def test_sessions_is_a_branch_of_its_own(tmp_path: Path) -> None:
    assert "0006_sessions" in db.heads()
    eng = db.create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        assert db.migrate(eng) == db.heads()
        assert schema_differences(eng) == []
        with eng.begin() as conn:
            command.downgrade(db._alembic_config(conn), "sessions@0001_baseline")
            names = set(sa.inspect(conn).get_table_names())
        assert "sessions" not in names and {"orch_tasks", "marketplace_agents"} <= names
        assert db.migrate(eng) == db.heads()
        assert schema_differences(eng) == []
    finally:
        eng.dispose()


def test_the_migration_refuses_a_changed_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = conch.sessions.tables.sessions
    monkeypatch.setattr(
        conch.sessions.tables, "sessions", _changed(sessions, sa.Column("x", sa.Integer))
    )
    eng = db.create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with pytest.raises(RuntimeError, match=r"0006_sessions creates sessions"):
            db.migrate(eng)
    finally:
        eng.dispose()
