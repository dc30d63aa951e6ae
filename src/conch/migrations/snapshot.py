"""A migration that creates a domain's tables from the live definitions, guarded so that it
stays frozen history.

A migration that creates tables usually restates them column by column, because the live
definitions (``*/tables.py``) move on and a migration must keep creating what it created on
the day it was written. Restating is only needed once the two differ, so a creating migration
may instead call :func:`create_tables` with the live tables and the :func:`fingerprint` they
had at its revision: while they still match, the migration creates exactly them; once a table
changes, the migration refuses to run (on a fresh database, and so in every test that makes
one) and names what to do: write the revision's definitions into the migration by hand, and
the change as a new migration. The restatement appears when, and only when, it says something.

A recorded fingerprint is history like the rest of its migration: editing one to let changed
tables through would change what an old revision creates. This module is history too: a change
to what :func:`fingerprint` reads changes every recorded fingerprint, so it goes with
re-recording each, once the live tables are checked to be still those its migration created
(``tests/core/test_migrations.py`` compares fresh databases with the tables modules).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _column(col: sa.Column[Any]) -> dict[str, Any]:
    default = col.server_default
    return {
        "name": col.name,
        "type": repr(col.type),
        "nullable": col.nullable,
        "primary_key": col.primary_key,
        "autoincrement": _text(col.autoincrement),
        "server_default": _text(getattr(default, "arg", default)),
        "computed": _text(col.computed and col.computed.sqltext),
        "comment": col.comment,
        "foreign_keys": sorted(f"{fk.target_fullname} {fk.ondelete}" for fk in col.foreign_keys),
    }


def _constraint(con: sa.Constraint) -> list[Any]:
    columns = [c.name for c in getattr(con, "columns", ())]
    return [type(con).__name__, _text(con.name), columns, _text(getattr(con, "sqltext", None))]


def _index(ix: sa.Index) -> list[Any]:
    kwargs = sorted(f"{k}={v}" for k, v in ix.dialect_kwargs.items())
    return [_text(ix.name), ix.unique, [str(e) for e in ix.expressions], kwargs]


def describe(table: sa.Table) -> dict[str, Any]:
    """What ``CREATE TABLE`` (and its indexes) makes of ``table``, as plain data."""
    return {
        "name": table.name,
        "schema": table.schema,
        "comment": table.comment,
        "options": sorted(f"{k}={v}" for k, v in table.dialect_kwargs.items()),
        "columns": [_column(c) for c in table.columns],
        "constraints": sorted((_constraint(c) for c in table.constraints), key=json.dumps),
        "indexes": sorted((_index(ix) for ix in table.indexes), key=json.dumps),
    }


def fingerprint(tables: Sequence[sa.Table]) -> str:
    """A short digest of everything about ``tables`` that reaches the database."""
    data = json.dumps([describe(t) for t in tables], sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def create_tables(revision: str, tables: Sequence[sa.Table], recorded: str) -> None:
    """Create ``tables`` (in order, with their indexes) in migration ``revision``, provided
    they are still the tables of that revision (their fingerprint is ``recorded``)."""
    now = fingerprint(tables)
    if now != recorded:
        names = ", ".join(t.name for t in tables)
        raise RuntimeError(
            f"migration {revision} creates {names} as they were defined at that revision "
            f"(fingerprint {recorded}), but their definitions have changed since "
            f"(fingerprint {now}). Replace its create_tables(...) with op.create_table calls "
            "that restate the tables as they were (git log the tables module), and write the "
            "change as a new migration."
        )
    for table in tables:
        op.get_context().impl.create_table(table)


def drop_tables(tables: Sequence[sa.Table]) -> None:
    """Drop ``tables`` in reverse order (their indexes go with them)."""
    for table in reversed(tables):
        op.drop_table(table.name)


def creating(
    revision: str, tables: Sequence[sa.Table], recorded: str
) -> tuple[Callable[[], None], Callable[[], None]]:
    """``upgrade`` and ``downgrade`` of a migration that creates ``tables`` and nothing else."""

    def upgrade() -> None:
        create_tables(revision, tables, recorded)

    def downgrade() -> None:
        drop_tables(tables)

    return upgrade, downgrade
