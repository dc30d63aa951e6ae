"""Scopes: what a key may do, and the one check every route makes.

=======================  ==================================================================
``inference``            chat, completions, responses, messages, embeddings, the Ollama API
``models:write``         pull, convert and delete models
``execute``              execute, eval, call, pipeline and their streams
``sessions``             sessions and their files
``orchestration``        agents, tasks, workflows, threads
``approve``              deciding an agent's pending calls (separate from ``orchestration``,
                         so that an agent's own key cannot approve its actions)
``marketplace:publish``  publishing to the marketplace
``admin``                everything, including keys, usage of every key and the audit log
=======================  ==================================================================

``admin`` implies every other scope. A route that no scope names is admin-only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from conch.errors import Forbidden, Invalid


class Principal(Protocol):
    """What a scope check reads of a caller (``conch.keys.records.Principal`` is one); a
    protocol so that this module, the lowest of the room, imports nothing of it."""

    @property
    def name(self) -> str | None: ...
    @property
    def scopes(self) -> frozenset[str]: ...
    @property
    def is_admin(self) -> bool: ...

INFERENCE = "inference"
MODELS_WRITE = "models:write"
EXECUTE = "execute"
SESSIONS = "sessions"
ORCHESTRATION = "orchestration"
APPROVE = "approve"
MARKETPLACE_PUBLISH = "marketplace:publish"
ADMIN = "admin"

SCOPES: tuple[str, ...] = (
    INFERENCE,
    MODELS_WRITE,
    EXECUTE,
    SESSIONS,
    ORCHESTRATION,
    APPROVE,
    MARKETPLACE_PUBLISH,
    ADMIN,
)
_KNOWN = frozenset(SCOPES)


class MissingScope(Forbidden, code="missing_scope"):
    """The key is known but lacks ``scope`` (``403``, the message names it)."""

    def __init__(self, scope: str, key_name: str | None = None) -> None:
        who = f"key '{key_name}'" if key_name else "this key"
        super().__init__(f"{who} lacks the scope '{scope}' that this request needs")
        self.scope = scope


def parse_scopes(scopes: Iterable[object], where: str = "scopes") -> frozenset[str]:
    """The scopes named, checked: an unknown one is a ``400`` naming it and the known ones."""
    if isinstance(scopes, str | bytes) or not isinstance(scopes, Iterable):
        raise Invalid(f"{where} must be a list of scopes", where=where)
    out: set[str] = set()
    for i, scope in enumerate(scopes):
        if not isinstance(scope, str) or scope not in _KNOWN:
            raise Invalid(
                f"unknown scope {scope!r}; the scopes are {', '.join(SCOPES)}",
                where=f"{where}[{i}]",
            )
        out.add(scope)
    return frozenset(out)


def has_scope(principal: Principal, scope: str) -> bool:
    """Whether ``principal`` may do what ``scope`` names (``admin`` may do everything)."""
    return principal.is_admin or scope in principal.scopes


def require_scope(principal: Principal, scope: str) -> None:
    """Raise :class:`MissingScope` (``403`` naming ``scope``) unless ``principal`` has it."""
    if scope not in _KNOWN:
        # A typo in a route's declaration must not silently make a route open or closed.
        raise ValueError(f"unknown scope {scope!r}")
    if not (principal.is_admin or scope in principal.scopes):
        raise MissingScope(scope, principal.name)
