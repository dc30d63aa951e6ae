"""Scopes: a missing one is a 403 naming it; admin implies every other; no unknown scope
passes, in a key or in a route's declaration."""

from __future__ import annotations

import pytest

from conch.errors import DomainError, Forbidden, Invalid
from conch.keys import ADMIN_PRINCIPAL, SCOPES, MissingScope, Principal, require_scope
from conch.keys.scopes import has_scope, parse_scopes
from tests.keys.conftest import Room


def _principal(*scopes: str) -> Principal:
    return Principal(key_id="key_x", name="bob", tenant="t", scopes=frozenset(scopes))


def test_the_scopes_are_the_issues() -> None:
    assert SCOPES == (
        "inference",
        "models:write",
        "execute",
        "sessions",
        "orchestration",
        "approve",
        "marketplace:publish",
        "admin",
    )


def test_each_missing_scope_is_a_403_naming_it() -> None:
    for scope in SCOPES:
        others = [s for s in SCOPES if s not in (scope, "admin")]
        with pytest.raises(MissingScope) as err:
            require_scope(_principal(*others), scope)
        e = err.value
        assert isinstance(e, Forbidden) and isinstance(e, DomainError)
        assert e.status == 403 and e.scope == scope and e.code == "missing_scope"
        assert f"'{scope}'" in e.message and "'bob'" in e.message
        require_scope(_principal(scope), scope)  # having it is enough


def test_admin_implies_every_scope() -> None:
    admin_key = _principal("admin")
    for scope in SCOPES:
        require_scope(admin_key, scope)
        require_scope(ADMIN_PRINCIPAL, scope)
        assert has_scope(admin_key, scope) and admin_key.has_scope(scope)
    assert admin_key.is_admin and not _principal(*SCOPES[:-1]).is_admin


def test_approve_is_separate_from_orchestration() -> None:
    agent = _principal("orchestration", "inference", "execute")
    with pytest.raises(MissingScope, match="approve"):
        require_scope(agent, "approve")


def test_a_route_declaring_an_unknown_scope_is_a_bug_not_an_open_door() -> None:
    with pytest.raises(ValueError, match="unknown scope"):
        require_scope(ADMIN_PRINCIPAL, "inferense")


def test_parse_scopes() -> None:
    assert parse_scopes(["inference", "inference", "admin"]) == {"inference", "admin"}
    assert parse_scopes([]) == frozenset()
    with pytest.raises(Invalid) as err:
        parse_scopes(["inference", "models:read"])
    assert err.value.where == "scopes[1]" and "models:write" in err.value.message


def test_a_key_carries_its_scopes_through_authentication(room: Room) -> None:
    issued = room.keys.create(name="pub", scopes=["marketplace:publish"])
    principal = room.keys.authenticate(issued.secret)
    assert principal is not None
    require_scope(principal, "marketplace:publish")
    with pytest.raises(MissingScope):
        require_scope(principal, "models:write")
