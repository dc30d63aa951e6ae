"""Who a request runs as, and what it may do: keys on both servers.

Three steps, each where it costs least:

1. **Authentication**, in :class:`~conch.web.common.security.SecurityMiddleware` (pure ASGI,
   before any routing): the request's secret (``Authorization: Bearer``, or Anthropic's
   ``x-api-key`` on ``/v1/messages``) becomes a :class:`~conch.keys.Principal`, put on the
   request's scope under :data:`PRINCIPAL` (:func:`principal_of`, :data:`PrincipalDep`). An
   unknown, revoked or expired key is a ``401``. Without an admin key (a loopback server: a
   non-loopback bind needs one to start) a request without a key, or with a secret that is
   not a conch key (OpenAI clients always send one), runs as the admin, as before keys
   existed; a conch key is still authenticated, so its limits and tenant apply.
2. **The route's rule**, checked by a wrapper around each route's ``handle``
   (:func:`guard_routes`), once the framework has chosen the route: every route is declared
   once, in its server's table (:class:`Declarations`: open, any key, or a scope), and a
   route no declaration names is admin-only. A missing scope is a ``403`` naming it, in the
   route's own error envelope (the app's one handler renders it).
3. **Limits**: ``requests_per_minute`` in the same wrapper; tokens, runs, CPU seconds,
   sessions and disk where the request knows them (:class:`KeyAccess` and its callers).

A key that sets no limit the request touches does no database work: the principal comes
from the service's cache, and admission returns at once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Request
from prometheus_client import CollectorRegistry, Counter
from starlette.routing import BaseRoute
from starlette.types import Receive, Scope, Send

from conch.errors import Unauthorized
from conch.keys import (
    ADMIN_PRINCIPAL,
    SCOPES,
    Admission,
    AuditLog,
    KeyLimitExceeded,
    KeyService,
    Limiter,
    Principal,
    require_scope,
)
from conch.keys.hashing import looks_like_key
from conch.keys.service import MISSING, PASS_PREFIX

# Where the principal and the app's KeyAccess live on an ASGI scope.
PRINCIPAL = "conch.principal"
ACCESS = "conch.access"

OPEN = "open"  # no key needed
ANY = "any"  # any valid key, whatever its scopes
ADMIN = "admin"

WWW_AUTHENTICATE = {"WWW-Authenticate": 'Bearer realm="conch"'}

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Rule:
    """What a route needs: ``access`` is :data:`OPEN`, :data:`ANY` or a scope. ``admits``: the
    route admits its own request against the key's limits (the runs, which admit the request
    and the run together), so the guard does not count it."""

    access: str
    admits: bool = False

    def __post_init__(self) -> None:
        if self.access not in (OPEN, ANY) and self.access not in SCOPES:
            # A typo in a declaration must fail loudly, not open or close a route.
            raise ValueError(f"unknown access {self.access!r}")


ADMIN_ONLY = Rule(ADMIN)


def _rule(value: Rule | str) -> Rule:
    return value if isinstance(value, Rule) else Rule(value)


class Declarations:
    """A server's routes and what each needs, declared once.

    ``routes``: ``{(METHOD, path template): rule}`` for single routes (``"GET"`` covers
    ``HEAD``); ``prefixes``: ``[(path prefix, rule)]`` for a family of routes (the longest
    prefix wins), such as a router another part of the server adds. A route that neither
    names is admin-only. An exact declaration that names no route of the app is an error
    when the routes are guarded (a stale or misspelled declaration)."""

    def __init__(
        self,
        routes: Mapping[tuple[str, str], Rule | str],
        prefixes: Iterable[tuple[str, Rule | str]] = (),
    ) -> None:
        self.routes = {(m.upper(), p): _rule(r) for (m, p), r in routes.items()}
        self.prefixes = sorted(((p, _rule(r)) for p, r in prefixes), key=lambda x: -len(x[0]))

    def rule(self, method: str, path: str) -> Rule:
        method = "GET" if method == "HEAD" else method
        found = self.routes.get((method, path))
        if found is not None:
            return found
        for prefix, rule in self.prefixes:
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                return rule
        return ADMIN_ONLY

    def open_paths(self) -> frozenset[str]:
        """The paths the guard lets through without a key (those without parameters)."""
        out = {p for (_m, p), r in self.routes.items() if r.access == OPEN and "{" not in p}
        out |= {p.rstrip("/") for p, r in self.prefixes if r.access == OPEN}
        return frozenset(out)

    def open_prefixes(self) -> tuple[str, ...]:
        """The fixed part of each open route with parameters (``/swagger-ui/assets/``), and
        each open family's prefix."""
        out = {p.split("{", 1)[0] for (_m, p), r in self.routes.items() if r.access == OPEN and "{" in p}
        out |= {p.rstrip("/") + "/" for p, r in self.prefixes if r.access == OPEN}
        return tuple(sorted(out))


class KeyMetrics:
    """Prometheus counters by key name: requests, tokens (as settled), refusals by limit. On
    the admin-only ``/metrics``: a key's name is not shown to other tenants."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "conch_key_requests", "Authenticated requests by key name", ["key"], registry=registry
        )
        self.tokens = Counter(
            "conch_key_tokens", "Tokens used (as settled) by key name", ["key"], registry=registry
        )
        self.refusals = Counter(
            "conch_key_refusals",
            "Requests refused by a limit of the key, by key name and limit",
            ["key", "limit"],
            registry=registry,
        )
        self._requests: dict[str, Any] = {}

    def request(self, principal: Principal) -> None:
        child = self._requests.get(principal.name)
        if child is None:
            child = self.requests.labels(principal.name)
            if len(self._requests) < 10_000:
                self._requests[principal.name] = child
        child.inc()

    def used_tokens(self, principal: Principal, tokens: int) -> None:
        if tokens > 0:
            self.tokens.labels(principal.name).inc(tokens)

    def refused(self, principal: Principal, limit: str) -> None:
        self.refusals.labels(principal.name, limit).inc()


class KeyAccess:
    """The keys room as a server uses it: the service (authentication, CRUD), the limiter,
    the audit log, the counters; and whether the server is open (no admin key).

    Database work runs on the event loop for SQLite (a few short statements, as the
    orchestration stores do) and on a worker thread for PostgreSQL (network round trips)."""

    def __init__(
        self,
        keys: KeyService,
        limiter: Limiter,
        audit: AuditLog,
        metrics: KeyMetrics | None = None,
    ) -> None:
        self.keys = keys
        self.limiter = limiter
        self.audit = audit
        self.metrics = metrics
        self.inline = keys.engine.dialect.name == "sqlite"

    @classmethod
    def from_settings(cls, settings: Any, registry: CollectorRegistry | None = None) -> KeyAccess:
        from conch import db

        engine = db.engine_for(settings.effective_database_url)
        audit = AuditLog(engine)
        return cls(
            KeyService.from_settings(engine, settings, audit=audit),
            Limiter(engine),
            audit,
            KeyMetrics(registry) if registry is not None else None,
        )

    @property
    def open(self) -> bool:
        """No admin key is configured: a request without a key runs as the admin."""
        return not self.keys.has_admin_key

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``: inline on SQLite, on a worker thread on PostgreSQL."""
        if self.inline:
            return fn(*args, **kwargs)
        return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))

    # -- authentication ------------------------------------------------------------------

    def authenticate(self, secret: str | None) -> Principal | str:
        """The principal of a request's secret (``None``: it sent none), or why it is
        refused."""
        if self.open:
            # Today's single-user server: no key needed. A conch key (or a model pass) is
            # still checked, so that its limits and tenant apply and a revoked one is refused.
            if not secret or not (looks_like_key(secret) or secret.startswith(PASS_PREFIX)):
                return ADMIN_PRINCIPAL
        elif not secret:
            return MISSING
        return self.keys.resolve(secret)

    def issue_pass(self, principal: Principal, ttl_s: float) -> str | None:
        """A model pass for a run of ``principal`` (``KeyService.issue_pass``)."""
        return self.keys.issue_pass(principal, ttl_s)

    # -- limits ----------------------------------------------------------------------------

    async def admit(self, principal: Principal, **kwargs: Any) -> Admission:
        """``Limiter.admit``; a refusal is counted by key name and limit."""
        try:
            if not self.inline and self.limiter.touches(principal, **kwargs):
                return await asyncio.to_thread(functools.partial(self.limiter.admit, principal, **kwargs))
            return self.limiter.admit(principal, **kwargs)
        except KeyLimitExceeded as exc:
            if self.metrics is not None:
                self.metrics.refused(principal, exc.limit)
            raise

    async def finish(
        self,
        principal: Principal,
        admission: Admission,
        *,
        tokens: int | None = None,
        cpu_seconds: float | None = None,
    ) -> None:
        """Settle an admission (``Limiter.finish``) and count the tokens used."""
        if self.metrics is not None and tokens:
            self.metrics.used_tokens(principal, tokens)
        if admission.recorded:
            await self.db(self.limiter.finish, admission, tokens=tokens, cpu_seconds=cpu_seconds)


# -- the route guard ----------------------------------------------------------------------


class RouteGuard:
    """A route's rules, checked before its ``handle`` (which :func:`guard_routes` wraps).

    A route object may be shared by several apps of one process (a module's router included
    in each): the guard reads the app's :class:`KeyAccess` from the request's scope (where the
    app's middleware put it), never holds one of its own."""

    def __init__(self, route: BaseRoute, rules: dict[str, Rule]) -> None:
        self.route = route
        self.rules = rules
        self.handle = route.handle

    async def check(self, scope: Scope) -> Principal | None:
        """Raise the refusal of this request (``401``, ``403`` naming the scope, a ``429``);
        the principal it runs as (``None`` on an open route)."""
        rule = self.rules.get(scope.get("method", "GET")) or self.rules.get("*")
        if rule is None:
            # A method the route does not serve: it answers 405, and runs nothing.
            return scope.get(PRINCIPAL)
        if rule.access == OPEN:
            return None
        principal: Principal | None = scope.get(PRINCIPAL)
        if principal is None:
            # Only an open path, or an app without the guard's middleware, gets here.
            raise Unauthorized(MISSING, headers=dict(WWW_AUTHENTICATE))
        if rule.access != ANY:
            require_scope(principal, rule.access)
        if not rule.admits and principal.limits.requests_per_minute is not None:
            await scope[ACCESS].admit(principal)
        return principal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.check(scope)
        await self.handle(scope, receive, send)


def route_rules(route: BaseRoute, declarations: Declarations) -> dict[str, Rule]:
    """The rule of each method of ``route``."""
    path = getattr(route, "path", "")
    methods = getattr(route, "methods", None) or {"*"}
    rules = {m: declarations.rule(m, path) for m in methods}
    if "GET" in rules:
        rules.setdefault("HEAD", rules["GET"])
    return rules


def app_routes(routes: Iterable[BaseRoute]) -> Iterable[BaseRoute]:
    """Every route of a router, those of included routers too (their own route objects)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from app_routes(included.routes)
        else:
            yield route


def guard_routes(app: FastAPI, declarations: Declarations) -> None:
    """Put every route of ``app`` behind its declared rule (call once every route is
    added). Raises ``ValueError`` for an exact declaration that names no route, or for a
    route another app guarded by other rules."""
    present: set[tuple[str, str]] = set()
    for route in app_routes(app.router.routes):
        rules = route_rules(route, declarations)
        path = getattr(route, "path", "")
        present |= {("GET" if m == "HEAD" else m, path) for m in rules}
        guard = getattr(route, "handle", None)
        if isinstance(guard, RouteGuard):
            if guard.rules != rules:
                raise ValueError(f"route {path!r} is guarded with other rules by another app")
            continue
        route.handle = RouteGuard(route, rules)  # type: ignore[method-assign]
    stale = sorted(f"{m} {p}" for (m, p) in declarations.routes if (m, p) not in present)
    if stale:
        raise ValueError(f"route declarations that name no route: {', '.join(stale)}")


def guard_of(route: BaseRoute) -> RouteGuard:
    """The guard :func:`guard_routes` put on ``route``."""
    guard = getattr(route, "handle", None)
    if not isinstance(guard, RouteGuard):
        raise RuntimeError(f"route {getattr(route, 'path', route)!r} is not guarded")
    return guard


# -- what routes read ----------------------------------------------------------------------


def principal_of(request: Request) -> Principal:
    """The principal the request runs as (set by the guard)."""
    principal: Principal | None = request.scope.get(PRINCIPAL)
    if principal is None:
        raise Unauthorized(MISSING, headers=dict(WWW_AUTHENTICATE))
    return principal


async def get_principal(request: Request) -> Principal:
    # A coroutine: FastAPI runs a plain function on a worker thread.
    return principal_of(request)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def bearer(header: bytes | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive)."""
    if not header or len(header) < 8 or header[:7].lower() != b"bearer ":
        return None
    return header[7:].strip().decode("latin-1") or None
