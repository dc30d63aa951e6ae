"""Keys: API keys, their usage windows and leases, and the append-only audit log.

The audit log's append-only rule is kept by the database itself: triggers refuse ``UPDATE``
and ``DELETE`` (and, on PostgreSQL, ``TRUNCATE``) of ``audit_log``. They are written out
below, per database, as triggers are not part of ``tables.py``.
"""

from __future__ import annotations

from alembic import op

from conch.keys import tables as t
from conch.migrations.snapshot import create_tables, drop_tables

revision = "0007_keys"
down_revision = "0001_baseline"
branch_labels = ("keys",)
depends_on = None

# The keys tables are still those of this revision (conch.migrations.snapshot says why that
# is enough, and what to do when one changes).
TABLES = [t.api_keys, t.key_usage, t.key_events, t.key_leases, t.audit_log]
MESSAGE = "audit_log is append-only"


def upgrade() -> None:
    create_tables(revision, TABLES, "9539363901c6b0fa")
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        for event in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER audit_log_no_{event.lower()} BEFORE {event} ON audit_log "
                f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
            )
    elif dialect == "postgresql":
        op.execute(
            "CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{MESSAGE}'; END $$"
        )
        op.execute(
            "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
            "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()"
        )
        op.execute(
            "CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log "
            "FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()"
        )


def downgrade() -> None:
    # Dropping a table drops its triggers.
    drop_tables(TABLES)
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS audit_log_append_only()")
