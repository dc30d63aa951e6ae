"""Chats: the studio's chats on the server (conch.chats.tables), and their search index.

A domain branch of its own from the baseline. The search index is not a table of
``tables.py``: on SQLite an FTS5 table over ``title`` and ``search_text`` with ``chats`` as
its external content (so the text is stored once), kept in step by triggers; on PostgreSQL
a GIN index of the English ``tsvector`` of ``search_text``.
"""

from __future__ import annotations

from alembic import op

from conch.chats import tables as t
from conch.migrations.snapshot import create_tables, drop_tables

revision = "0008_chats"
down_revision = "0001_baseline"
branch_labels = ("chats",)
depends_on = None

# The chats table is still that of this revision (conch.migrations.snapshot says why that is
# enough, and what to do when it changes).
TABLES = [t.chats]

_FTS_ROW = "new.rowid, new.title, new.search_text"
_FTS_DELETE = "INSERT INTO chats_fts(chats_fts, rowid, title, search_text) VALUES ('delete', old.rowid, old.title, old.search_text)"


def upgrade() -> None:
    create_tables(revision, TABLES, "ad2d090d7375ec17")
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.execute(
            "CREATE VIRTUAL TABLE chats_fts USING fts5(title, search_text, content='chats', "
            "content_rowid='rowid', tokenize = 'porter unicode61')"
        )
        op.execute(
            "CREATE TRIGGER chats_fts_insert AFTER INSERT ON chats BEGIN "
            f"INSERT INTO chats_fts(rowid, title, search_text) VALUES ({_FTS_ROW}); END"
        )
        op.execute(f"CREATE TRIGGER chats_fts_delete AFTER DELETE ON chats BEGIN {_FTS_DELETE}; END")
        op.execute(
            "CREATE TRIGGER chats_fts_update AFTER UPDATE OF title, search_text ON chats BEGIN "
            f"{_FTS_DELETE}; INSERT INTO chats_fts(rowid, title, search_text) VALUES ({_FTS_ROW}); END"
        )
    elif dialect == "postgresql":
        op.execute(
            "CREATE INDEX ix_chats_fts ON chats USING GIN (to_tsvector('english', search_text))"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TABLE IF EXISTS chats_fts")  # its triggers go with the chats table
    drop_tables(TABLES)
