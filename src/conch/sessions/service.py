"""Sessions as a resource: create, read, list, delete, their files and saved state, expiry.

What a route (or the CLI, or the MCP server) calls: it glues the table (:mod:`.store`), the
directories (:mod:`.layout`), the files (:mod:`.files`) and the saved bindings
(:mod:`.state`) with the server's settings. Running a session's programs (a worker bound to
it, its lease held while warm, its bindings saved after each run, paused when idle) is the
sandbox's part; this module gives it what it needs (:meth:`SessionService.state`,
:func:`conch.sessions.limits.run_limits`, the store's leases).

Order of effects, so that a server dying at any point leaves nothing that no one cleans up:
a session's directories are made before its row (a crash in between leaves an orphan
directory, which :meth:`SessionService.sweep` removes once it is an hour old); a deletion
marks the row ``deleting`` first, removes the directories, then the row (a crash in between
leaves a ``deleting`` row, which the sweep finishes).
"""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import Engine

from conch.config import Settings
from conch.sessions import limits as lim
from conch.sessions.errors import SessionMisplaced
from conch.sessions.files import SessionFiles
from conch.sessions.layout import Owner, SessionDirs
from conch.sessions.records import Session
from conch.sessions.state import SessionState
from conch.sessions.store import SessionStore, new_id

# An orphan directory (no row) younger than this may be a create under way on another server.
ORPHAN_AGE_S = 3600.0
MB = 1024 * 1024
# A saved binding larger than this is not read for a preview (parsing one of tens of MB takes
# longer than the rest of a describe).
PREVIEW_DOC_BYTES = 1024 * 1024


class SessionService:
    """The sessions of one server: ``store`` (the shared table), ``dirs`` (the shared
    ``sessions_dir``), and the settings that bound them (TTL, limits, quota, upload size)."""

    def __init__(self, store: SessionStore, dirs: SessionDirs, settings: Settings) -> None:
        self.store = store
        self.dirs = dirs
        self.settings = settings

    @classmethod
    def from_settings(
        cls, settings: Settings, engine: Engine | None = None, *, owner: Owner | None = None
    ) -> SessionService:
        """The service over ``settings``' database (or ``engine``) and ``sessions_dir``;
        ``owner``: who the sessions' programs run as (:class:`SessionDirs`)."""
        if engine is None:
            from conch import db

            engine = db.engine_for(settings.effective_database_url)
        return cls(SessionStore(engine), SessionDirs(settings.sessions_dir, owner=owner), settings)

    # -- the resource -----------------------------------------------------------------------

    def create(
        self,
        *,
        tenant: str | None = None,
        ttl_s: Any = None,
        limits: Mapping[str, Any] | None = None,
        allow_network: bool | None = None,
        allow_process: bool | None = None,
    ) -> Session:
        """A new active session: its TTL (``session_ttl_s`` when None), limits and
        permissions checked against the server's (``InvalidRequest`` naming the field), its
        directories made."""
        ttl = lim.session_ttl(ttl_s, self.settings)
        limits_ = lim.session_limits(limits, self.settings)
        net, proc = lim.session_permissions(allow_network, allow_process, self.settings)
        id = new_id()
        self.dirs.create(id)
        try:
            return self.store.create(
                id=id, tenant=tenant, ttl_s=ttl, limits=limits_, allow_network=net,
                allow_process=proc,
            )  # fmt: skip
        except BaseException:
            self.dirs.remove(id)
            raise

    def get(self, id: str, *, tenant: str | None = None) -> Session:
        """``SessionNotFound`` unless ``tenant`` (None: any) may see it."""
        self.dirs.root(id)  # an id that cannot be a session's is not found
        return self.store.get(id, tenant=tenant)

    def describe(self, id: str, *, tenant: str | None = None,
                 preview: bool = False) -> dict[str, Any]:  # fmt: skip
        """``GET /api/v1/sessions/{id}``: the session, its saved ``bindings`` (``[{name,
        type}]``; with ``preview``, each also with its ``kind``, ``mutable``, ``bytes``, a
        short ``preview`` text and ``length``, read from its saved document), its ``files``
        (the workspace root, as ``ls`` lists it), the bytes its saved state takes, and the
        quota its files live under (``disk_quota_bytes``, ``upload_max_bytes``)."""
        session = self.get(id, tenant=tenant)
        state = self.state(id)
        return {
            **session.public(),
            "bindings": state.previews(PREVIEW_DOC_BYTES) if preview else state.bindings(),
            "files": self.files_of(session).list("."),
            "state_bytes": state.size_bytes(),
            "disk_quota_bytes": self.settings.session_disk_mb * MB,
            "upload_max_bytes": self.settings.session_upload_mb * MB,
        }

    def list(
        self, *, tenant: str | None = None, status: str | None = None, limit: int = 100,
        offset: int = 0,
    ) -> list[Session]:  # fmt: skip
        return self.store.list(tenant=tenant, status=status, limit=limit, offset=offset)

    def delete(self, id: str, *, tenant: str | None = None) -> None:
        """Delete the session, its files and its saved state (a server running it learns at
        its next lease renewal and stops). ``SessionNotFound`` for ``tenant``."""
        self.dirs.root(id)
        self.store.mark_deleting(id, tenant=tenant)
        self.dirs.remove(id)
        self.store.purge(id)

    # -- files and state --------------------------------------------------------------------

    def files_of(self, session: Session) -> SessionFiles:
        """The files of ``session`` with this server's quota and upload limit."""
        return SessionFiles(
            workspace=self.dirs.workspace(session.id),
            tmp=self.dirs.tmp(session.id),
            quota_bytes=self.settings.session_disk_mb * MB,
            upload_bytes=self.settings.session_upload_mb * MB,
            owner=self.dirs.owner_of(session.id),
        )

    def files(self, id: str, *, tenant: str | None = None) -> SessionFiles:
        """The files of session ``id`` for a use of them (which moves its ``expires_at``)."""
        session = self.get(id, tenant=tenant)
        return self.files_of(self.store.touch(session.id))

    def fork(self, source: str, *, tenant: str | None = None) -> Session:
        """A new session that starts as a copy of ``source``: its TTL, limits and
        permissions, its files (links copied as links, never followed) and its saved
        bindings as of the last completed save. (A run of ``source`` in progress is not in
        the copy: what the copy holds is what a resume of ``source`` would hold.)"""
        original = self.get(source, tenant=tenant)
        if not self.dirs.exists(source):
            raise SessionMisplaced(
                f"session {source!r} is in the database, but its files are not under this "
                f"server's sessions_dir ({self.settings.sessions_dir}): servers that share a "
                "database must share sessions_dir too", where="session")
        copy = self.create(
            tenant=original.tenant, ttl_s=original.ttl_s, limits=original.limits,
            allow_network=original.allow_network, allow_process=original.allow_process,
        )  # fmt: skip
        try:
            self.dirs.copy_workspace(source, copy.id)
            snapshot = self.state(source).load(collect=False)
            if snapshot.bindings:
                self.state(copy.id).save(list(snapshot.bindings.values()))
            self.measure(copy.id)
        except BaseException:
            self.delete(copy.id)
            raise
        return self.store.get(copy.id)

    def state(self, id: str) -> SessionState:
        """The saved bindings of session ``id`` (written only by the lease holder)."""
        return SessionState(self.dirs.state(id))

    def measure(self, id: str) -> int:
        """Measure the session's files and record the figure (answers show it)."""
        session = self.store.get(id)
        n = self.files_of(session).usage()
        self.store.set_workspace_bytes(id, n)
        return n

    # -- expiry -----------------------------------------------------------------------------

    def sweep(self, *, now: float | None = None, limit: int = 100) -> dict[str, builtins.list[str]]:
        """Delete expired sessions (those no live server holds), finish deletions a dead
        server left half done, remove orphan directories; what was done, by kind."""
        now = time.time() if now is None else now
        expired = []
        for session in self.store.list_expired(now=now, limit=limit):
            if self.store.expire(session.id, now=now):
                expired.append(session.id)
        finished = []
        for id in self.store.list_deleting(limit=limit):
            self.dirs.remove(id)
            if self.store.purge(id):
                finished.append(id)
        on_disk = self.dirs.ids()
        known = self.store.existing(on_disk)
        orphans = []
        for id in on_disk:
            if id in known:
                continue
            try:
                age = now - os.stat(self.dirs.root(id)).st_mtime
            except FileNotFoundError:
                continue
            if age >= ORPHAN_AGE_S:
                self.dirs.remove(id)
                orphans.append(id)
        return {
            "expired": expired,
            "deleted": [id for id in finished if id not in expired],
            "orphans": orphans,
        }
