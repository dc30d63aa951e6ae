"""OpenAPI ``responses`` entries the inference routers share."""

from __future__ import annotations

from typing import Any

from conch.inference.api.openai import ErrorResponse


def errors(*extra: tuple[int, str]) -> dict[int | str, dict[str, Any]]:
    """The error statuses every model route can answer, plus ``extra`` ones."""
    common = ((400, "Invalid request"), (404, "Unknown model"), (429, "Queue full"), (500, "Server error"))
    return {code: {"model": ErrorResponse, "description": desc} for code, desc in (*common, *extra)}
