"""``GET /api/v1/builtins[/{name}] | types | schema[/{format}]``: the language, described.

Every answer is derived from the builtin registry, which does not change while the server
runs, so each body is rendered once and served from a cache afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from conch.lang import schema
from conch.lang.builtins.registry import lookup
from conch.web.agent.errors import unknown_builtin
from conch.web.agent.protocol import (
    UNKNOWN_BUILTIN,
    BuiltinDetail,
    BuiltinSummary,
    RequestErrorBody,
    TypeInfo,
)
from conch.web.common.errors import WebError
from conch.web.common.responses import compact_json

router = APIRouter(tags=["discovery"])

_cache: dict[str, bytes] = {}


def _cached(key: str, build: Callable[[], Any]) -> Response:
    body = _cache.get(key)
    if body is None:
        body = compact_json(build()).encode()
        _cache[key] = body
    return Response(body, media_type="application/json")


@router.get("/api/v1/builtins", response_model=list[BuiltinSummary])
async def list_builtins(category: str | None = Query(default=None)) -> Response:
    """Every builtin as `{name, description, category}`; `?category=` filters."""
    return _cached(f"builtins:{category}", lambda: schema.builtins(category))


@router.get("/api/v1/builtins/{name}", response_model=BuiltinDetail, responses=UNKNOWN_BUILTIN)
async def get_builtin(name: str) -> Response:
    """One builtin with signature, parameters, examples, effect and aliases."""
    b = lookup(name)
    if b is None:
        raise unknown_builtin(name)
    return _cached(f"builtin:{name}", b.to_dict)


@router.get("/api/v1/types", response_model=list[TypeInfo])
async def list_types() -> Response:
    """Value types and record shapes with their JSON Schema and properties."""
    return _cached("types", schema.types)


@router.get("/api/v1/schema")
async def get_schema() -> Response:
    """The complete language schema: types, builtins and syntax."""
    return _cached("schema", schema.language_schema)


@router.get(
    "/api/v1/schema/{format}",
    responses={404: {"model": RequestErrorBody, "description": "Unknown format"}},
)
async def get_schema_format(format: str, request: Request) -> Response:
    """The schema as `json` (JSON Schema), `openapi` (3.1), `openai`, `anthropic` or `mcp`."""
    if format not in schema.FORMATS:
        valid = ", ".join(schema.FORMATS)
        raise WebError(
            404,
            f"unknown schema format {format!r}; valid formats: {valid}",
            valid=list(schema.FORMATS),
        )
    if format == "openapi":
        base = str(request.base_url).rstrip("/")
        return _cached(f"schema:openapi:{base}", lambda: schema.openapi(base))
    return _cached(f"schema:{format}", lambda: schema.export(format))
