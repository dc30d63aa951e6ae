"""Alembic migrations of conch's database (see ``conch.db``)."""
