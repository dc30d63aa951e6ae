"""Alembic environment: conch always runs migrations on a connection it opened itself."""

from __future__ import annotations

from alembic import context

from conch import db

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=db.metadata)
with context.begin_transaction():
    context.run_migrations()
