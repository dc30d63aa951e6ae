"""Routes of the agent marketplace (``/api/v1/marketplace/*``): validate, call the
:class:`~conch.marketplace.MarketplaceService`, shape the answer.

The service is synchronous (SQLAlchemy Core); each call runs in a worker thread. Its errors
(:class:`~conch.marketplace.MarketplaceError`, on conch's one tree) reach the client through the
agent server's handler: ``{"success": false, "error": {kind, message, field}}``.

Keys: the catalogue (search, list, versions) is public to any key; publishing needs
``marketplace:publish`` and goes to the audit log with the publishing key; installing and
uninstalling are the admin's (an installed agent is the server's, every tenant's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from conch.marketplace import MarketplaceService
from conch.marketplace.federation import HOP_HEADER
from conch.marketplace.records import MAX_NAME, MAX_VERSION, PublishRequest
from conch.marketplace.service import DEFAULT_LIMIT, MAX_LIMIT
from conch.web.agent.deps import MarketplaceDep
from conch.web.agent.protocol import request_body
from conch.web.common.auth import ACCESS, PRINCIPAL, KeyAccess
from conch.web.common.errors import WebError
from conch.web.common.responses import json_response

router = APIRouter(prefix="/api/v1/marketplace", tags=["marketplace"])

UPSTREAM_NOTE_HEADER = "X-Conch-Upstream-Note"


class InstallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=MAX_NAME * 2)
    version: str | None = Field(
        default=None,
        max_length=MAX_VERSION * 2,
        description="exact (1.2.3), a semver range (^1.2, ~1.2.3, >=1.0 <2), latest, or omitted",
    )


class UninstallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=MAX_NAME * 2)


class ErrorBody(BaseModel):
    success: bool = False
    error: dict[str, Any]


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Invalid request; `error.field` names the field"},
    404: {"model": ErrorBody, "description": "Unknown agent, no matching version, not installed"},
    409: {"model": ErrorBody, "description": "Version exists, record tampered, agent busy"},
}


M = TypeVar("M", bound=BaseModel)


async def _parse(request: Request, model: type[M]) -> M:
    """The body as ``model`` whatever the Content-Type says (``curl -d`` sends a form type);
    a problem is a 400 naming the field."""
    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in first.get("loc", ())) or "body"
        if first.get("type") == "json_invalid":
            message, field = "the body is not valid JSON", "body"
        elif first.get("type") == "extra_forbidden":
            message = f"unknown field {field!r}"
        else:
            message = f"{field}: {first.get('msg', 'invalid')}"
        raise WebError(400, message, kind="RequestError", field=field) from None


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await run_in_threadpool(fn, *args, **kwargs)


def _federated(request: Request) -> bool:
    # A request from a downstream conch server is answered from this server alone.
    return HOP_HEADER.lower() not in request.headers


@router.get("/search", responses=_ERRORS)
async def search(
    request: Request,
    service: MarketplaceDep,
    q: str = Query(default="", max_length=500, description="search text"),
    category: str | None = Query(default=None, max_length=40),
    limit: int = Query(default=DEFAULT_LIMIT, ge=1, le=MAX_LIMIT),
    offset: int = Query(default=0, ge=0, le=1_000_000),
) -> Response:
    """`{query, category, total, limit, offset, results, notes}`: the agent named exactly
    `q` first, then by relevance over name, tags and description, ties by name; the latest
    version of each agent, with `origin`, `installed` and `installed_version`."""
    out = await _call(
        service.search, q, category, limit=limit, offset=offset, federated=_federated(request)
    )
    return json_response(out)


@router.get("/agents", responses=_ERRORS)
async def list_agents(request: Request, service: MarketplaceDep) -> Response:
    """Every agent (latest version) with `installed` and `installed_version`; with an
    upstream, its agents too (`origin` is its URL). If the upstream does not answer, the
    local list comes back with the reason in the `X-Conch-Upstream-Note` header."""
    out = await _call(service.list_agents, federated=_federated(request))
    agents, notes = out
    headers = {UPSTREAM_NOTE_HEADER: "; ".join(notes)[:500]} if notes else None
    return json_response(agents, headers=headers)


@router.get("/agents/{name}", responses=_ERRORS)
async def agent_versions(name: str, service: MarketplaceDep) -> Response:
    """`{name, versions, installed_version}`: every published version of one agent, newest
    first (what a downstream server resolves ranges against and verifies digests of)."""
    out = await _call(service.versions_of, name)
    return json_response(out)


@router.post(
    "/publish",
    status_code=201,
    responses=_ERRORS,
    openapi_extra=request_body(PublishRequest, inline=True),
)
async def publish(request: Request, service: MarketplaceDep) -> Response:
    """Publish a new immutable version → `201` record. Without `version`: the next patch
    (`1.0.0` first). The same version again → `409`; a range, unknown tools, a malformed
    model or an oversize field → `400` naming the field."""
    body = await _parse(request, PublishRequest)
    out = await _call(service.publish, body)
    access: KeyAccess | None = request.scope.get(ACCESS)
    if access is not None:
        await _call(access.audit.marketplace_published, request.scope.get(PRINCIPAL),
                    name=out["name"], version=out["version"], digest=out.get("digest"))  # fmt: skip
    return json_response(out, 201)


@router.post(
    "/install",
    responses=_ERRORS,
    openapi_extra=request_body(InstallRequest, inline=True),
)
async def install(request: Request, service: MarketplaceDep) -> Response:
    """`{name, version, digest, installed: true}`; the record's digest is verified first
    (`409` if it does not match). Installing the installed version again changes nothing."""
    body = await _parse(request, InstallRequest)
    out = await _call(service.install, body.name, body.version)
    return json_response(out)


@router.post(
    "/uninstall",
    responses=_ERRORS,
    openapi_extra=request_body(UninstallRequest, inline=True),
)
async def uninstall(request: Request, service: MarketplaceDep) -> Response:
    """`{name, version, installed: false}`; `404` if not installed, `409` while one of its
    tasks runs."""
    body = await _parse(request, UninstallRequest)
    out = await _call(service.uninstall, body.name)
    return json_response(out)


def attach(app: Any, settings: Any) -> MarketplaceService:
    """Add the marketplace to the agent server ``app``: its routes, its service at
    ``app.state.marketplace``, the curated catalogue published on start, and installed agents
    handed to the orchestrator's agent registry (``app.state.orchestrator``)."""
    from contextlib import asynccontextmanager

    from conch.marketplace.catalogue import CATALOGUE
    from conch.marketplace.sink import RegistrySink

    service = MarketplaceService.from_settings(settings)
    orchestrator = getattr(app.state, "orchestrator", None)
    app.state.marketplace = service
    app.include_router(router)
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> Any:
        async with inner(a) as state:
            await run_in_threadpool(service.seed, CATALOGUE)
            if orchestrator is not None:
                await run_in_threadpool(service.attach_sink, RegistrySink(orchestrator.agents))
            try:
                yield state
            finally:
                if service.upstream is not None:
                    service.upstream.close()

    app.router.lifespan_context = lifespan
    return service
