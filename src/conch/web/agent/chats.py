"""The studio's chats on the server: ``/api/v1/chats`` (list and search, create, read,
change, delete) and ``/api/v1/chats/import`` (a browser's chats, on first sign-in).

A chat belongs to the tenant of the key that made it; a key sees its tenant's chats (the
admin every tenant's) and another tenant's chat is not found. The routes validate, call the
:class:`~conch.chats.ChatStore` and shape the answer (docs/security.md, "Chats").
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import Response

from conch.chats import ChatStore
from conch.errors import Invalid
from conch.web.common.auth import PrincipalDep
from conch.web.common.deps import state_getter
from conch.web.common.responses import json_response

router = APIRouter(tags=["chats"])

ChatsDep = Annotated[ChatStore, Depends(state_getter("chats", ChatStore))]
T = TypeVar("T")

_CHAT = {
    "id": "chat_0123456789abcdef",
    "title": "Sorting a table",
    "renamed": False,
    "settings": {"model": "smollm2-135m-instruct", "temperature": 0.7},
    "message_count": 2,
    "client_id": None,
    "tenant": "acme",
    "version": 3,
    "created_at": "2026-01-01T00:00:00.000Z",
    "updated_at": "2026-01-01T00:05:00.000Z",
}
_MESSAGES = [
    {"id": "m1", "role": "user", "content": "How do I sort a table by size?"},
    {"id": "m2", "role": "assistant", "content": "Use `sort_by(\"size\")`.", "status": "done"},
]
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "A bad field: `error.where` names it."},
    404: {"description": "No such chat (or another tenant's)."},
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


async def _db(store: ChatStore, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A store call: inline on SQLite (short), on a worker thread on PostgreSQL."""
    if store.sqlite:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))


async def _object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw or b"null")
    except ValueError as exc:
        raise Invalid(f"body: not JSON ({exc})", where="body") from None
    if not isinstance(body, dict):
        raise Invalid("body: a JSON object is required", where="body")
    return body


@router.get(
    "/api/v1/chats",
    **_doc({"total": 1, "chats": [{**_CHAT, "snippet": "How do I sort a table by size?"}]},
           "`{total, chats}`: summaries (no messages), newest first; with `q`, the chats "
           "matching every word, best first, each with a `snippet` of the match."),
)  # fmt: skip
async def list_chats(
    store: ChatsDep,
    principal: PrincipalDep,
    q: str | None = Query(default=None, max_length=500, description="Full-text search."),
    limit: int = Query(default=50, ge=1, le=500),
    offset: int = Query(default=0, ge=0),
) -> Response:
    total, chats = await _db(store, store.list, tenant=principal.reads, q=q, limit=limit,
                             offset=offset)  # fmt: skip
    return json_response({"total": total, "chats": chats})


@router.post(
    "/api/v1/chats",
    status_code=201,
    **_doc({**_CHAT, "messages": _MESSAGES}, "The chat.", 201,
           "{title?, renamed?, settings?, messages?: [{id?, role, content, ...}]}"),
)  # fmt: skip
async def create_chat(request: Request, store: ChatsDep, principal: PrincipalDep) -> Response:
    """A new chat of the key's tenant; without `title`, its first user message names it."""
    chat = await _db(store, store.create, await _object(request), tenant=principal.owner)
    return json_response(chat.to_dict(), 201)


@router.post(
    "/api/v1/chats/import",
    **_doc({"imported": [{"client_id": "cl2x9abc", "id": "chat_0123456789abcdef",
                          "status": "created"}]},
           "What became of each chat: `created`, `updated` (the browser's copy was newer) "
           "or `unchanged`.",
           body="{chats: [the studio's IndexedDB records {id, title, renamed?, created, "
                "updated, settings, messages}]}"),
)  # fmt: skip
async def import_chats(request: Request, store: ChatsDep, principal: PrincipalDep) -> Response:
    """Upload a browser's chats (the studio, on first sign-in): all or none; importing again
    changes only the chats whose browser copy is newer."""
    body = await _object(request)
    for field in body:
        if field != "chats":
            raise Invalid(f"unknown field '{field}'; the body is {{chats: [...]}}", where=field)
    if "chats" not in body:
        raise Invalid("chats is required", where="chats")
    out = await _db(store, store.import_chats, body["chats"], tenant=principal.owner)
    return json_response({"imported": out})


@router.get("/api/v1/chats/{chat_id}", **_doc({**_CHAT, "messages": _MESSAGES}, "The chat."))
async def get_chat(chat_id: str, store: ChatsDep, principal: PrincipalDep) -> Response:
    chat = await _db(store, store.get, chat_id, tenant=principal.reads)
    return json_response(chat.to_dict())


@router.patch(
    "/api/v1/chats/{chat_id}",
    **_doc({**_CHAT, "messages": _MESSAGES}, "The chat as changed.",
           body="{title?, renamed?, settings?, messages? | messages_upsert?, version?}"),
)  # fmt: skip
async def update_chat(
    chat_id: str, request: Request, store: ChatsDep, principal: PrincipalDep
) -> Response:
    """Change a chat: `title`, `renamed`, `settings`, `messages` (all of them) or
    `messages_upsert` (each replaces the message of its `id`, or is appended: what a
    streaming answer saves); with `version`, only if no other change came first (`409`)."""
    changes = await _object(request)
    chat = await _db(store, store.update, chat_id, changes, tenant=principal.reads)
    return json_response(chat.to_dict())


@router.delete(
    "/api/v1/chats/{chat_id}", **_doc({"id": "chat_0123456789abcdef", "deleted": True}, "Gone.")
)
async def delete_chat(chat_id: str, store: ChatsDep, principal: PrincipalDep) -> Response:
    await _db(store, store.delete, chat_id, tenant=principal.reads)
    return json_response({"id": chat_id, "deleted": True})
