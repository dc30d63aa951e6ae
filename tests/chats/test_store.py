"""The chats store on a real SQLite file and a real PostgreSQL cluster: tenants, full-text
search (every word, the last as a prefix, stemmed, best first, with a snippet), changes
with versions and upserted messages, the bulk import of a browser's chats."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from conch import db
from conch.chats import ChatStore
from conch.chats.store import Conflict, Invalid, NotFound
from tests.orchestration.pg import postgres_cluster


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChatStore]:
    if request.param == "sqlite":
        eng = db.create_engine(f"sqlite:///{tmp_path / 'c.db'}")
        db.migrate(eng)
        yield ChatStore(eng)
        eng.dispose()
        return
    with postgres_cluster(tmp_path) as url:
        eng = db.create_engine(url)
        db.migrate(eng)
        yield ChatStore(eng)
        eng.dispose()


def _msg(i: int, role: str, text: str) -> dict[str, str]:
    return {"id": f"m{i}", "role": role, "content": text}


def test_create_read_list_and_tenants(store: ChatStore) -> None:
    a = store.create({"messages": [_msg(1, "user", "How do I sort a table by size?")]}, tenant="acme")
    assert a.title == "How do I sort a table by size?" and a.message_count == 1 and a.version == 1
    b = store.create({"title": "beta's", "settings": {"model": "m"}}, tenant="beta")
    assert store.get(a.id, tenant="acme").messages[0]["content"].startswith("How")
    with pytest.raises(NotFound):
        store.get(a.id, tenant="beta")
    assert [c["id"] for c in store.list(tenant="acme")[1]] == [a.id]
    total, every = store.list(tenant=None)
    assert total == 2 and {c["id"] for c in every} == {a.id, b.id}
    assert "messages" not in every[0]
    with pytest.raises(Invalid) as err:
        store.create({"messages": [{"role": "robot", "content": "x"}]}, tenant=None)
    assert err.value.where == "messages[0].role"
    with pytest.raises(Invalid) as err:
        store.create({"colour": "red"}, tenant=None)
    assert err.value.where == "colour"


def test_search(store: ChatStore) -> None:
    sorting = store.create({"title": "Sorting tables", "messages": [
        _msg(1, "user", "How do I sort a table by size?"),
        _msg(2, "assistant", "Use sort_by with the column name.")]}, tenant="t")
    store.create({"title": "Weather", "messages": [_msg(1, "user", "Will it rain in Lisbon?")]}, tenant="t")
    store.create({"title": "Sorting elsewhere", "messages": [_msg(1, "user", "sort this")]}, tenant="u")
    # Every word must match; the last is a prefix; stemming finds "sorting" for "sort".
    total, found = store.list(tenant="t", q="sort table")
    assert total == 1 and found[0]["id"] == sorting.id
    assert "table" in found[0]["snippet"].lower()
    assert store.list(tenant="t", q="lisb")[1][0]["title"] == "Weather"
    assert store.list(tenant="t", q="sort rain") == (0, [])
    assert store.list(tenant="t", q="  ;;  ") == (0, [])
    # FTS operators are plain words.
    assert store.list(tenant="t", q='sort" OR "rain')[0] == 0
    # Another tenant's chat is never found.
    assert {c["title"] for c in store.list(tenant="t", q="sort")[1]} == {"Sorting tables"}
    assert store.list(tenant=None, q="sort")[0] == 2
    # A change is searchable at once; a deleted chat is gone from the index.
    store.update(sorting.id, {"messages_upsert": [_msg(3, "user", "and by zeppelin?")]}, tenant="t")
    assert store.list(tenant="t", q="zeppelin")[1][0]["id"] == sorting.id
    store.delete(sorting.id, tenant="t")
    assert store.list(tenant="t", q="zeppelin") == (0, [])


def test_changes_versions_and_upserts(store: ChatStore) -> None:
    chat = store.create({"messages": [_msg(1, "user", "hi")]}, tenant=None)
    v2 = store.update(chat.id, {"messages_upsert": [
        {"id": "m2", "role": "assistant", "content": "hel", "status": "streaming"}]}, tenant=None)
    v3 = store.update(chat.id, {"messages_upsert": [
        {"id": "m2", "role": "assistant", "content": "hello", "status": "done"}], "version": 2}, tenant=None)
    assert (v2.version, v3.version) == (2, 3)
    assert [m["content"] for m in v3.messages] == ["hi", "hello"] and v3.messages[1]["status"] == "done"
    with pytest.raises(Conflict):
        store.update(chat.id, {"title": "stale", "version": 2}, tenant=None)
    renamed = store.update(chat.id, {"title": "Greetings", "renamed": True}, tenant=None)
    assert renamed.title == "Greetings" and renamed.renamed and renamed.version == 4
    assert store.update(chat.id, {}, tenant=None).version == 4  # nothing changed
    with pytest.raises(NotFound):
        store.update(chat.id, {"title": "x"}, tenant="someone")
    with pytest.raises(Invalid) as err:
        store.update(chat.id, {"tenant": "x"}, tenant=None)
    assert err.value.where == "tenant"


def test_import_is_idempotent_and_keeps_the_newer_copy(store: ChatStore) -> None:
    browser = [
        {"id": "cA", "title": "first", "created": 1_700_000_000_000, "updated": 1_700_000_100_000,
         "settings": {"model": "x", "temperature": 0.7},
         "messages": [{"id": "m0", "role": "user", "content": "alpha", "at": 1},
                      {"id": "m1", "role": "assistant", "content": "beta", "at": 2, "status": "done"}]},
        {"id": "cB", "title": "", "created": 1_700_000_000_000, "updated": 1_700_000_000_000,
         "settings": {}, "messages": [{"id": "m0", "role": "user", "content": "gamma question"}]},
    ]  # fmt: skip
    out = store.import_chats(browser, tenant="acme")
    assert [o["status"] for o in out] == ["created", "created"]
    again = store.import_chats(browser, tenant="acme")
    assert [o["status"] for o in again] == ["unchanged", "unchanged"]
    assert [o["id"] for o in again] == [o["id"] for o in out]
    newer = [{**browser[0], "updated": 1_700_000_200_000, "title": "first, renamed"}]
    assert store.import_chats(newer, tenant="acme")[0]["status"] == "updated"
    chat = store.get(out[0]["id"], tenant="acme")
    assert chat.title == "first, renamed" and chat.client_id == "cA"
    assert chat.messages[1] == {"id": "m1", "role": "assistant", "content": "beta", "at": 2, "status": "done"}
    assert chat.created_at == 1_700_000_000.0 and chat.updated_at == 1_700_000_200.0
    assert store.get(out[1]["id"], tenant="acme").title == "gamma question"
    assert store.list(tenant="acme", q="alpha")[1][0]["client_id"] == "cA"
    # All or none: a bad chat anywhere imports nothing.
    bad = [{**browser[0], "id": "cC"}, {"id": "cD", "messages": [{"role": 5}]}]
    with pytest.raises(Invalid) as err:
        store.import_chats(bad, tenant="acme")
    assert err.value.where == "chats[1].messages[0].role"
    assert store.list(tenant="acme")[0] == 2
    with pytest.raises(Invalid):
        store.import_chats([browser[0], browser[0]], tenant="beta")


def test_the_search_index_follows_the_table(store: ChatStore) -> None:
    """Rows written past the store (a restore, a migration) are searchable too: the
    database keeps the index, not the store."""
    chat = store.create({"title": "plain"}, tenant=None)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE chats SET search_text = 'quokka sighting' WHERE id = :i"), {"i": chat.id})
    assert store.list(q="quokka")[1][0]["id"] == chat.id
