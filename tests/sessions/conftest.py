"""Fixtures: a migrated SQLite database, settings and a session service over a temporary
data directory (real SQLite, real files)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from conch import db
from conch.config import Settings
from conch.sessions.service import SessionService
from conch.sessions.store import SessionStore


def migrated(url: str) -> sa.Engine:
    eng = db.create_engine(url)
    db.migrate(eng)
    return eng


@pytest.fixture()
def engine(tmp_path: Path) -> Iterator[sa.Engine]:
    eng = migrated(f"sqlite:///{tmp_path / 'conch.db'}")
    yield eng
    eng.dispose()


@pytest.fixture()
def store(engine: sa.Engine) -> SessionStore:
    return SessionStore(engine)


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", session_disk_mb=2, session_upload_mb=1)


@pytest.fixture()
def service(engine: sa.Engine, settings: Settings) -> SessionService:
    return SessionService.from_settings(settings, engine)
