"""Every read and write of the ``sessions`` table (synchronous SQLAlchemy Core; async callers
run these on a worker thread).

Tenants. A session belongs to the tenant it was made for (``None`` when made without one).
Readers pass the caller's tenant: a session of another tenant reads as not found, never as
forbidden, so ids cannot be probed. ``tenant=None`` reads every session (the admin).

Leases. Two servers must never run one session at once: its state and files would diverge.
A server that runs a session holds it, ``lease_owner`` (the server instance's id) until
``lease_expires_at``, and renews that while it keeps the session warm (:meth:`renew_all`,
from a heartbeat). :meth:`acquire` is one conditional ``UPDATE … RETURNING``: it takes the
lease only where nobody holds it, this server does, or the holder's lease ran out (the holder
died). On PostgreSQL a concurrent ``UPDATE`` of the same row waits for the first to commit and
then re-checks the condition against the row as committed, so of two servers exactly one
gets it; SQLite has one writer at a time. This is how the orchestration store leases tasks
and workflow steps, and the lease lasts ``orchestration_lease_s`` there too.

Expiry and deletion. ``expires_at`` is ``last_used_at + ttl_s`` and moves with every use
(:meth:`touch`, :meth:`record_run`). A deleted or expired session is first marked
``deleting`` (invisible to every reader, and a holder's next renewal fails, which tells it to
stop), then its files are removed, then its row (:meth:`purge`): a server that dies between
the steps leaves a ``deleting`` row that the next sweep finishes, never files without a row
that nobody would remove. A session held by a live lease does not expire (a run longer than
its TTL is still a use).
"""

from __future__ import annotations

import builtins
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from conch.sessions.errors import LeaseLost, SessionBusy, SessionNotFound
from conch.sessions.records import Session, iso
from conch.sessions.tables import ACTIVE, DELETING, LIVE, PAUSED, sessions

_S = sessions
_c = _S.c


def new_id() -> str:
    """A session id: 96 random bits, which also name its directory."""
    return "sess_" + secrets.token_hex(12)


def _now(now: float | None) -> float:
    return time.time() if now is None else now


def _unheld(now: float) -> Any:
    """No live server holds the lease."""
    return sa.or_(
        _c.lease_owner.is_(None), _c.lease_expires_at.is_(None), _c.lease_expires_at <= now
    )


def _free_or(owner: Any) -> Any:
    """Nobody holds the lease, ``owner`` does, or the holder's lease ran out."""
    return sa.or_(
        _c.lease_owner.is_(None),
        _c.lease_owner == owner,
        _c.lease_expires_at.is_(None),
        _c.lease_expires_at <= sa.bindparam("now", type_=sa.Float),
    )


class _Q:
    """The statements of a run's path (acquire, record, renew, release), built once: building
    a Core statement and its cache key costs more than SQLite takes to run it."""

    now = sa.bindparam("now", type_=sa.Float)
    live = _c.status.in_(LIVE)
    acquire = (
        sa.update(_S)
        .where(
            _c.id == sa.bindparam("k_id"), live, _free_or(sa.bindparam("owner", type_=sa.String))
        )
        .values(
            lease_owner=sa.bindparam("owner", type_=sa.String),
            lease_expires_at=sa.bindparam("until", type_=sa.Float),
            # Held by a server: it has (or is about to have) a worker, so it is not paused.
            status=ACTIVE,
        )
        .returning(*_S.c)
    )
    renew = (
        sa.update(_S)
        .where(_c.id == sa.bindparam("k_id"), live, _c.lease_owner == sa.bindparam("owner"))
        .values(lease_expires_at=sa.bindparam("until", type_=sa.Float))
    )
    renew_all = (
        sa.update(_S)
        .where(live, _c.lease_owner == sa.bindparam("owner"))
        .values(lease_expires_at=sa.bindparam("until", type_=sa.Float))
        .returning(_c.id)
    )
    release = (
        sa.update(_S)
        .where(_c.id == sa.bindparam("k_id"), _c.lease_owner == sa.bindparam("owner"))
        .values(lease_owner=None, lease_expires_at=None)
    )
    touch = (
        sa.update(_S)
        .where(_c.id == sa.bindparam("k_id"), live)
        .values(last_used_at=now, expires_at=now + _c.ttl_s)
        .returning(*_S.c)
    )
    get = sa.select(_S).where(_c.id == sa.bindparam("k_id"), live)
    record_run = (
        sa.update(_S)
        .where(_c.id == sa.bindparam("k_id"), live, _c.lease_owner == sa.bindparam("owner"))
        .values(
            runs=_c.runs + sa.bindparam("n", type_=sa.Integer),
            last_used_at=now,
            expires_at=now + _c.ttl_s,
            status=ACTIVE,
            state_version=_c.state_version + sa.bindparam("bump", type_=sa.Integer),
            workspace_bytes=sa.func.coalesce(
                sa.bindparam("wb", type_=sa.BigInteger), _c.workspace_bytes
            ),
            lease_expires_at=sa.func.coalesce(
                sa.bindparam("until", type_=sa.Float), _c.lease_expires_at
            ),
        )
        .returning(*_S.c)
    )


class SessionStore:
    """The sessions table of one database (see the module doc for tenants, leases, expiry)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.postgres = engine.dialect.name == "postgresql"
        # SQLite has one writer at a time anyway; this keeps this process's writers queueing
        # here rather than in SQLite's busy handler.
        self._lock = threading.Lock() if not self.postgres else None

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        if self._lock is None:
            with self.engine.begin() as conn:
                yield conn
            return
        with self._lock, self.engine.begin() as conn:
            yield conn

    # -- create and read --------------------------------------------------------------------

    def create(
        self,
        *,
        ttl_s: float,
        limits: Mapping[str, Any],
        allow_network: bool,
        allow_process: bool,
        tenant: str | None = None,
        id: str | None = None,
        now: float | None = None,
    ) -> Session:
        """Record a new, active session (the caller has validated its TTL, limits and
        permissions: :mod:`conch.sessions.limits`)."""
        now = _now(now)
        row = {
            "id": id or new_id(),
            "tenant": tenant,
            "status": ACTIVE,
            "created_at": now,
            "last_used_at": now,
            "expires_at": now + ttl_s,
            "ttl_s": float(ttl_s),
            "limits": dict(limits),
            "allow_network": bool(allow_network),
            "allow_process": bool(allow_process),
            "workspace_bytes": 0,
            "runs": 0,
            "state_version": 0,
            "lease_owner": None,
            "lease_expires_at": None,
        }
        with self.tx() as conn:
            conn.execute(sa.insert(_S).values(**row))
        return Session(**row)  # type: ignore[arg-type]

    def find(self, id: str, *, tenant: str | None = None) -> Session | None:
        """The session ``id`` if it exists and ``tenant`` may see it (None: any tenant)."""
        with self.engine.connect() as conn:
            row = conn.execute(_Q.get, {"k_id": id}).first()
        if row is None or (tenant is not None and row.tenant != tenant):
            return None
        return Session.from_row(row)

    def get(self, id: str, *, tenant: str | None = None) -> Session:
        """As :meth:`find`, but ``SessionNotFound`` instead of None."""
        got = self.find(id, tenant=tenant)
        if got is None:
            raise SessionNotFound(f"no session {id!r}", where="session")
        return got

    def list(
        self,
        *,
        tenant: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> builtins.list[Session]:
        """Sessions ``tenant`` may see (None: all), newest first (ties by id, so pages never
        overlap), optionally only those with ``status`` (active | paused)."""
        q = sa.select(_S).where(_c.status.in_(LIVE))
        if tenant is not None:
            q = q.where(_c.tenant == tenant)
        if status is not None:
            q = q.where(_c.status == status)
        q = q.order_by(_c.created_at.desc(), _c.id).limit(limit).offset(offset)
        with self.engine.connect() as conn:
            return [Session.from_row(r) for r in conn.execute(q).all()]

    def count(self, *, tenant: str | None = None) -> int:
        q = sa.select(sa.func.count()).select_from(_S).where(_c.status.in_(LIVE))
        if tenant is not None:
            q = q.where(_c.tenant == tenant)
        with self.engine.connect() as conn:
            return int(conn.execute(q).scalar_one())

    # -- use --------------------------------------------------------------------------------

    def touch(self, id: str, *, now: float | None = None) -> Session:
        """A use of the session (a file read or written): ``last_used_at`` is now and
        ``expires_at`` moves to now + ``ttl_s``. ``SessionNotFound`` if it is gone."""
        with self.tx() as conn:
            row = conn.execute(_Q.touch, {"k_id": id, "now": _now(now)}).first()
        if row is None:
            raise SessionNotFound(f"no session {id!r}", where="session")
        return Session.from_row(row)

    def record_run(
        self,
        id: str,
        owner: str,
        *,
        saved: bool = False,
        workspace_bytes: int | None = None,
        lease_s: float | None = None,
        now: float | None = None,
        runs: int = 1,
        saves: int | None = None,
    ) -> Session:
        """A run of the session completed on ``owner``'s server: ``runs`` + 1, used now,
        active; ``saved``: it saved bindings (``state_version`` + 1); ``lease_s``: the lease
        is extended too. Refused unless ``owner`` still holds the lease: ``LeaseLost`` (another
        server took it over), ``SessionNotFound`` (deleted or expired meanwhile).

        Several runs at once (a server that records its runs in batches): ``runs`` of them,
        ``saves`` of which saved bindings, the last ending at ``now``."""
        now = _now(now)
        params = {
            "k_id": id,
            "owner": owner,
            "now": now,
            "n": runs,
            "bump": saves if saves is not None else (1 if saved else 0),
            "wb": workspace_bytes,
            "until": None if lease_s is None else now + lease_s,
        }
        with self.tx() as conn:
            row = conn.execute(_Q.record_run, params).first()
        if row is None:
            self._lost(id, owner)
        return Session.from_row(row)

    def set_workspace_bytes(self, id: str, n: int) -> None:
        """The size of the session's files as last measured (answers show it)."""
        with self.tx() as conn:
            conn.execute(
                sa.update(_S).where(_c.id == id, _c.status.in_(LIVE)).values(workspace_bytes=n)
            )

    def mark_paused(
        self, id: str, *, owner: str | None = None, now: float | None = None
    ) -> Session:
        """The session is paused (no process holds it; its state is on disk), and the lease,
        if ``owner`` held it, is released. ``SessionBusy`` if another live server holds it
        (that server must pause it: it has the process); ``SessionNotFound``."""
        now = _now(now)
        held = sa.and_(_c.lease_owner.is_not(None), _c.lease_owner == owner)
        with self.tx() as conn:
            row = conn.execute(
                sa.update(_S)
                .where(_c.id == id, _c.status.in_(LIVE), _free_or(owner))
                .values(
                    status=PAUSED,
                    lease_owner=sa.case((held, None), else_=_c.lease_owner),
                    lease_expires_at=sa.case((held, None), else_=_c.lease_expires_at),
                )
                .returning(*_S.c),
                {"now": now},
            ).first()
        if row is None:
            self._busy_or_missing(id, owner, now)
        return Session.from_row(row)

    # -- deletion and expiry ----------------------------------------------------------------

    def mark_deleting(self, id: str, *, tenant: str | None = None) -> Session:
        """Delete the session as far as every reader is concerned (its files and row go next:
        :meth:`purge`). A server holding it learns at its next renewal. ``SessionNotFound``
        if there is no such session for ``tenant``."""
        cond = [_c.id == id, _c.status.in_(LIVE)]
        if tenant is not None:
            cond.append(_c.tenant == tenant)
        with self.tx() as conn:
            row = conn.execute(
                sa.update(_S).where(*cond).values(status=DELETING).returning(*_S.c)
            ).first()
        if row is None:
            raise SessionNotFound(f"no session {id!r}", where="session")
        return Session.from_row(row)

    def pause_abandoned(self, idle_s: float, *, now: float | None = None) -> int:
        """Mark ``paused`` the active sessions that no live server holds and nobody used for
        ``idle_s`` (a server that held one died before it paused it); how many."""
        now = _now(now)
        with self.tx() as conn:
            return int(conn.execute(
                sa.update(_S)
                .where(_c.status == ACTIVE, _c.last_used_at <= now - idle_s, _unheld(now))
                .values(status=PAUSED)
            ).rowcount)

    def list_expired(self, *, now: float | None = None, limit: int = 100) -> builtins.list[Session]:
        """Sessions past their ``expires_at`` that no live server holds, oldest expiry first."""
        now = _now(now)
        q = (
            sa.select(_S)
            .where(_c.status.in_(LIVE), _c.expires_at <= now, _unheld(now))
            .order_by(_c.expires_at, _c.id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [Session.from_row(r) for r in conn.execute(q).all()]

    def expire(self, id: str, *, now: float | None = None) -> bool:
        """Mark an expired session ``deleting``; False if it is not expired any more (used
        meanwhile, on any server) or a live server holds it."""
        now = _now(now)
        with self.tx() as conn:
            done = conn.execute(
                sa.update(_S)
                .where(_c.id == id, _c.status.in_(LIVE), _c.expires_at <= now, _unheld(now))
                .values(status=DELETING)
            ).rowcount
        return done > 0

    def list_deleting(self, *, limit: int = 100) -> builtins.list[str]:
        """Ids of sessions marked ``deleting`` whose files and row are still to be removed."""
        q = sa.select(_c.id).where(_c.status == DELETING).order_by(_c.id).limit(limit)
        with self.engine.connect() as conn:
            return [r.id for r in conn.execute(q).all()]

    def existing(self, ids: Iterable[str]) -> set[str]:
        """Which of ``ids`` have a row, whatever its status (to tell orphan directories)."""
        ids = builtins.list(ids)
        out: set[str] = set()
        with self.engine.connect() as conn:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                out.update(r.id for r in conn.execute(sa.select(_c.id).where(_c.id.in_(chunk))))
        return out

    def purge(self, id: str) -> bool:
        """Remove the row of a ``deleting`` session (once its files are gone)."""
        with self.tx() as conn:
            return (
                conn.execute(sa.delete(_S).where(_c.id == id, _c.status == DELETING)).rowcount > 0
            )

    # -- leases -----------------------------------------------------------------------------

    def acquire(
        self,
        id: str,
        owner: str,
        lease_s: float,
        *,
        tenant: str | None = None,
        now: float | None = None,
    ) -> Session:
        """Hold the session for ``owner`` until now + ``lease_s`` (taken if free, expired or
        ``owner``'s already; atomic on SQLite and PostgreSQL). ``SessionBusy`` (409, with
        ``Retry-After``) if another live server holds it, ``SessionNotFound`` if there is no
        such session for ``tenant``."""
        if not owner:
            raise ValueError("a lease needs an owner")
        now = _now(now)
        with self.tx() as conn:
            row = conn.execute(
                _Q.acquire, {"k_id": id, "owner": owner, "until": now + lease_s, "now": now}
            ).first()
            if row is not None and tenant is not None and row.tenant != tenant:
                # Another tenant's session: raising here rolls the take back; answer as if absent.
                raise SessionNotFound(f"no session {id!r}", where="session")
        if row is None:
            self._busy_or_missing(id, owner, now, tenant=tenant)
        return Session.from_row(row)

    def renew(self, id: str, owner: str, lease_s: float, *, now: float | None = None) -> bool:
        """Extend ``owner``'s lease; False if it no longer holds it (taken over, or the
        session was deleted or expired): the caller must stop running the session."""
        with self.tx() as conn:
            done = conn.execute(
                _Q.renew, {"k_id": id, "owner": owner, "until": _now(now) + lease_s}
            ).rowcount
        return done > 0

    def renew_all(self, owner: str, lease_s: float, *, now: float | None = None) -> set[str]:
        """Extend every lease ``owner`` holds (a server's heartbeat); the ids renewed. A
        session the server thinks it holds that is not among them was lost."""
        with self.tx() as conn:
            rows = conn.execute(_Q.renew_all, {"owner": owner, "until": _now(now) + lease_s})
            return {r.id for r in rows}

    def release(self, id: str, owner: str) -> bool:
        """Give the lease back (the session's worker ended); False if ``owner`` did not hold it."""
        with self.tx() as conn:
            return conn.execute(_Q.release, {"k_id": id, "owner": owner}).rowcount > 0

    def holder(self, id: str, *, now: float | None = None) -> tuple[str, float] | None:
        """``(owner, lease_expires_at)`` of the live server holding the session, if any."""
        got = self.find(id)
        now = _now(now)
        if got is None or got.lease_owner is None or got.lease_expires_at is None:
            return None
        if got.lease_expires_at <= now:
            return None
        return got.lease_owner, got.lease_expires_at

    # -- why an update found no row ---------------------------------------------------------

    def _busy_or_missing(
        self, id: str, owner: str | None, now: float, *, tenant: str | None = None
    ) -> Any:
        got = self.find(id, tenant=tenant)
        if got is None:
            raise SessionNotFound(f"no session {id!r}", where="session")
        if got.held_by_other(owner, now):
            assert got.lease_owner is not None and got.lease_expires_at is not None
            raise SessionBusy(
                f"session {id!r} is running on another server (instance {got.lease_owner}) "
                f"until {iso(got.lease_expires_at)} at the latest",
                owner=got.lease_owner,
                until=got.lease_expires_at,
                retry_after=got.lease_expires_at - now,
            )
        # Freed between the update and this read: the caller may simply try again.
        raise SessionBusy(
            f"session {id!r} changed hands while this server asked for it; try again",
            owner="", until=now, retry_after=0.0,
        )  # fmt: skip

    def _lost(self, id: str, owner: str) -> Any:
        got = self.find(id)
        if got is None:
            raise SessionNotFound(f"session {id!r} was deleted while it ran", where="session")
        raise LeaseLost(
            f"session {id!r}: this server's lease ran out and "
            + (f"instance {got.lease_owner} took it over" if got.lease_owner else "was released")
            + "; the run's outcome is not recorded"
        )
