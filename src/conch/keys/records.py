"""What a key is, as the rest of conch sees it: its limits, the principal a request runs as,
and the record an admin reads (never the secret, which exists only in the answer to create
and rotate).

:class:`Limits` names each limit once. Unset limits do not apply (and cost nothing at
admission). ``0`` is a limit: nothing of that kind is allowed. ``models`` is an allow-list
of model names, each exact or with ``*`` wildcards (``local:*``, ``openai:gpt-4o*``);
``None`` allows every model and an empty list none.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from conch.errors import Invalid
from conch.keys.scopes import ADMIN

MAX_NAME = 100
# What a key made without a tenant owns things as: ``key:<id>``, a tenant of its own.
KEY_TENANT_PREFIX = "key:"
MAX_TENANT = 100
MAX_MODELS = 200
MAX_MODEL = 200

# Limits over a sliding window of this many seconds, and their kind of refusal: a rate
# (``rate_limit_exceeded``: wait a little) or a budget (``insufficient_quota``: wait long).
MINUTE = 60.0
DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class Limits:
    """A key's limits; ``None``: not limited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    runs_per_minute: int | None = None
    cpu_seconds_per_day: float | None = None
    concurrent_runs: int | None = None
    sessions_max: int | None = None
    disk_mb: int | None = None

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None, where: str = "limits") -> Limits:
        """Limits from JSON: an unknown name or a value that is not a non-negative number
        (an integer, except ``cpu_seconds_per_day``) is a ``400`` naming it."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise Invalid(f"{where} must be an object", where=where)
        values: dict[str, Any] = {}
        for name, value in data.items():
            if name not in LIMIT_NAMES:
                raise Invalid(
                    f"unknown limit {name!r}; the limits are {', '.join(LIMIT_NAMES)}",
                    where=f"{where}.{name}",
                )
            values[name] = _limit_value(name, value, f"{where}.{name}")
        return cls(**values)

    def merged(self, changes: Mapping[str, Any], where: str = "limits") -> Limits:
        """These limits with ``changes`` applied as a JSON merge patch: a name set to
        ``null`` is removed, any other is set, the rest stay."""
        if not isinstance(changes, Mapping):
            raise Invalid(f"{where} must be an object", where=where)
        data = self.to_dict()
        for name, value in changes.items():
            if value is None:
                if name not in LIMIT_NAMES:
                    raise Invalid(f"unknown limit {name!r}", where=f"{where}.{name}")
                data.pop(name, None)
            else:
                data[name] = value
        return Limits.parse(data, where)

    def to_dict(self) -> dict[str, int | float]:
        """The limits that are set, by name."""
        out: dict[str, int | float] = {}
        for name in LIMIT_NAMES:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @property
    def empty(self) -> bool:
        return all(getattr(self, name) is None for name in LIMIT_NAMES)


LIMIT_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Limits))


def _limit_value(name: str, value: Any, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Invalid(f"{name} must be a number", where=where)
    if not math.isfinite(value) or value < 0:
        raise Invalid(f"{name} must be a non-negative number", where=where)
    if name == "cpu_seconds_per_day":
        return float(value)
    if isinstance(value, float):
        if not value.is_integer():
            raise Invalid(f"{name} must be a whole number", where=where)
        value = int(value)
    if value > 2**53:
        raise Invalid(f"{name} is too large", where=where)
    return value


def parse_models(models: Iterable[object] | None, where: str = "models") -> tuple[str, ...] | None:
    """An allow-list of model names (``*`` wildcards allowed), or ``None`` for every model."""
    if models is None:
        return None
    if isinstance(models, str | bytes) or not isinstance(models, Iterable):
        raise Invalid(f"{where} must be a list of model names or null", where=where)
    out: list[str] = []
    for i, model in enumerate(models):
        if not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL:
            raise Invalid(
                f"a model name must be a non-empty string of at most {MAX_MODEL} characters",
                where=f"{where}[{i}]",
            )
        if model not in out:
            out.append(model)
    if len(out) > MAX_MODELS:
        raise Invalid(f"at most {MAX_MODELS} models", where=where)
    return tuple(out)


def parse_name(name: object, where: str = "name") -> str:
    if not isinstance(name, str) or not name.strip():
        raise Invalid("a key needs a non-empty name", where=where)
    name = name.strip()
    if len(name) > MAX_NAME:
        raise Invalid(f"a key's name has at most {MAX_NAME} characters", where=where)
    return name


def parse_tenant(tenant: object, where: str = "tenant") -> str | None:
    if tenant is None:
        return None
    if not isinstance(tenant, str) or not tenant.strip():
        raise Invalid("tenant must be a non-empty string or null", where=where)
    tenant = tenant.strip()
    if len(tenant) > MAX_TENANT:
        raise Invalid(f"a tenant has at most {MAX_TENANT} characters", where=where)
    if tenant.startswith(KEY_TENANT_PREFIX):
        # The owner of what a key without a tenant makes (Principal.owner): a tenant named
        # so would see that key's things.
        raise Invalid(f"tenant names starting with {KEY_TENANT_PREFIX!r} are reserved", where=where)
    return tenant


def parse_time(value: object, where: str) -> float | None:
    """A time as Unix seconds: from a number (or its text, as a command line or a query
    string gives it), an aware ``datetime`` or ISO-8601 text (``Z`` or an offset; a time
    without one is read as UTC)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise Invalid(f"{where} must be a time", where=where)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise Invalid(f"{where} must be a time", where=where)
        return float(value)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise Invalid(f"{where} must be an ISO-8601 time or Unix seconds", where=where)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.timestamp()
    raise Invalid(f"{where} must be a time", where=where)


def iso(ts: float | None) -> str | None:
    """Unix seconds as ISO-8601 UTC (``2025-01-02T03:04:05.678Z``), as orchestration renders."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def model_allowed(models: tuple[str, ...] | None, model: str) -> bool:
    """Whether ``model`` is on the allow-list ``models`` (``None``: every model)."""
    if models is None:
        return True
    for pattern in models:
        if pattern == model or ("*" in pattern and fnmatch.fnmatchcase(model, pattern)):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request runs as: a key (or the configured admin key, ``key_id`` ``"admin"``).

    ``tenant`` owns what the request creates; ``None`` (the admin key, or a key made without
    a tenant) is the unnamed tenant of a single-user install. ``version`` is the key's at the
    time it was read, so a cache can tell a stale copy."""

    key_id: str
    name: str
    tenant: str | None
    scopes: frozenset[str]
    limits: Limits = field(default_factory=Limits)
    models: tuple[str, ...] | None = None
    expires_at: float | None = None
    version: int = 0
    # The configured admin key (not a key with the admin scope): its limits are none by
    # configuration, and it cannot be revoked through the API.
    configured: bool = False

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.scopes

    @property
    def owner(self) -> str | None:
        """The tenant what this principal creates belongs to: its key's tenant; for a key made
        without one, a tenant of its own (``key:<id>``), so that keys never share things by
        accident; ``None`` for an admin without a tenant (the configured admin key: the
        unnamed tenant of a single-user install, whose things only admins see)."""
        if self.tenant is not None:
            return self.tenant
        return None if self.is_admin else KEY_TENANT_PREFIX + self.key_id

    @property
    def reads(self) -> str | None:
        """Whose things this principal sees: ``None`` for every tenant's (an admin), else its
        :attr:`owner` (never ``None`` for a key that is not an admin). Domain readers take
        it as their ``tenant`` argument, where ``None`` means every tenant."""
        return None if self.is_admin else self.owner

    def has_scope(self, scope: str) -> bool:
        return ADMIN in self.scopes or scope in self.scopes

    def allows_model(self, model: str) -> bool:
        return model_allowed(self.models, model)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key_id": self.key_id,
            "name": self.name,
            "tenant": self.tenant,
            "scopes": sorted(self.scopes),
            "limits": self.limits.to_dict(),
            "models": list(self.models) if self.models is not None else None,
            "expires_at": iso(self.expires_at),
            "is_admin": self.is_admin,
            "owner": self.owner,
        }


ADMIN_KEY_ID = "admin"
ADMIN_PRINCIPAL = Principal(
    key_id=ADMIN_KEY_ID, name="admin", tenant=None, scopes=frozenset({ADMIN}), configured=True
)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A key as stored, less its secret's hash."""

    id: str
    name: str
    tenant: str | None
    scopes: frozenset[str]
    limits: Limits
    models: tuple[str, ...] | None
    expires_at: float | None
    prefix: str
    version: int
    created_at: float
    updated_at: float
    revoked_at: float | None
    created_by: str | None

    def status(self, now: float) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    def principal(self) -> Principal:
        return Principal(
            key_id=self.id,
            name=self.name,
            tenant=self.tenant,
            scopes=self.scopes,
            limits=self.limits,
            models=self.models,
            expires_at=self.expires_at,
            version=self.version,
        )

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        """The record as JSON: times in ISO-8601 UTC, ``status`` active | revoked | expired."""
        return {
            "id": self.id,
            "name": self.name,
            "tenant": self.tenant,
            "scopes": sorted(self.scopes),
            "limits": self.limits.to_dict(),
            "models": list(self.models) if self.models is not None else None,
            "prefix": self.prefix,
            "status": self.status(time.time() if now is None else now),
            "expires_at": iso(self.expires_at),
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "revoked_at": iso(self.revoked_at),
            "created_by": self.created_by,
        }

    @classmethod
    def from_row(cls, row: Any) -> KeyRecord:
        models = row.models
        return cls(
            id=row.id,
            name=row.name,
            tenant=row.tenant,
            scopes=frozenset(row.scopes),
            limits=Limits.parse(row.limits),
            models=tuple(models) if models is not None else None,
            expires_at=row.expires_at,
            prefix=row.prefix,
            version=row.version,
            created_at=row.created_at,
            updated_at=row.updated_at,
            revoked_at=row.revoked_at,
            created_by=row.created_by,
        )
