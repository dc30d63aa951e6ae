"""Keys on a real database: a fresh SQLite file per test, services built on it, and a clock a
test can move (the limiter's and the service's ``clock`` parameter) so that sliding windows
and expiry are tested at exact instants without waiting for them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from conch import db
from conch.keys import AuditLog, KeyService, Limiter


class Clock:
    """A settable clock: ``clock()`` is the time; ``advance(s)`` moves it."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Room:
    engine: sa.Engine
    keys: KeyService
    limiter: Limiter
    audit: AuditLog
    clock: Clock


def make_room(engine: sa.Engine, clock: Clock | None = None, **kwargs: object) -> Room:
    clock = clock or Clock()
    audit = AuditLog(engine, clock=clock)
    keys = KeyService(engine, audit=audit, clock=clock, **kwargs)  # type: ignore[arg-type]
    return Room(engine, keys, Limiter(engine, clock=clock), audit, clock)


@pytest.fixture()
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'conch.db'}"


@pytest.fixture()
def engine(sqlite_url: str) -> Iterator[sa.Engine]:
    eng = db.create_engine(sqlite_url)
    db.migrate(eng)
    yield eng
    eng.dispose()


@pytest.fixture()
def room(engine: sa.Engine) -> Room:
    return make_room(engine, admin_keys=["the-admin-key", None])


class StatementCounter:
    """Counts the statements an engine sends to its database."""

    def __init__(self, engine: sa.Engine) -> None:
        self.count = 0
        self.engine = engine
        sa.event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *_args: object) -> None:
        self.count += 1

    def close(self) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._seen)
