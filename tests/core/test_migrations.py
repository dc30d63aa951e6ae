"""The migrations make, on a fresh SQLite and a fresh PostgreSQL database, exactly the schema
the tables modules describe; a creating migration refuses to run once its tables have moved
on from its revision (``conch.migrations.snapshot``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

import conch.chats.tables
import conch.keys.tables
import conch.marketplace.tables
import conch.orchestration.tables
from conch import db
from conch.migrations.snapshot import fingerprint
from tests.orchestration.pg import postgres_cluster

# Written by 0003_marketplace and 0008_chats per database, and described there rather than in
# tables.py.
SEARCH_INDEX = {"marketplace_fts", "ix_marketplace_agents_fts", "chats_fts", "ix_chats_fts"}


def _not_search_index(obj: Any, name: str | None, type_: str, *_: Any) -> bool:
    return not (name or "").startswith(tuple(SEARCH_INDEX)) and name != "alembic_version"


def schema_differences(eng: sa.Engine) -> list[Any]:
    with eng.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                "compare_server_default": True,
                "include_object": _not_search_index,
            },
        )
        return compare_metadata(ctx, db.metadata)


def test_a_fresh_sqlite_database_is_what_the_tables_describe(tmp_path: Path) -> None:
    eng = db.create_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
    try:
        assert db.migrate(eng) == db.heads()
        assert schema_differences(eng) == []
        with eng.connect() as conn:
            names = set(sa.inspect(conn).get_table_names())
        assert "marketplace_fts" in names
    finally:
        eng.dispose()


@pytest.mark.timeout(300)
def test_a_fresh_postgresql_database_is_what_the_tables_describe(tmp_path: Path) -> None:
    with postgres_cluster(tmp_path) as url:
        eng = db.create_engine(url)
        try:
            assert db.migrate(eng) == db.heads()
            assert schema_differences(eng) == []
            with eng.connect() as conn:
                indexes = {ix["name"] for ix in sa.inspect(conn).get_indexes("marketplace_agents")}
            assert "ix_marketplace_agents_latest" in indexes
        finally:
            eng.dispose()


def test_downgrade_to_base_and_back(tmp_path: Path) -> None:
    from alembic import command

    eng = db.create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        db.migrate(eng)
        with eng.begin() as conn:
            command.downgrade(db._alembic_config(conn), "base")
            assert set(sa.inspect(conn).get_table_names()) == {"alembic_version"}
        assert db.migrate(eng) == db.heads()
        assert schema_differences(eng) == []
    finally:
        eng.dispose()


def _changed(table: sa.Table, *extra: sa.Column[Any]) -> sa.Table:
    copy = table.to_metadata(sa.MetaData())
    for column in extra:
        copy.append_column(column)
    return copy


def test_the_fingerprint_sees_what_reaches_the_database() -> None:
    tasks = conch.orchestration.tables.tasks
    base = fingerprint([tasks])
    assert fingerprint([tasks.to_metadata(sa.MetaData())]) == base
    assert fingerprint([_changed(tasks, sa.Column("x", sa.Integer))]) != base
    nullable = _changed(tasks)
    nullable.c.goal.nullable = True
    assert fingerprint([nullable]) != base
    defaulted = _changed(tasks)
    defaulted.c.max_steps.server_default = sa.DefaultClause("5")
    assert fingerprint([defaulted]) != base
    indexed = _changed(tasks)
    sa.Index("ix_orch_tasks_agent", indexed.c.agent)
    assert fingerprint([indexed]) != base
    agents = conch.marketplace.tables.agents
    longer = _changed(agents)
    longer.c.name.type = sa.String(65)
    assert fingerprint([longer]) != fingerprint([agents])


def test_a_migration_refuses_tables_that_moved_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adding a column to ``marketplace_agents`` without restating 0003 stops a fresh database
    from being made with it (instead of 0003 silently creating the new column). (0002 was
    restated when 0004 changed the orchestration tables.)"""
    agents = conch.marketplace.tables.agents
    monkeypatch.setattr(
        conch.marketplace.tables, "agents", _changed(agents, sa.Column("x", sa.Integer))
    )
    eng = db.create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with pytest.raises(RuntimeError, match=r"0003_marketplace creates .*marketplace_agents"):
            db.migrate(eng)
    finally:
        eng.dispose()
