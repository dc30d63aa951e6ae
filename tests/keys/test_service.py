"""Keys: create, list, read, patch, revoke, rotate, authenticate; the secret is never stored;
a change on one server is seen by another on the same database within a second."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from conch import db
from conch.config import Settings
from conch.errors import Conflict, Invalid, NotFound, Unauthorized
from conch.keys import ADMIN_PRINCIPAL, KeyService, Limits
from conch.keys.tables import api_keys
from tests.keys.conftest import Room, StatementCounter, make_room


def _dump(engine: sa.Engine) -> str:
    """Every value of every table, as text."""
    out: list[str] = []
    with engine.connect() as conn:
        for name in sa.inspect(conn).get_table_names():
            out.extend(repr(tuple(r)) for r in conn.exec_driver_sql(f'SELECT * FROM "{name}"'))
    return "\n".join(out)


def test_create_returns_the_secret_once_and_stores_only_its_hash(room: Room) -> None:
    issued = room.keys.create(
        name="alice",
        tenant="team-a",
        scopes=["inference", "execute"],
        limits={"requests_per_minute": 10, "tokens_per_day": 10_000},
        models=["local:*", "openai:gpt-4o"],
        expires_at="2999-01-01T00:00:00Z",
    )
    secret = issued.secret
    assert secret.startswith("ck-") and len(secret) >= 3 + 43
    record = issued.record
    assert record.id.startswith("key_") and record.prefix == secret[:11]
    assert record.limits == Limits(requests_per_minute=10, tokens_per_day=10_000)
    shown = issued.to_dict()
    assert shown["secret"] == secret and shown["status"] == "active"
    assert shown["expires_at"] == "2999-01-01T00:00:00.000Z"
    assert "secret" not in record.to_dict() and "secret_hash" not in record.to_dict()

    dump = _dump(room.engine)
    assert secret not in dump and secret[11:] not in dump
    digest = hashlib.sha256(secret.encode()).hexdigest()
    with room.engine.connect() as conn:
        assert conn.execute(sa.select(api_keys.c.secret_hash)).scalar_one() == digest
    # The secret appears nowhere later either: not in get, list or the audit log.
    assert secret not in repr(room.keys.get(record.id).to_dict())
    assert secret not in repr([r.to_dict() for r in room.keys.list()])
    assert secret not in repr(room.audit.read().to_dict())

    principal = room.keys.authenticate(secret)
    assert principal is not None
    assert (principal.key_id, principal.name, principal.tenant) == (record.id, "alice", "team-a")
    assert principal.scopes == {"inference", "execute"} and not principal.is_admin
    assert principal.allows_model("local:smollm2") and principal.allows_model("openai:gpt-4o")
    assert not principal.allows_model("openai:gpt-4o-mini")


def test_two_keys_have_different_secrets_and_unknown_secrets_fail(room: Room) -> None:
    a = room.keys.create(name="a", scopes=[])
    b = room.keys.create(name="b", scopes=[])
    assert a.secret != b.secret and a.record.id != b.record.id
    assert room.keys.authenticate(a.secret[:-1] + ("x" if a.secret[-1] != "x" else "y")) is None
    assert room.keys.authenticate("") is None and room.keys.authenticate(None) is None
    assert room.keys.authenticate("Bearer " + a.secret) is None
    with pytest.raises(Unauthorized, match="invalid API key"):
        room.keys.verify("ck-" + "A" * 43)
    with pytest.raises(Unauthorized, match="missing"):
        room.keys.verify(None)


def test_the_admin_key_and_api_key_authenticate_as_admin(engine: sa.Engine) -> None:
    settings = Settings(api_key="old-api-key", admin_key="new-admin-key")
    keys = KeyService.from_settings(engine, settings)
    assert keys.has_admin_key
    assert keys.authenticate("new-admin-key") is ADMIN_PRINCIPAL
    assert keys.authenticate("old-api-key") is ADMIN_PRINCIPAL
    assert keys.authenticate("new-admin-key ") is None
    assert ADMIN_PRINCIPAL.tenant is None and ADMIN_PRINCIPAL.is_admin
    assert ADMIN_PRINCIPAL.limits.empty and ADMIN_PRINCIPAL.configured
    # Only api_key set (today's single-user install): it is the admin.
    only = KeyService.from_settings(engine, Settings(api_key="k"))
    assert only.authenticate("k") is ADMIN_PRINCIPAL
    assert not KeyService.from_settings(engine, Settings()).has_admin_key


def test_admin_key_setting_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCH_ADMIN_KEY", "from-env")
    settings = Settings()
    assert settings.admin_key == "from-env"
    assert settings.public_dict()["admin_key"] == "***"


def test_invalid_requests_name_the_field(room: Room) -> None:
    cases = [
        ({"name": "", "scopes": []}, "name"),
        ({"name": "x" * 101, "scopes": []}, "name"),
        ({"name": "a", "scopes": ["inference", "root"]}, "scopes[1]"),
        ({"name": "a", "scopes": "inference"}, "scopes"),
        ({"name": "a", "scopes": [], "limits": {"tokens_per_hour": 5}}, "limits.tokens_per_hour"),
        ({"name": "a", "scopes": [], "limits": {"tokens_per_day": -1}}, "limits.tokens_per_day"),
        ({"name": "a", "scopes": [], "limits": {"tokens_per_day": 1.5}}, "limits.tokens_per_day"),
        ({"name": "a", "scopes": [], "limits": {"concurrent_runs": True}}, "limits.concurrent_runs"),
        ({"name": "a", "scopes": [], "limits": [1]}, "limits"),
        ({"name": "a", "scopes": [], "models": "local:x"}, "models"),
        ({"name": "a", "scopes": [], "models": ["ok", ""]}, "models[1]"),
        ({"name": "a", "scopes": [], "tenant": ""}, "tenant"),
        ({"name": "a", "scopes": [], "expires_at": "yesterday"}, "expires_at"),
        ({"name": "a", "scopes": [], "expires_at": time.time() - 5}, "expires_at"),
    ]
    for body, where in cases:
        with pytest.raises(Invalid) as err:
            room.keys.create(**body)  # type: ignore[arg-type]
        assert err.value.where == where, body
        assert err.value.status == 400
    assert room.keys.list() == []  # nothing half-made
    assert room.audit.read().entries == []


def test_list_get_and_filters(room: Room) -> None:
    a = room.keys.create(name="a", tenant="t1", scopes=["inference"]).record
    room.clock.advance(1)
    b = room.keys.create(name="b", tenant="t2", scopes=["inference"]).record
    room.clock.advance(1)
    c = room.keys.create(name="c", scopes=["admin"]).record
    assert [r.id for r in room.keys.list()] == [a.id, b.id, c.id]
    assert [r.id for r in room.keys.list(tenant="t2")] == [b.id]
    assert [r.id for r in room.keys.list(tenant=None)] == [c.id]
    assert [r.id for r in room.keys.list(limit=1, offset=1)] == [b.id]
    room.keys.revoke(b.id)
    assert [r.id for r in room.keys.list(include_revoked=False)] == [a.id, c.id]
    assert room.keys.get(b.id).to_dict()["status"] == "revoked"
    with pytest.raises(NotFound) as err:
        room.keys.get("key_nope")
    assert err.value.status == 404
    with pytest.raises(Invalid):
        room.keys.list(limit=0)


def test_patch_changes_what_it_names_and_is_audited(room: Room) -> None:
    issued = room.keys.create(
        name="svc", scopes=["inference"], limits={"requests_per_minute": 5, "tokens_per_day": 100}
    )
    key_id = issued.record.id
    room.clock.advance(2)
    new = room.keys.patch(
        key_id,
        {
            "name": "service",
            "scopes": ["inference", "approve"],
            "limits": {"requests_per_minute": None, "tokens_per_minute": 50},
            "models": ["local:*"],
        },
    )
    assert new.name == "service" and new.scopes == {"inference", "approve"}
    assert new.limits == Limits(tokens_per_day=100, tokens_per_minute=50)
    assert new.models == ("local:*",) and new.version == 2
    assert new.updated_at == room.clock.now and new.created_at == issued.record.created_at
    assert room.keys.get(key_id) == new
    entry = room.audit.read(action="key.changed").entries[0]
    assert entry.target == f"key:{key_id}"
    assert entry.details["name"] == {"from": "svc", "to": "service"}
    assert entry.details["limits"]["to"] == {"tokens_per_minute": 50, "tokens_per_day": 100}
    assert set(entry.details) == {"name", "scopes", "limits", "models"}
    # The same key still authenticates, now with the new scopes.
    principal = room.keys.authenticate(issued.secret)
    assert principal is not None and principal.has_scope("approve")

    # A patch that changes nothing writes nothing; models and expiry can be cleared.
    assert room.keys.patch(key_id, {"name": "service"}).version == 2
    cleared = room.keys.patch(key_id, {"models": None, "limits": None})
    assert cleared.models is None and cleared.limits.empty and cleared.version == 3
    for body, where in [
        ({"tenant": "other"}, "tenant"),
        ({"secret": "x"}, "secret"),
        ({"scopes": ["nope"]}, "scopes[0]"),
        ({"limits": {"bogus": 1}}, "limits.bogus"),
        ({"expires_at": 1.0}, "expires_at"),
    ]:
        with pytest.raises(Invalid) as err:
            room.keys.patch(key_id, body)
        assert err.value.where == where
    assert room.keys.get(key_id).version == 3
    with pytest.raises(NotFound):
        room.keys.patch("key_missing", {"name": "x"})


def test_revoke_refuses_the_key_at_once_on_this_server(room: Room) -> None:
    issued = room.keys.create(name="gone", scopes=["inference"])
    assert room.keys.authenticate(issued.secret) is not None  # now cached
    revoked = room.keys.revoke(issued.record.id, actor=ADMIN_PRINCIPAL)
    assert revoked.revoked_at is not None and revoked.to_dict()["status"] == "revoked"
    assert room.keys.authenticate(issued.secret) is None
    with pytest.raises(Unauthorized, match="revoked"):
        room.keys.verify(issued.secret)
    assert room.keys.revoke(issued.record.id) == revoked  # again: no change, no entry
    with pytest.raises(Conflict):
        room.keys.patch(issued.record.id, {"name": "back"})
    with pytest.raises(Conflict):
        room.keys.rotate(issued.record.id)
    entries = room.audit.read(action="key.revoked").entries
    assert len(entries) == 1 and entries[0].actor_id == "admin"


def test_a_second_server_sees_a_revoked_key_revoked_from_the_database(engine: sa.Engine) -> None:
    a, b = make_room(engine), make_room(engine)
    issued = a.keys.create(name="k", scopes=["inference"])
    assert b.keys.authenticate(issued.secret) is not None
    a.keys.revoke(issued.record.id)
    with pytest.raises(Unauthorized, match="revoked"):
        make_room(engine).keys.verify(issued.secret)  # a server that never cached it


def test_rotation_gives_a_new_secret_and_keeps_the_key(room: Room) -> None:
    issued = room.keys.create(name="r", scopes=["execute"], limits={"runs_per_minute": 3})
    assert room.keys.authenticate(issued.secret) is not None
    rotated = room.keys.rotate(issued.record.id)
    assert rotated.secret != issued.secret and rotated.secret.startswith("ck-")
    assert rotated.record.id == issued.record.id
    assert rotated.record.limits == issued.record.limits
    assert rotated.record.prefix == rotated.secret[:11] != issued.record.prefix
    assert room.keys.authenticate(issued.secret) is None
    principal = room.keys.authenticate(rotated.secret)
    assert principal is not None and principal.key_id == issued.record.id
    entry = room.audit.read(action="key.rotated").entries[0]
    assert entry.details == {"old_prefix": issued.record.prefix, "prefix": rotated.record.prefix}
    assert rotated.secret not in _dump(room.engine)


def test_expired_keys_are_refused(room: Room) -> None:
    issued = room.keys.create(name="short", scopes=["inference"], expires_at=room.clock.now + 60)
    assert room.keys.authenticate(issued.secret) is not None
    room.clock.advance(59.9)
    assert room.keys.authenticate(issued.secret) is not None
    room.clock.advance(0.1)
    assert room.keys.authenticate(issued.secret) is None  # from the cache: no recheck needed
    with pytest.raises(Unauthorized, match="expired"):
        room.keys.verify(issued.secret)
    assert room.keys.get(issued.record.id).status(room.clock.now) == "expired"
    # An admin may extend it; then it works again.
    room.keys.patch(issued.record.id, {"expires_at": room.clock.now + 3600})
    assert room.keys.authenticate(issued.secret) is not None


def test_authentication_reads_the_database_at_most_once_per_recheck(engine: sa.Engine) -> None:
    room = make_room(engine, recheck_s=0.2)
    issued = room.keys.create(name="hot", scopes=["inference"])
    counter = StatementCounter(engine)
    try:
        start = time.monotonic()
        calls = 0
        while time.monotonic() - start < 0.5:
            assert room.keys.authenticate(issued.secret) is not None
            calls += 1
        assert calls > 1000
        assert 2 <= counter.count <= 4  # one read per 0.2 s
        # Unknown secrets are remembered as unknown: a flood of one costs one read.
        before = counter.count
        for _ in range(100):
            assert room.keys.authenticate("ck-" + "Z" * 43) is None
        assert counter.count == before + 1
    finally:
        counter.close()


def _seen_within(check: object, limit_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < limit_s + 1:
        if check():  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(0.005)
    return float("inf")


def two_servers_see_changes_within_a_second(url_a: str, url_b: str) -> None:
    """Two services on two engines of one database: what A changes, B applies within 1 s."""
    eng_a, eng_b = db.create_engine(url_a), db.create_engine(url_b)
    try:
        db.migrate(eng_a)
        a, b = KeyService(eng_a), KeyService(eng_b)
        issued = a.create(name="shared", scopes=["inference"], limits={"requests_per_minute": 5})
        secret = issued.secret
        # B has the key cached and is serving it hot from another thread.
        assert b.authenticate(secret) is not None
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                b.authenticate(secret)

        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            time.sleep(0.2)
            a.patch(issued.record.id, {"limits": {"requests_per_minute": 1}, "scopes": ["execute"]})

            def changed() -> bool:
                p = b.authenticate(secret)
                return p is not None and p.limits.requests_per_minute == 1 and p.has_scope("execute")

            assert _seen_within(changed, 1.0) <= 1.0
            a.revoke(issued.record.id)
            assert _seen_within(lambda: b.authenticate(secret) is None, 1.0) <= 1.0
            rotated_key = a.create(name="r", scopes=["inference"])
            assert b.authenticate(rotated_key.secret) is not None
            new = a.rotate(rotated_key.record.id)
            assert _seen_within(lambda: b.authenticate(rotated_key.secret) is None, 1.0) <= 1.0
            assert b.authenticate(new.secret) is not None  # the new secret works at once
        finally:
            stop.set()
            thread.join()
    finally:
        eng_a.dispose()
        eng_b.dispose()


def test_revocation_on_one_server_applies_on_another_within_a_second_sqlite(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    two_servers_see_changes_within_a_second(url, url)

