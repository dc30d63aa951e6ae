"""Model pulls and deletes in the audit log (docs/security.md, "The audit log"): who (the
request's key), which model, from which source. Written once the pull or delete is done."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from conch.web.common.auth import ACCESS, PRINCIPAL, KeyAccess


async def model_pulled(request: Request, model: str, source: str | None, **details: Any) -> None:
    access: KeyAccess | None = request.scope.get(ACCESS)
    if access is not None:
        await access.db(access.audit.model_pulled, _actor(request), model=model, source=source,
                        details={k: v for k, v in details.items() if v is not None})  # fmt: skip


async def model_deleted(request: Request, model: str) -> None:
    access: KeyAccess | None = request.scope.get(ACCESS)
    if access is not None:
        await access.db(access.audit.model_deleted, _actor(request), model=model)


def _actor(request: Request) -> Any:
    return request.scope.get(PRINCIPAL)
