"""The audit log: every key change is written with its change; approvals, publishes and model
pulls and deletes have their entries; reading filters and pages; the database refuses to
change or delete an entry."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from conch.errors import Invalid
from conch.keys import ADMIN_PRINCIPAL
from conch.keys.audit import ACTIONS
from conch.keys.tables import audit_log
from tests.keys.conftest import Room


def test_key_changes_are_audited_with_their_actor(room: Room) -> None:
    issued = room.keys.create(name="a", tenant="t", scopes=["inference"], actor=ADMIN_PRINCIPAL)
    actor = room.keys.authenticate(issued.secret)
    assert actor is not None
    second = room.keys.create(name="b", scopes=["inference"], actor=actor)
    assert second.record.created_by == issued.record.id
    room.keys.patch(second.record.id, {"name": "b2"}, actor=actor)
    room.keys.rotate(second.record.id, actor=ADMIN_PRINCIPAL)
    room.keys.revoke(second.record.id, actor=ADMIN_PRINCIPAL)
    entries = room.audit.read().entries
    assert [e.action for e in entries] == [
        "key.revoked",
        "key.rotated",
        "key.changed",
        "key.created",
        "key.created",
    ]
    created = entries[3]
    assert (created.actor_id, created.actor_name, created.tenant) == (issued.record.id, "a", "t")
    assert created.details["name"] == "b" and "secret" not in created.details
    assert entries[-1].actor_id == "admin" and entries[-1].actor_name == "admin"
    shown = entries[0].to_dict()
    assert shown["actor"] == {"id": "admin", "name": "admin", "tenant": None}
    assert shown["target"] == f"key:{second.record.id}" and shown["at"].endswith("Z")


def test_a_failed_change_leaves_no_entry(room: Room) -> None:
    issued = room.keys.create(name="a", scopes=[])
    with pytest.raises(Invalid):
        room.keys.patch(issued.record.id, {"scopes": ["nope"]})
    assert [e.action for e in room.audit.read().entries] == ["key.created"]


def test_the_helpers_for_other_call_sites(room: Room) -> None:
    approver = room.keys.authenticate(room.keys.create(name="human", scopes=["approve"]).secret)
    room.audit.approval_decided(
        approver,
        task_id="task_1",
        call_id="call_9",
        decision="approve",
        tool="write_file",
        arguments={"path": "a.txt", "text": "x"},
        edited_arguments={"path": "b.txt", "text": "x"},
    )
    room.audit.marketplace_published(approver, name="csv-analyst", version="1.0.0", digest="sha256:ab")
    room.audit.model_pulled(None, model="smollm2", source="huggingface", details={"bytes": 10})
    room.audit.model_deleted(ADMIN_PRINCIPAL, model="smollm2")
    decided = room.audit.read(action="approval.decided").entries[0]
    assert decided.target == "task:task_1" and decided.actor_name == "human"
    assert decided.details == {
        "call_id": "call_9",
        "decision": "approve",
        "tool": "write_file",
        "arguments": {"path": "a.txt", "text": "x"},
        "edited_arguments": {"path": "b.txt", "text": "x"},
    }
    published = room.audit.read(action="marketplace.published").entries[0]
    assert published.target == "agent:csv-analyst@1.0.0"
    pulled = room.audit.read(action="model.pulled").entries[0]
    assert pulled.actor_id is None and pulled.details == {"bytes": 10, "source": "huggingface"}
    assert room.audit.read(target="model:*").entries[0].action == "model.deleted"
    with pytest.raises(ValueError):
        room.audit.record("key.exploded", actor=None)
    assert set(ACTIONS) >= {e.action for e in room.audit.read(limit=500).entries}


def test_reading_filters_and_pages(room: Room) -> None:
    t0 = room.clock.now
    for i in range(7):
        room.audit.model_pulled(ADMIN_PRINCIPAL if i % 2 else None, model=f"m{i}")
        room.clock.advance(10)
    first = room.audit.read(limit=3)
    assert [e.target for e in first.entries] == ["model:m6", "model:m5", "model:m4"]
    second = room.audit.read(limit=3, before=first.next_before)
    assert [e.target for e in second.entries] == ["model:m3", "model:m2", "model:m1"]
    last = room.audit.read(limit=3, before=second.next_before)
    assert [e.target for e in last.entries] == ["model:m0"] and last.next_before is None
    assert len(room.audit.read(actor_id="admin").entries) == 3
    assert [e.target for e in room.audit.read(since=t0 + 20, until=t0 + 40).entries] == [
        "model:m3",
        "model:m2",
    ]
    assert room.audit.read(target="model:m5").entries[0].target == "model:m5"
    assert room.audit.read(target="model:m_*").entries == []  # _ is not a wildcard
    for kwargs, where in [({"limit": 0}, "limit"), ({"action": "nope"}, "action"),
                          ({"since": "noon"}, "since")]:
        with pytest.raises(Invalid) as err:
            room.audit.read(**kwargs)  # type: ignore[arg-type]
        assert err.value.where == where


def test_the_database_refuses_to_change_or_delete_an_entry(room: Room) -> None:
    room.audit.model_deleted(None, model="x")
    for statement in (
        sa.update(audit_log).values(action="model.pulled"),
        sa.delete(audit_log),
    ):
        with pytest.raises(sa.exc.DatabaseError, match="append-only"), room.engine.begin() as conn:
            conn.execute(statement)
    assert room.audit.read().entries[0].action == "model.deleted"
