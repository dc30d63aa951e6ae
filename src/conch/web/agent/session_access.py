"""What the sessions routes ask of the request's key: whose sessions it sees, whether it may
open one more (``sessions_max``), whether its files may grow (``disk_mb``).

The sessions router calls these (docs/security.md, "Sessions"):

- :func:`session_tenant`: ``(owner, reads)``: a new session's ``tenant`` is ``owner``; every
  read, change or deletion passes ``reads`` as the sessions service's ``tenant`` (``None``
  for the admin: every tenant's; never ``None`` for another key);
- :func:`admit_session` once a session is made (a refusal: delete it and let the ``429``
  go), :func:`release_session` once one is deleted;
- :func:`check_upload` (or :func:`check_disk`) before a file is written (``429
  insufficient_quota`` naming ``disk_mb``).

``sessions_max`` is counted with a lease per session, named by the session's id, taken
atomically with the check (two servers cannot both open the last one); a session deleted
without :func:`release_session` (expired and swept) stops counting at the key's next
admission, which drops the leases of sessions that no longer exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import sqlalchemy as sa
from fastapi import Request

from conch.keys import Principal
from conch.web.common.auth import ACCESS, KeyAccess, principal_of


def session_tenant(request: Request) -> tuple[str | None, str | None]:
    """``(owner, reads)`` of the request's key: the tenant a session it makes belongs to, and
    the ``tenant`` its reads pass (``None``: every tenant's, the admin)."""
    principal = principal_of(request)
    return principal.owner, principal.reads


def _access(request: Request) -> KeyAccess | None:
    access: KeyAccess | None = request.scope.get(ACCESS)
    return access


async def admit_session(
    request: Request, session_id: str, existing: Callable[[list[str]], Iterable[str]]
) -> None:
    """Count session ``session_id`` against the key's ``sessions_max`` (``429`` when it has
    as many open as it may). ``existing(ids)``: those of the ids that are still sessions
    (``SessionStore.existing``), so that sessions deleted behind the key's back stop
    counting."""
    access = _access(request)
    if access is None:
        return
    principal = principal_of(request)
    if principal.limits.sessions_max is None:
        return
    held = await access.db(access.limiter.session_leases, principal)
    if held:
        live = set(existing(held))
        for gone in (h for h in held if h not in live and h != session_id):
            await access.db(access.limiter.release, gone)
    await access.admit(principal, requests=0, session=True, lease_id=session_id)


async def release_session(request: Request, session_id: str) -> None:
    """The session is gone: it no longer counts against its key's ``sessions_max``."""
    access = _access(request)
    if access is not None:
        await access.db(access.limiter.release, session_id)


def check_disk(request: Request, used_bytes: int, adding_bytes: int) -> None:
    """Refuse (``429 insufficient_quota``, ``disk_mb``) writing ``adding_bytes`` more where
    the key's tenant's sessions already take ``used_bytes``."""
    access = _access(request)
    if access is not None:
        access.limiter.check_disk(principal_of(request), used_bytes, adding_bytes)


async def check_upload(request: Request, adding_bytes: int) -> None:
    """:func:`check_disk` with what the key's tenant's sessions take now (nothing to check
    without a ``disk_mb`` limit)."""
    access = _access(request)
    if access is None:
        return
    principal = principal_of(request)
    used = await access.db(disk_used, access, principal)
    if used is not None:
        access.limiter.check_disk(principal, used, adding_bytes)


def disk_used(access: KeyAccess, principal: Principal) -> int | None:
    """What the sessions of ``principal``'s tenant take on disk, as last measured (the
    sessions table's ``workspace_bytes``); ``None`` without a ``disk_mb`` limit."""
    if principal.limits.disk_mb is None:
        return None
    from conch.sessions.tables import sessions

    q = sa.select(sa.func.coalesce(sa.func.sum(sessions.c.workspace_bytes), 0))
    owner = principal.owner
    q = q.where(sessions.c.tenant.is_(None) if owner is None else sessions.c.tenant == owner)
    with access.keys.engine.connect() as conn:
        return int(conn.execute(q).scalar_one())
