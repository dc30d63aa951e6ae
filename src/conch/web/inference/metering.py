"""The API key's limits on the inference server's generation and embedding routes.

Every route that reaches a model gets the request's :class:`KeyMeter` (:func:`meter`): the
models allow-list is checked at once, before any model is loaded (``403 model_not_allowed``),
and the serving layer tells the meter the most the request can use once it has tokenized the
prompt (prompt tokens + ``max_tokens``, or the room left in the context), which is reserved
against ``tokens_per_minute`` and ``tokens_per_day`` atomically in the database, then what it
used when it ends (streams and clients that leave included), which settles the reservation.
The request itself was counted against ``requests_per_minute`` by the route's guard.
"""

from __future__ import annotations

from fastapi import Request

from conch.inference.models.ref import ModelRef
from conch.inference.remote.registry import ProviderRegistry
from conch.keys import Admission, ModelNotAllowed, Principal
from conch.web.common.auth import ACCESS, KeyAccess, principal_of


class KeyMeter:
    """One request's token budget, on its key (the serving layer's ``Meter``)."""

    def __init__(self, access: KeyAccess, principal: Principal) -> None:
        self.access = access
        self.principal = principal
        self.admission: Admission | None = None

    async def reserve(self, model: str, prompt_tokens: int, max_new_tokens: int) -> None:
        # The model was checked against the allow-list by the route (under both its names).
        self.admission = await self.access.admit(
            self.principal, requests=0, tokens=prompt_tokens + max_new_tokens
        )

    async def settle(self, used_tokens: int) -> None:
        admission, self.admission = self.admission, None
        if admission is not None:
            await self.access.finish(self.principal, admission, tokens=used_tokens)


def allowed_names(model: str, providers: ProviderRegistry | None) -> tuple[str, ...]:
    """The names a model string is matched by against an allow-list: as given, and as
    ``provider:name`` (``local:`` for a model of this server's store)."""
    ref = ModelRef.parse(model, providers.ids() if providers is not None else ())
    qualified = f"{ref.provider}:{ref.name}"
    return (model,) if qualified == model else (model, qualified)


def allows(principal: Principal, model: str, providers: ProviderRegistry | None) -> bool:
    """Whether the key may use ``model`` (what model lists show it)."""
    if principal.models is None:
        return True
    return any(principal.allows_model(n) for n in allowed_names(model, providers))


def check_model(principal: Principal, model: str | None, providers: ProviderRegistry | None) -> None:
    """``403 model_not_allowed`` unless the key's allow-list names ``model`` (under either of
    its names); no ``model`` is the server's default, which the allow-list must name too."""
    name = model or "default"
    if not allows(principal, name, providers):
        raise ModelNotAllowed(name, principal.name)


def meter(request: Request, model: str | None, providers: ProviderRegistry | None = None) -> KeyMeter | None:
    """The request's meter, its model checked against the key's allow-list; ``None`` on a
    server without keys."""
    access: KeyAccess | None = request.scope.get(ACCESS)
    if access is None:
        return None
    principal = principal_of(request)
    check_model(principal, model, providers)
    return KeyMeter(access, principal)
