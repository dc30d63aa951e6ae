"""``/api/v1/sessions``: sessions as a resource, and their files (docs/agent-server.md,
"Sessions"; the domain is :mod:`conch.sessions`).

    POST   /api/v1/sessions                         create: {ttl_s?, limits?, allow_network?,
                                                    allow_process?} -> 201, the session
    GET    /api/v1/sessions                         list (?status=active|paused, limit, offset)
    GET    /api/v1/sessions/{id}                    the session, its bindings and files
    DELETE /api/v1/sessions/{id}                    its files, state and row removed
    POST   /api/v1/sessions/{id}/pause              its worker ends; its state stays on disk
    GET    /api/v1/sessions/{id}/files?dir=         the entries ``ls`` gives
    PUT    /api/v1/sessions/{id}/files/{path}       the body is the file (session_upload_mb)
    GET    /api/v1/sessions/{id}/files/{path}       the file, streamed, with its content type
    DELETE /api/v1/sessions/{id}/files/{path}       as ``rm`` (?recursive=true for a directory)

Runs in a session go through the execution routes (``session`` in their bodies). A route here
validates, calls the domain (off the event loop where it touches files), and shapes the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import datetime
from email.utils import format_datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from starlette.responses import Response, StreamingResponse

from conch.sessions.errors import InvalidRequest, SessionError
from conch.sessions.files import SessionFiles
from conch.sessions.service import SessionService
from conch.web.agent.deps import SessionRuntimeDep as RuntimeDep
from conch.web.agent.deps import SessionsDep as ServiceDep
from conch.web.agent.session_access import (
    admit_session,
    check_upload,
    release_session,
    session_tenant,
)
from conch.web.common.responses import json_response

router = APIRouter(prefix="/api/v1/sessions", tags=["sessions"])

CREATE_FIELDS = ("ttl_s", "limits", "allow_network", "allow_process")
FILES_PATH = "/files/"


def tenant_of(request: Request) -> str | None:
    """The ``tenant`` the caller's reads and changes of a session pass: its API key's tenant
    (None for the admin, who sees every tenant's sessions)."""
    return session_tenant(request)[1]


def is_upload(method: str, path: str) -> bool:
    """Whether a request is a file upload, bounded by ``session_upload_mb`` rather than by
    ``max_body_bytes`` (which is for JSON bodies)."""
    return method == "PUT" and path.startswith(router.prefix + "/") and FILES_PATH in path


async def _create_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidRequest("the body must be a JSON object", where="body") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", where="body")
    for key in body:
        if key not in CREATE_FIELDS:
            raise InvalidRequest(
                f"{key} is not a field of a session; the fields are " + ", ".join(CREATE_FIELDS),
                where=str(key),
            )
    return body


_CREATE_DOC = {
    "requestBody": {
        "required": False,
        "content": {"application/json": {"schema": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "ttl_s": {"type": "number", "exclusiveMinimum": 0,
                          "description": "seconds past its last use before it is deleted "
                                         "(default session_ttl_s)"},
                "limits": {"type": "object", "description": "run limits lowering the "
                           "server's: wall_time_s, steps, recursion, output_bytes, "
                           "collection_size"},
                "allow_network": {"type": "boolean"},
                "allow_process": {"type": "boolean"},
            },
        }}},
    }
}


@router.post("", status_code=201, openapi_extra=_CREATE_DOC)
async def create_session(request: Request, service: ServiceDep, runtime: RuntimeDep) -> Response:
    """A new session: `{id, status, created_at, last_used_at, expires_at, ttl_s, limits,
    allow_network, allow_process, workspace_bytes, runs}`. It may lower the server's limits
    and permissions, never raise them (`400` naming the field)."""
    body = await _create_body(request)
    owner = session_tenant(request)[0]
    session = await runtime.db(service.create, tenant=owner, **body)
    try:
        await admit_session(request, session.id, service.store.existing)
    except BaseException:  # over the key's sessions_max: as if never made
        await runtime.delete(session.id)
        raise
    return json_response(session.public(), 201)


@router.get("")
async def list_sessions(
    request: Request,
    service: ServiceDep,
    runtime: RuntimeDep,
    status: Annotated[str | None, Query(pattern="^(active|paused)$")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> Response:
    """The sessions, newest first (a bare array). An active session's `workspace_bytes` is
    measured now (its programs may have written since it was last measured); a paused one's
    was measured when it was paused."""
    await runtime.flush()
    found = await runtime.db(service.list, tenant=tenant_of(request), status=status,
                             limit=limit, offset=offset)
    out = [s.public() for s in found]
    active = [s for s in out if s["status"] == "active"]
    if active:
        def measure() -> None:
            for s in active:
                with contextlib.suppress(SessionError):  # deleted meanwhile: as listed
                    s["workspace_bytes"] = service.measure(s["id"])

        await asyncio.to_thread(measure)
    return json_response(out)


@router.get("/{session_id}")
async def get_session(
    session_id: str,
    request: Request,
    service: ServiceDep,
    runtime: RuntimeDep,
    preview: Annotated[bool, Query(description="each binding with a short preview of its "
                                   "saved value (read from disk; nothing is run)")] = False,
) -> Response:
    """The session, with its saved `bindings` (`[{name, type}]`; `?preview=true` adds each
    one's `kind`, `mutable`, `bytes`, `preview` and `length`), the `files` of its workspace's
    root (as `ls` lists them), `state_bytes`, `disk_quota_bytes` and `upload_max_bytes`."""
    tenant = tenant_of(request)
    await runtime.flush(session_id)

    def describe() -> dict[str, Any]:
        service.get(session_id, tenant=tenant)
        service.measure(session_id)
        return service.describe(session_id, tenant=tenant, preview=preview)

    return json_response(await asyncio.to_thread(describe))


@router.delete("/{session_id}")
async def delete_session(session_id: str, request: Request, runtime: RuntimeDep) -> Response:
    """Delete the session: a run in progress is stopped, its files and state removed."""
    await runtime.delete(session_id, tenant=tenant_of(request))
    await release_session(request, session_id)
    return json_response({"id": session_id, "deleted": True})


@router.post("/{session_id}/pause")
async def pause_session(session_id: str, request: Request, runtime: RuntimeDep) -> Response:
    """Pause the session now (after the run in progress): its worker ends, its bindings and
    files stay on disk, and its next run resumes it. `409` if another server runs it."""
    session = await runtime.pause(session_id, tenant=tenant_of(request))
    return json_response(session.public())


# -- files ----------------------------------------------------------------------------------


async def _files(service: SessionService, session_id: str, request: Request) -> SessionFiles:
    return await asyncio.to_thread(service.files, session_id, tenant=tenant_of(request))


@router.get("/{session_id}/files")
async def list_files(
    session_id: str,
    request: Request,
    service: ServiceDep,
    dir: Annotated[str, Query(description="a directory of the workspace")] = ".",
    all: Annotated[bool, Query(description="list names starting with a dot")] = True,
) -> Response:
    """The entries of `dir` (`{name, type, size, modified}`, a bare array, names spelled as
    paths from the workspace's root), as `ls` gives them."""
    files = await _files(service, session_id, request)
    return json_response(await asyncio.to_thread(files.list, dir, all=all))


@router.put("/{session_id}/files/{path:path}")
async def put_file(
    session_id: str, path: str, request: Request, service: ServiceDep
) -> Response:
    """Write the file at `path` (missing directories made): the body is its content, up to
    `session_upload_mb` and within the session's disk quota (`session_disk_mb`), else `413`.
    Answers its `ls` entry."""
    length = request.headers.get("content-length")
    try:
        size_hint = int(length) if length is not None else None
    except ValueError:
        raise InvalidRequest("invalid Content-Length header", where="Content-Length") from None
    files = await _files(service, session_id, request)
    await check_upload(request, size_hint or 0)
    entry = await files.aput(path, request.stream(), size_hint=size_hint)
    await asyncio.to_thread(service.measure, session_id)
    return json_response(entry)


@router.get("/{session_id}/files/{path:path}")
async def get_file(
    session_id: str, path: str, request: Request, service: ServiceDep
) -> Response:
    """The file at `path`, streamed, with its content type (guessed from its name)."""
    files = await _files(service, session_id, request)
    opened = await asyncio.to_thread(files.get, path)
    headers = {
        "content-length": str(opened.size),
        "last-modified": format_datetime(
            datetime.fromisoformat(opened.modified.replace("Z", "+00:00")), usegmt=True),
        "content-disposition": _disposition(opened.name),
    }
    return StreamingResponse(opened.chunks(), media_type=opened.content_type, headers=headers)


@router.delete("/{session_id}/files/{path:path}")
async def delete_file(
    session_id: str,
    path: str,
    request: Request,
    service: ServiceDep,
    recursive: Annotated[bool, Query(description="remove a directory and all in it")] = False,
) -> Response:
    """Remove a file, link or empty directory (`recursive=true`: a directory and all in it;
    a link is removed, never followed)."""
    files = await _files(service, session_id, request)
    await asyncio.to_thread(files.delete, path, recursive=recursive)
    await asyncio.to_thread(service.measure, session_id)
    return json_response({"path": path, "deleted": True})


def _disposition(name: str) -> str:
    """``attachment`` with the file's name (RFC 6266: ASCII, and UTF-8 as ``filename*``)."""
    ascii_name = name.encode("ascii", "replace").decode().replace('"', "_").replace("\\", "_")
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name)}"
