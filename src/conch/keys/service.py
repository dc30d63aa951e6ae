"""Keys: create, list, read, change, revoke and rotate them, and authenticate a request's
secret to the :class:`~conch.keys.records.Principal` it runs as.

Every change to a key commits with its audit entry, in one transaction, and bumps the key's
``version``.

Authentication is on every request's hot path, so a verified principal is cached in memory
by its secret's hash, and the database is asked again only when the cached copy is older
than ``recheck_s`` (0.5 s): a revocation, a rotation or a change of scopes or limits made on
one server applies on every other within a second, and a key's steady traffic costs one
indexed read per ``recheck_s`` per server. Expiry is checked on every request from the cached
copy. A hash the database does not know is remembered as unknown for good: a new key's
secret is 256 fresh random bits that nobody can have presented before, so no key can appear
under a hash once seen unknown (and a revoked key never comes back either).

The configured admin key (``admin_key``; ``api_key`` too, which acts as admin) is not a row:
it authenticates as :data:`~conch.keys.records.ADMIN_PRINCIPAL` (tenant ``None``, scope
``admin``, no limits), compared in constant time.

Model passes. A program run for a key calls models (``ai``, ``embed``, an agent task's model
turns) through the inference server, and must do so as that key, inside its limits and
allow-list, without holding its secret or the admin key. :meth:`KeyService.issue_pass` gives
a run a short-lived pass (``ckp-<key id>.<expiry>.<signature>``, an HMAC under a key derived
from the configured admin key, which both servers have): it authenticates as the key with
only the ``inference`` scope, until its expiry or the key's revocation, whichever comes
first. Without an admin key no pass is needed (the servers are open) and none is issued.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from conch.errors import Conflict, Invalid, NotFound, Unauthorized
from conch.keys import audit as actions
from conch.keys.audit import AuditLog
from conch.keys.hashing import display_prefix, hash_secret, looks_like_key, new_id, new_secret
from conch.keys.records import (
    ADMIN_PRINCIPAL,
    KeyRecord,
    Limits,
    Principal,
    iso,
    parse_models,
    parse_name,
    parse_tenant,
    parse_time,
)
from conch.keys.scopes import INFERENCE, parse_scopes
from conch.keys.tables import api_keys, key_usage

RECHECK_S = 0.5
CACHE_SIZE = 10_000
MAX_PAGE = 500

PASS_PREFIX = "ckp-"
_PASS_LABEL = b"conch model pass v1"

MISSING = "missing API key"
INVALID = "invalid API key"
REVOKED = "this API key was revoked"

# What PATCH may change; anything else in a patch is a 400 naming it.
PATCHABLE = ("name", "scopes", "limits", "models", "expires_at")


class _AnyTenant:
    def __repr__(self) -> str:
        return "ANY_TENANT"


ANY_TENANT: Any = _AnyTenant()


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """A key and its secret: the answer to create and rotate, the only time the secret is
    seen."""

    record: KeyRecord
    secret: str

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        return {**self.record.to_dict(now), "secret": self.secret}


@dataclass(slots=True)
class _Cached:
    principal: Principal
    checked: float  # time.monotonic() when the database read began


_a = api_keys.c
_by_hash = sa.select(api_keys).where(_a.secret_hash == sa.bindparam("h"))
_by_id = sa.select(api_keys).where(_a.id == sa.bindparam("id"))


class KeyService:
    def __init__(
        self,
        engine: Engine,
        *,
        admin_keys: Iterable[str | None] = (),
        audit: AuditLog | None = None,
        recheck_s: float = RECHECK_S,
        clock: Callable[[], float] = time.time,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.audit = audit or AuditLog(engine, clock=clock)
        self.recheck_s = recheck_s
        # Digests, so that the comparison takes the same time whatever the lengths.
        self._admin = [hashlib.sha256(k.encode()).digest() for k in admin_keys if k]
        # Model passes are signed with the first admin key's and verified with any.
        self._pass_keys = [hmac.new(d, _PASS_LABEL, hashlib.sha256).digest() for d in self._admin]
        self._by_key: dict[str, _Cached] = {}  # key id -> principal, for passes
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        # hash -> why it is refused, for hashes known to be refused for good
        self._unknown: OrderedDict[str, str] = OrderedDict()
        self._hash_of: dict[str, str] = {}  # key id -> the cached hash
        self._cache_size = cache_size
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, engine: Engine, settings: Any, **kwargs: Any) -> KeyService:
        """A service whose admin keys are the settings' ``admin_key`` and ``api_key``."""
        return cls(engine, admin_keys=(settings.admin_key, settings.api_key), **kwargs)

    @property
    def has_admin_key(self) -> bool:
        """Whether an admin key is configured (without one a loopback server stays open as
        before: a request without a key runs as the admin)."""
        return bool(self._admin)

    # -- authentication ------------------------------------------------------------------

    def authenticate(self, secret: str | None) -> Principal | None:
        """The principal ``secret`` authenticates as; ``None`` for an unknown, revoked or
        expired key."""
        found = self._resolve(secret)
        return found if isinstance(found, Principal) else None

    def verify(self, secret: str | None) -> Principal:
        """As :meth:`authenticate`, but raise :class:`conch.errors.Unauthorized` saying why."""
        found = self._resolve(secret)
        if isinstance(found, Principal):
            return found
        raise Unauthorized(found)

    def resolve(self, secret: str | None) -> Principal | str:
        """The principal ``secret`` authenticates as, or why it is refused (the message of a
        ``401``): what a server's guard calls on every request."""
        return self._resolve(secret)

    def _resolve(self, secret: str | None) -> Principal | str:
        if not secret:
            return MISSING
        if self._admin:
            digest = hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()
            for admin in self._admin:
                if hmac.compare_digest(digest, admin):
                    return ADMIN_PRINCIPAL
        if secret.startswith(PASS_PREFIX):
            return self._resolve_pass(secret)
        if not looks_like_key(secret):
            return INVALID
        h = hash_secret(secret)
        cached = self._cache.get(h)
        if cached is not None and time.monotonic() - cached.checked < self.recheck_s:
            principal = cached.principal
        else:
            refused = self._unknown.get(h)
            if refused is not None:
                return refused
            # The copy is as old as the moment the read began (a change committed while it
            # ran may be missing from it), so that is when it was checked.
            started = time.monotonic()
            with self.engine.connect() as conn:
                row = conn.execute(_by_hash, {"h": h}).first()
            if row is None or row.revoked_at is not None:
                reason = INVALID if row is None else REVOKED
                self._forget(h, refused=reason)
                return reason
            principal = KeyRecord.from_row(row).principal()
            self._remember(h, principal, started)
        if principal.expires_at is not None and principal.expires_at <= self.clock():
            return f"this API key expired at {iso(principal.expires_at)}"
        return principal

    # -- model passes --------------------------------------------------------------------

    def issue_pass(self, principal: Principal, ttl_s: float) -> str | None:
        """A pass that authenticates as ``principal``'s key with only the ``inference`` scope
        for ``ttl_s`` seconds (see the module doc); ``None`` without an admin key."""
        return self.issue_pass_for(principal.key_id, ttl_s)

    def issue_pass_for(self, key_id: str, ttl_s: float) -> str | None:
        """:meth:`issue_pass` for the key of id ``key_id`` (``admin``: the admin key)."""
        if not self._pass_keys:
            return None
        expires = int(self.clock() + max(1.0, ttl_s)) + 1
        body = f"{key_id}.{expires}"
        return f"{PASS_PREFIX}{body}.{_sign(self._pass_keys[0], body)}"

    def _resolve_pass(self, secret: str) -> Principal | str:
        body, _, signature = secret[len(PASS_PREFIX):].rpartition(".")
        key_id, _, expires = body.partition(".")
        if not (key_id and expires.isdigit() and signature) or not any(
            hmac.compare_digest(_sign(k, body), signature) for k in self._pass_keys
        ):
            return INVALID
        if int(expires) <= self.clock():
            return "this model pass expired"
        if key_id == ADMIN_PRINCIPAL.key_id:
            return _ADMIN_PASS
        cached = self._by_key.get(key_id)
        if cached is None or time.monotonic() - cached.checked >= self.recheck_s:
            started = time.monotonic()
            with self.engine.connect() as conn:
                row = conn.execute(_by_id, {"id": key_id}).first()
            if row is None or row.revoked_at is not None:
                return INVALID if row is None else REVOKED
            key = KeyRecord.from_row(row).principal()
            scopes = frozenset({INFERENCE}) if key.has_scope(INFERENCE) else frozenset()
            cached = _Cached(replace(key, scopes=scopes), started)
            with self._lock:
                if len(self._by_key) >= self._cache_size:
                    self._by_key.clear()
                self._by_key[key_id] = cached
        principal = cached.principal
        if principal.expires_at is not None and principal.expires_at <= self.clock():
            return f"this API key expired at {iso(principal.expires_at)}"
        return principal

    def _remember(self, h: str, principal: Principal, checked: float) -> None:
        with self._lock:
            if h in self._unknown:
                # Refused for good while this read ran (a revocation or rotation here).
                return
            self._cache[h] = _Cached(principal, checked)
            self._cache.move_to_end(h)
            self._hash_of[principal.key_id] = h
            while len(self._cache) > self._cache_size:
                _old, dropped = self._cache.popitem(last=False)
                self._hash_of.pop(dropped.principal.key_id, None)

    def _forget(self, h: str, *, refused: str | None = None) -> None:
        """Drop a cached principal; ``refused``: remember why the hash is refused for good."""
        with self._lock:
            dropped = self._cache.pop(h, None)
            if dropped is not None:
                self._hash_of.pop(dropped.principal.key_id, None)
            if refused is not None:
                self._unknown[h] = refused
                while len(self._unknown) > self._cache_size:
                    self._unknown.popitem(last=False)

    def _changed(self, key_id: str, *, refused: str | None = None) -> None:
        """Drop this server's cached copy of a key that just changed here (``refused``: its
        secret is now refused for good, and why)."""
        h = self._hash_of.get(key_id)
        if h is not None:
            self._forget(h, refused=refused)
        self._by_key.pop(key_id, None)

    # -- reading -------------------------------------------------------------------------

    def get(self, key_id: str) -> KeyRecord:
        with self.engine.connect() as conn:
            return self._get(conn, key_id)

    def _get(self, conn: Connection, key_id: str, *, lock: bool = False) -> KeyRecord:
        # FOR NO KEY UPDATE: an admission in flight holds a key-share lock on the row (its
        # usage rows reference it), which a plain FOR UPDATE would wait for.
        q = _by_id.with_for_update(key_share=True) if lock else _by_id
        row = conn.execute(q, {"id": key_id}).first()
        if row is None:
            raise NotFound(f"no key with id '{key_id}'", where="id")
        return KeyRecord.from_row(row)

    def list(
        self,
        *,
        tenant: str | None = ANY_TENANT,
        include_revoked: bool = True,
        limit: int = 100,
        offset: int = 0,
    ) -> list[KeyRecord]:
        """Keys, oldest first; ``tenant``: only that tenant's (``None``: keys without one)."""
        if not 1 <= limit <= MAX_PAGE:
            raise Invalid(f"limit must be between 1 and {MAX_PAGE}", where="limit")
        if offset < 0:
            raise Invalid("offset must not be negative", where="offset")
        q = sa.select(api_keys).order_by(_a.created_at, _a.id).limit(limit).offset(offset)
        if tenant is not ANY_TENANT:
            q = q.where(_a.tenant.is_(None) if tenant is None else _a.tenant == tenant)
        if not include_revoked:
            q = q.where(_a.revoked_at.is_(None))
        with self.engine.connect() as conn:
            return [KeyRecord.from_row(r) for r in conn.execute(q)]

    # -- changes -------------------------------------------------------------------------

    def create(
        self,
        *,
        name: str,
        scopes: Iterable[str],
        tenant: str | None = None,
        limits: Mapping[str, Any] | Limits | None = None,
        models: Iterable[str] | None = None,
        expires_at: object = None,
        actor: Principal | None = None,
    ) -> IssuedKey:
        """A new key; its secret is in the answer and nowhere else."""
        now = self.clock()
        parsed_limits = limits if isinstance(limits, Limits) else Limits.parse(limits)
        expires = parse_time(expires_at, "expires_at")
        if expires is not None and expires <= now:
            raise Invalid("expires_at must be in the future", where="expires_at")
        secret = new_secret()
        record = KeyRecord(
            id=new_id("key_"),
            name=parse_name(name),
            tenant=parse_tenant(tenant),
            scopes=parse_scopes(scopes),
            limits=parsed_limits,
            models=parse_models(models),
            expires_at=expires,
            prefix=display_prefix(secret),
            version=1,
            created_at=now,
            updated_at=now,
            revoked_at=None,
            created_by=actor.key_id if actor else None,
        )
        with self.engine.begin() as conn:
            conn.execute(sa.insert(api_keys).values({**_row(record), "secret_hash": hash_secret(secret)}))
            conn.execute(
                sa.insert(key_usage).values(
                    key_id=record.id, minute_mark=0.0, day_mark=0.0, requests_m=0, tokens_m=0,
                    runs_m=0, tokens_d=0, cpu_d=0.0,
                )
            )
            self.audit.record(
                actions.KEY_CREATED, actor=actor, target=_target(record),
                details=_summary(record), conn=conn,
            )
        return IssuedKey(record, secret)

    def patch(
        self, key_id: str, changes: Mapping[str, Any], *, actor: Principal | None = None
    ) -> KeyRecord:
        """Change a key's ``name``, ``scopes``, ``limits`` (merged: a limit set to null is
        removed), ``models`` (null: every model) or ``expires_at`` (null: never)."""
        if not isinstance(changes, Mapping):
            raise Invalid("a key patch must be an object")
        for field in changes:
            if field not in PATCHABLE:
                hint = " (a key's tenant cannot change)" if field == "tenant" else ""
                raise Invalid(
                    f"'{field}' cannot be changed{hint}; a patch may set {', '.join(PATCHABLE)}",
                    where=field,
                )
        now = self.clock()
        with self.engine.begin() as conn:
            old = self._get(conn, key_id, lock=True)
            if old.revoked_at is not None:
                raise Conflict(f"key '{key_id}' is revoked", where="id")
            new = old
            if "name" in changes:
                new = replace(new, name=parse_name(changes["name"]))
            if "scopes" in changes:
                new = replace(new, scopes=parse_scopes(changes["scopes"]))
            if "limits" in changes:
                value = changes["limits"]
                new = replace(new, limits=Limits() if value is None else old.limits.merged(value))
            if "models" in changes:
                new = replace(new, models=parse_models(changes["models"]))
            if "expires_at" in changes:
                expires = parse_time(changes["expires_at"], "expires_at")
                if expires is not None and expires <= now:
                    raise Invalid("expires_at must be in the future", where="expires_at")
                new = replace(new, expires_at=expires)
            diff = _diff(old, new)
            if not diff:
                return old
            new = replace(new, version=old.version + 1, updated_at=now)
            conn.execute(
                sa.update(api_keys)
                .where(_a.id == key_id)
                .values(
                    name=new.name,
                    scopes=sorted(new.scopes),
                    limits=new.limits.to_dict(),
                    models=list(new.models) if new.models is not None else None,
                    expires_at=new.expires_at,
                    version=new.version,
                    updated_at=now,
                )
            )
            self.audit.record(
                actions.KEY_CHANGED, actor=actor, target=_target(new), details=diff, conn=conn
            )
        self._changed(key_id)
        return new

    def revoke(self, key_id: str, *, actor: Principal | None = None) -> KeyRecord:
        """Revoke a key for good (revoking a revoked key changes nothing)."""
        now = self.clock()
        with self.engine.begin() as conn:
            old = self._get(conn, key_id, lock=True)
            if old.revoked_at is not None:
                return old
            new = replace(old, revoked_at=now, updated_at=now, version=old.version + 1)
            conn.execute(
                sa.update(api_keys)
                .where(_a.id == key_id)
                .values(revoked_at=now, updated_at=now, version=new.version)
            )
            self.audit.record(
                actions.KEY_REVOKED, actor=actor, target=_target(new), details={}, conn=conn
            )
        self._changed(key_id, refused=REVOKED)
        return new

    def rotate(self, key_id: str, *, actor: Principal | None = None) -> IssuedKey:
        """A new secret for a key; the old one stops working (on every server within a
        second). Its id, limits and usage windows stay as they were: usage belongs to the
        key, not to the secret."""
        now = self.clock()
        secret = new_secret()
        with self.engine.begin() as conn:
            old = self._get(conn, key_id, lock=True)
            if old.revoked_at is not None:
                raise Conflict(f"key '{key_id}' is revoked", where="id")
            new = replace(
                old, prefix=display_prefix(secret), version=old.version + 1, updated_at=now
            )
            conn.execute(
                sa.update(api_keys)
                .where(_a.id == key_id)
                .values(
                    secret_hash=hash_secret(secret),
                    prefix=new.prefix,
                    version=new.version,
                    updated_at=now,
                )
            )
            self.audit.record(
                actions.KEY_ROTATED, actor=actor, target=_target(new),
                details={"old_prefix": old.prefix, "prefix": new.prefix}, conn=conn,
            )
        self._changed(key_id, refused=INVALID)
        return IssuedKey(new, secret)


# The configured admin's runs call models as the admin, with only the inference scope.
_ADMIN_PASS = replace(ADMIN_PRINCIPAL, scopes=frozenset({INFERENCE}))


def _sign(key: bytes, body: str) -> str:
    digest = hmac.new(key, body.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _row(record: KeyRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "name": record.name,
        "tenant": record.tenant,
        "scopes": sorted(record.scopes),
        "limits": record.limits.to_dict(),
        "models": list(record.models) if record.models is not None else None,
        "expires_at": record.expires_at,
        "prefix": record.prefix,
        "version": record.version,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "revoked_at": record.revoked_at,
        "created_by": record.created_by,
    }


def _target(record: KeyRecord) -> str:
    return f"key:{record.id}"


def _summary(record: KeyRecord) -> dict[str, Any]:
    """What the audit log says of a key (never its secret or hash)."""
    data = record.to_dict(record.created_at)
    return {
        k: data[k]
        for k in ("name", "tenant", "scopes", "limits", "models", "prefix", "expires_at")
    }


def _diff(old: KeyRecord, new: KeyRecord) -> dict[str, Any]:
    """The fields that differ, as ``{field: {"from": …, "to": …}}`` in their JSON form."""
    a, b = old.to_dict(old.updated_at), new.to_dict(old.updated_at)
    return {f: {"from": a[f], "to": b[f]} for f in PATCHABLE if a[f] != b[f]}
