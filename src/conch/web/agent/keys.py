"""Keys, usage and the audit log: ``/api/v1/keys[/{id}[/rotate]]``, ``/api/v1/usage``,
``/api/v1/audit`` (docs/security.md).

The keys and the audit log are the admin's (no declaration names them: admin-only); usage is
any key's own, and any key's for the admin (``?key=``). The routes validate, call the keys
room (:class:`~conch.web.common.auth.KeyAccess`: the service, the limiter, the audit log) and
shape the answer; the keys room's errors carry their status and the field at fault.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import Response

from conch.errors import Forbidden, Invalid
from conch.keys import Principal
from conch.keys.records import ADMIN_KEY_ID
from conch.web.agent.session_access import disk_used
from conch.web.common.auth import KeyAccess, PrincipalDep
from conch.web.common.deps import state_getter
from conch.web.common.responses import json_response

router = APIRouter(tags=["keys"])

AccessDep = Annotated[KeyAccess, Depends(state_getter("access", KeyAccess))]

CREATE_FIELDS = ("name", "tenant", "scopes", "limits", "models", "expires_at")

_KEY = {
    "id": "key_0123456789abcdef",
    "name": "ci",
    "tenant": "acme",
    "scopes": ["execute", "inference"],
    "limits": {"requests_per_minute": 60, "tokens_per_day": 100000},
    "models": ["local:*"],
    "prefix": "ck-AbCd1234",
    "status": "active",
    "expires_at": None,
    "created_at": "2026-01-01T00:00:00.000Z",
    "updated_at": "2026-01-01T00:00:00.000Z",
    "revoked_at": None,
    "created_by": "admin",
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "A bad field: `error.where` names it."},
    401: {"description": "No key, or an unknown, revoked or expired one."},
    403: {"description": "Not the admin (`missing_scope`)."},
}


def _doc(example: Any, description: str, status: int = 200, body: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "responses": {
            status: {"description": description, "content": {"application/json": {"example": example}}},
            **_ERRORS,
        }
    }
    if body is not None:
        out["openapi_extra"] = {
            "requestBody": {
                "content": {"application/json": {"schema": {"type": "object", "description": body}}}
            }
        }
    return out


async def _object(request: Request, allowed: tuple[str, ...]) -> dict[str, Any]:
    """The JSON object body; a field not in ``allowed`` is a ``400`` naming it."""
    raw = await request.body()
    try:
        body = json.loads(raw or b"null")
    except ValueError as exc:
        raise Invalid(f"body: not JSON ({exc})", where="body") from None
    if not isinstance(body, dict):
        raise Invalid("body: a JSON object is required", where="body")
    for field in body:
        if field not in allowed:
            raise Invalid(f"unknown field '{field}'; the fields are {', '.join(allowed)}", where=field)
    return body


@router.post(
    "/api/v1/keys",
    status_code=201,
    **_doc(
        {**_KEY, "secret": "ck-…"},
        "The key, with its `secret`: shown this once (only a hash is stored).",
        201,
        "{name, tenant?, scopes, limits?, models?, expires_at?}",
    ),
)
async def create_key(request: Request, access: AccessDep, principal: PrincipalDep) -> Response:
    """Create a key `{name, tenant?, scopes, limits?, models?, expires_at?}`."""
    body = await _object(request, CREATE_FIELDS)
    if "name" not in body:
        raise Invalid("name is required", where="name")
    if "scopes" not in body:
        raise Invalid("scopes is required (a list, possibly empty)", where="scopes")
    issued = await access.db(
        access.keys.create,
        name=body["name"],
        scopes=body["scopes"],
        tenant=body.get("tenant"),
        limits=body.get("limits"),
        models=body.get("models"),
        expires_at=body.get("expires_at"),
        actor=principal,
    )
    return json_response(issued.to_dict(), 201)


@router.get("/api/v1/keys", **_doc([_KEY], "Keys, oldest first (bare array; never a secret)."))
async def list_keys(
    access: AccessDep,
    tenant: str | None = Query(default=None, description="Only this tenant's keys."),
    include_revoked: bool = Query(default=True),
    limit: int = Query(default=100, ge=1, le=500),
    offset: int = Query(default=0, ge=0),
) -> Response:
    kwargs: dict[str, Any] = {"include_revoked": include_revoked, "limit": limit, "offset": offset}
    if tenant is not None:
        kwargs["tenant"] = tenant
    records = await access.db(access.keys.list, **kwargs)
    return json_response([r.to_dict() for r in records])


@router.get("/api/v1/keys/{key_id}", **_doc(_KEY, "The key."))
async def get_key(key_id: str, access: AccessDep) -> Response:
    return json_response((await access.db(access.keys.get, key_id)).to_dict())


@router.patch(
    "/api/v1/keys/{key_id}",
    **_doc(
        _KEY,
        "The key as changed.",
        body="{name?, scopes?, limits? (merged: a limit set to null is removed), models?, "
        "expires_at?}",
    ),
)
async def patch_key(
    key_id: str, request: Request, access: AccessDep, principal: PrincipalDep
) -> Response:
    """Change a key's `name`, `scopes`, `limits` (a JSON merge patch), `models` or
    `expires_at`; every server applies it within a second."""
    body = await _object(request, ("name", "scopes", "limits", "models", "expires_at"))
    record = await access.db(access.keys.patch, key_id, body, actor=principal)
    return json_response(record.to_dict())


@router.delete("/api/v1/keys/{key_id}", **_doc({**_KEY, "status": "revoked"}, "The key, revoked."))
async def revoke_key(key_id: str, access: AccessDep, principal: PrincipalDep) -> Response:
    """Revoke a key for good; every server refuses it within a second."""
    return json_response((await access.db(access.keys.revoke, key_id, actor=principal)).to_dict())


@router.post(
    "/api/v1/keys/{key_id}/rotate",
    **_doc({**_KEY, "secret": "ck-…"}, "The key with its new `secret` (shown this once)."),
)
async def rotate_key(key_id: str, access: AccessDep, principal: PrincipalDep) -> Response:
    """A new secret for the key; the old one stops working. Its limits and usage windows
    stay as they were."""
    issued = await access.db(access.keys.rotate, key_id, actor=principal)
    return json_response(issued.to_dict())


# -- usage ---------------------------------------------------------------------------------

_USAGE = {
    "key": {"id": "key_0123456789abcdef", "name": "ci", "tenant": "acme"},
    "scopes": ["execute", "inference"],
    "admin": False,
    "open": False,
    "limits": [
        {"limit": "tokens_per_day", "max": 100000, "used": 5120, "remaining": 94880,
         "window_s": 86400.0, "resets_at": "2026-01-02T00:00:00.000Z"},
    ],
}  # fmt: skip


async def usage_of(access: AccessDep, principal: Principal, key: str | None) -> dict[str, Any]:
    """What :func:`usage` answers (the CLI shares it through the same service)."""
    if key is not None and key != principal.key_id:
        if not principal.is_admin:
            raise Forbidden("only the admin reads another key's usage", where="key")
        if key == ADMIN_KEY_ID:
            target = principal
        else:
            target = (await access.db(access.keys.get, key)).principal()
    else:
        target = principal
    disk = await access.db(disk_used, access, target)
    limits = await access.db(access.limiter.usage, target, disk_used_bytes=disk)
    return {
        "key": {"id": target.key_id, "name": target.name, "tenant": target.tenant},
        # What the key may do, so that a client (the studio) shows only that.
        "scopes": sorted(target.scopes),
        "admin": target.is_admin,
        # The server needs no key (no admin key, loopback): a request without one is the admin.
        "open": access.open,
        "limits": [u.to_dict() for u in limits],
    }


@router.get("/api/v1/usage", **_doc(_USAGE, "Each limit of the key: max, used, remaining, "
                                              "its window and when it resets."))
async def usage(
    access: AccessDep,
    principal: PrincipalDep,
    key: str | None = Query(default=None, description="Another key's id (the admin only)."),
) -> Response:
    """The calling key's usage against each of its limits (`?key=<id>`: any key's, for the
    admin), with its `scopes`, whether it is an `admin`, and whether the server is `open`
    (needs no key). A key without limits has none to show."""
    return json_response(await usage_of(access, principal, key))


# -- the audit log -------------------------------------------------------------------------

_AUDIT = {
    "entries": [
        {"id": 42, "at": "2026-01-01T00:00:00.000Z",
         "actor": {"id": "admin", "name": "admin", "tenant": None},
         "action": "key.created", "target": "key:key_0123456789abcdef",
         "details": {"name": "ci", "scopes": ["execute"]}},
    ],
    "next_before": 41,
}  # fmt: skip


@router.get("/api/v1/audit", **_doc(_AUDIT, "Entries newest first; pass `next_before` as "
                                              "`before` for the next page (null: the last)."))
async def audit(
    access: AccessDep,
    action: str | None = Query(default=None, description="key.created, approval.decided, …"),
    actor: str | None = Query(default=None, description="The acting key's id."),
    tenant: str | None = Query(default=None),
    target: str | None = Query(default=None, description="Exact, or a prefix ending in `*`."),
    since: str | None = Query(default=None, description="ISO-8601 or Unix seconds."),
    until: str | None = Query(default=None, description="ISO-8601 or Unix seconds."),
    before: int | None = Query(default=None, ge=1, description="An entry id (the page after)."),
    limit: int = Query(default=50, ge=1, le=500),
) -> Response:
    """The append-only audit log: keys created, changed, rotated and revoked; approvals
    decided; marketplace publishes; model pulls and deletes."""
    page = await access.db(
        access.audit.read,
        action=action,
        actor_id=actor,
        tenant=tenant,
        target=target,
        since=since,
        until=until,
        before=before,
        limit=limit,
    )
    return json_response(page.to_dict())
