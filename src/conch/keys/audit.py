"""The audit log: an append-only record of who changed what (``audit_log``).

Each entry is a time, the acting key (its id and name as they were then, and its tenant), an
action, the thing acted on, and details (JSON). Nothing here updates or deletes an entry, and
the database refuses to (triggers made by the ``0007_keys`` migration), so an entry written
stays as written.

Actions (:data:`ACTIONS`): ``key.created``, ``key.changed``, ``key.rotated``, ``key.revoked``
(written by :class:`conch.keys.service.KeyService` in the transaction that makes the change),
``approval.decided`` (with the edited arguments, when there were any),
``marketplace.published``, ``model.pulled`` and ``model.deleted``. The last four have a
helper each, for their call sites in orchestration, the marketplace and the model store.

Reading is newest first with keyset pagination (``before``: the smallest id of the previous
page), so a page never repeats or skips an entry while new ones are written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from conch.errors import Invalid
from conch.keys.records import Principal, iso, parse_time
from conch.keys.tables import audit_log

KEY_CREATED = "key.created"
KEY_CHANGED = "key.changed"
KEY_ROTATED = "key.rotated"
KEY_REVOKED = "key.revoked"
APPROVAL_DECIDED = "approval.decided"
MARKETPLACE_PUBLISHED = "marketplace.published"
MODEL_PULLED = "model.pulled"
MODEL_DELETED = "model.deleted"

ACTIONS: tuple[str, ...] = (
    KEY_CREATED,
    KEY_CHANGED,
    KEY_ROTATED,
    KEY_REVOKED,
    APPROVAL_DECIDED,
    MARKETPLACE_PUBLISHED,
    MODEL_PULLED,
    MODEL_DELETED,
)

MAX_PAGE = 500


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: float
    actor_id: str | None
    actor_name: str | None
    tenant: str | None
    action: str
    target: str | None
    details: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": iso(self.at),
            "actor": {"id": self.actor_id, "name": self.actor_name, "tenant": self.tenant},
            "action": self.action,
            "target": self.target,
            "details": self.details,
        }


@dataclass(frozen=True, slots=True)
class AuditPage:
    entries: list[AuditEntry]
    # Pass as ``before`` for the next (older) page; None: this was the last.
    next_before: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "entries": [e.to_dict() for e in self.entries],
            "next_before": self.next_before,
        }


class AuditLog:
    def __init__(self, engine: Engine, *, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.clock = clock

    # -- writing ------------------------------------------------------------------------

    def record(
        self,
        action: str,
        *,
        actor: Principal | None,
        target: str | None = None,
        details: Mapping[str, Any] | None = None,
        conn: Connection | None = None,
    ) -> int:
        """Append an entry; returns its id. ``actor`` None: conch itself, or a server without
        keys. ``conn``: write in that transaction (so the entry commits with its change)."""
        if action not in ACTIONS:
            raise ValueError(f"unknown audit action {action!r}")
        row = {
            "at": self.clock(),
            "actor_id": actor.key_id if actor else None,
            "actor_name": actor.name if actor else None,
            "tenant": actor.tenant if actor else None,
            "action": action,
            "target": target,
            "details": dict(details or {}),
        }
        insert = sa.insert(audit_log).values(row).returning(audit_log.c.id)
        if conn is not None:
            return int(conn.execute(insert).scalar_one())
        with self.engine.begin() as own:
            return int(own.execute(insert).scalar_one())

    def approval_decided(
        self,
        actor: Principal | None,
        *,
        task_id: str,
        call_id: str,
        decision: str,
        tool: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        edited_arguments: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> int:
        """A person (``actor``) approved or rejected an agent's pending call; with the
        arguments the call had and, when they were edited, the arguments it runs with."""
        details: dict[str, Any] = {"call_id": call_id, "decision": decision}
        if tool is not None:
            details["tool"] = tool
        if arguments is not None:
            details["arguments"] = dict(arguments)
        if edited_arguments is not None:
            details["edited_arguments"] = dict(edited_arguments)
        if reason:
            details["reason"] = reason
        return self.record(APPROVAL_DECIDED, actor=actor, target=f"task:{task_id}", details=details)

    def marketplace_published(
        self, actor: Principal | None, *, name: str, version: str, digest: str | None = None
    ) -> int:
        details: dict[str, Any] = {"name": name, "version": version}
        if digest:
            details["digest"] = digest
        return self.record(
            MARKETPLACE_PUBLISHED, actor=actor, target=f"agent:{name}@{version}", details=details
        )

    def model_pulled(
        self,
        actor: Principal | None,
        *,
        model: str,
        source: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> int:
        data = dict(details or {})
        if source:
            data["source"] = source
        return self.record(MODEL_PULLED, actor=actor, target=f"model:{model}", details=data)

    def model_deleted(self, actor: Principal | None, *, model: str) -> int:
        return self.record(MODEL_DELETED, actor=actor, target=f"model:{model}")

    # -- reading ------------------------------------------------------------------------

    def read(
        self,
        *,
        action: str | None = None,
        actor_id: str | None = None,
        tenant: str | None = None,
        target: str | None = None,
        since: object = None,
        until: object = None,
        before: int | None = None,
        limit: int = 50,
    ) -> AuditPage:
        """Entries newest first, filtered by each argument given (``target`` exact, or a
        prefix when it ends with ``*``; ``since``/``until`` as Unix seconds or ISO-8601)."""
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
            raise Invalid(f"limit must be between 1 and {MAX_PAGE}", where="limit")
        if action is not None and action not in ACTIONS:
            raise Invalid(
                f"unknown action {action!r}; the actions are {', '.join(ACTIONS)}", where="action"
            )
        a = audit_log.c
        q = sa.select(audit_log).order_by(a.id.desc()).limit(limit + 1)
        if action is not None:
            q = q.where(a.action == action)
        if actor_id is not None:
            q = q.where(a.actor_id == actor_id)
        if tenant is not None:
            q = q.where(a.tenant == tenant)
        if target is not None:
            if target.endswith("*"):
                prefix = target[:-1].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
                q = q.where(a.target.like(prefix + "%", escape="\\"))
            else:
                q = q.where(a.target == target)
        start = parse_time(since, "since")
        end = parse_time(until, "until")
        if start is not None:
            q = q.where(a.at >= start)
        if end is not None:
            q = q.where(a.at < end)
        if before is not None:
            q = q.where(a.id < before)
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        entries = [
            AuditEntry(
                id=r.id,
                at=r.at,
                actor_id=r.actor_id,
                actor_name=r.actor_name,
                tenant=r.tenant,
                action=r.action,
                target=r.target,
                details=r.details or {},
            )
            for r in rows[:limit]
        ]
        return AuditPage(entries, entries[-1].id if len(rows) > limit else None)
