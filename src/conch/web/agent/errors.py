"""The agent server's errors: every failure answers ``{success: false, error: {kind, message}}``.

Domain code raises the errors of conch's one tree (:class:`conch.errors.DomainError`: its
status, kind and the field at fault) and routes raise :class:`~conch.web.common.errors.WebError`
for what only HTTP knows; one handler renders each. Request validation is a ``400`` naming the
fields (never FastAPI's ``422``), HTTP errors keep their status, and anything unexpected is a
``500 InternalError`` (the exception still reaches the server's log).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from conch.errors import DomainError
from conch.keys import KeyLimitExceeded
from conch.lang.builtins.registry import REGISTRY
from conch.lang.errors import did_you_mean
from conch.web.agent.protocol import REQUEST_MODELS
from conch.web.common.errors import WebError, agent_error_body


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None, **fields: Any
) -> Response:
    return Response(
        agent_error_body(status, message, **fields),
        status,
        headers=headers,
        media_type="application/json",
    )


def _fields(exc: DomainError) -> dict[str, Any]:
    """The envelope's fields of an error of the tree: its kind, the field at fault under the
    key its family's clients read (``where``, or ``field`` for the marketplace); for a limit
    of a key, also its ``code`` (``rate_limit_exceeded`` or ``insufficient_quota``) and
    ``retry_after``."""
    extra: dict[str, Any] = {exc.where_key: exc.where} if exc.where else {}
    if isinstance(exc, KeyLimitExceeded):
        extra["code"] = exc.code
        extra["retry_after"] = exc.retry_after
    return {"kind": exc.kind, **extra}


def agent_error_bytes(exc: DomainError) -> bytes:
    """The body of any error of the tree (for code that answers before the app's handlers)."""
    return agent_error_body(exc.status, exc.message, **_fields(exc))


def domain_error_response(exc: DomainError) -> Response:
    """The envelope of any error of the tree (:func:`_fields`)."""
    return error_response(exc.status, exc.message, exc.headers, **_fields(exc))


def problems(errors: Sequence[Any]) -> str:
    """The first few validation errors as ``field: message; ...``."""
    out = []
    for err in list(errors)[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        out.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(out) or "invalid request"


def unknown_builtin(name: str) -> WebError:
    hint = did_you_mean(name, REGISTRY)
    return WebError(404, f"unknown builtin {name!r}", kind="NameError", hint=hint)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(WebError)
    async def web_error(request: Request, exc: WebError) -> Response:
        return error_response(exc.status, exc.message, exc.headers, **exc.fields)

    @app.exception_handler(DomainError)
    async def domain_error(request: Request, exc: DomainError) -> Response:
        return domain_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        return error_response(400, problems(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail), dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        return error_response(500, "internal server error")

    _document_request_errors(app)


def _document_request_errors(app: FastAPI) -> None:
    """Replace FastAPI's documented ``422`` (never sent) with the ``400`` that is, and list
    the request bodies the routes parse themselves."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = original()
        for operations in doc.get("paths", {}).values():
            for op in operations.values():
                responses = op.get("responses", {})
                if responses.pop("422", None) is not None and "400" not in responses:
                    responses["400"] = {
                        "description": "Malformed request",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/RequestErrorBody"}
                            }
                        },
                    }
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in REQUEST_MODELS:
            body_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(body_schema.pop("$defs", {}))
            schemas[model.__name__] = body_schema
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
