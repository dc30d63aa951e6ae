"""A session as the domain hands it around (:class:`Session`), and as a client sees it.

:meth:`Session.public` is the shape ``POST /api/v1/sessions`` answers with (``id, status,
created_at, last_used_at, expires_at, limits, workspace_bytes`` and the rest); times are
ISO-8601 UTC with milliseconds and a ``Z``, as the orchestration records render them. The
lease fields stay out of it: which server runs a session is the servers' business.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    tenant: str | None
    status: str  # active | paused (deleting ones are never handed out)
    created_at: float
    last_used_at: float
    expires_at: float
    ttl_s: float
    limits: dict[str, Any]
    allow_network: bool
    allow_process: bool
    workspace_bytes: int
    runs: int
    state_version: int
    lease_owner: str | None
    lease_expires_at: float | None

    @classmethod
    def from_row(cls, row: Any) -> Session:
        m = row._mapping
        return cls(**{name: m[name] for name in cls.__slots__})  # type: ignore[attr-defined]

    def held_by_other(self, owner: str | None, now: float) -> bool:
        """Whether a server other than ``owner`` holds a live lease on the session."""
        return (
            self.lease_owner is not None
            and self.lease_owner != owner
            and self.lease_expires_at is not None
            and self.lease_expires_at > now
        )

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "created_at": iso(self.created_at),
            "last_used_at": iso(self.last_used_at),
            "expires_at": iso(self.expires_at),
            "ttl_s": self.ttl_s,
            "limits": dict(self.limits),
            "allow_network": self.allow_network,
            "allow_process": self.allow_process,
            "workspace_bytes": self.workspace_bytes,
            "runs": self.runs,
        }
