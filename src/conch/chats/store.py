"""Every read and write of the ``chats`` table (synchronous SQLAlchemy Core; async callers run
these on a worker thread, or inline on SQLite).

Tenants. A chat belongs to the tenant it was made for (``None``: the admin's). Readers pass
the caller's tenant, ``None`` reading every tenant's (the admin): another tenant's chat reads
as not found, never as forbidden, and never appears in a list or a search.

Search. ``q`` finds the chats whose title or messages contain every word of it (the last
word as a prefix, so a query typed so far already finds), best match first: SQLite's FTS5
(porter stemming, so "sorting" finds "sort") or PostgreSQL's ``tsvector`` (English), the
index kept by the database itself (triggers on SQLite, an expression index on PostgreSQL).

Changes are whole-chat writes in one transaction; ``version`` grows with each, and a change
that names the version it was made against is refused (``409``) when another came first,
so two tabs editing one chat cannot overwrite each other silently.
"""

from __future__ import annotations

import builtins
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from conch import errors
from conch.chats.tables import chats

MAX_TITLE = 500
MAX_MESSAGES = 20_000
MAX_IMPORT = 1_000
MAX_PAGE = 500
ROLES = frozenset({"system", "user", "assistant", "tool"})
# What a change may set; anything else is a 400 naming it.
CHANGEABLE = ("title", "renamed", "settings", "messages", "messages_upsert", "version")
CREATABLE = ("title", "renamed", "settings", "messages")

_WORDS = re.compile(r"[^\W_]+")
_c = chats.c


class ChatError(errors.DomainError):
    """The family's root (its classes set the status)."""


class Invalid(ChatError, errors.Invalid):
    pass


class NotFound(ChatError, errors.NotFound):
    pass


class Conflict(ChatError, errors.Conflict):
    pass


def new_id() -> str:
    return "chat_" + secrets.token_hex(8)


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Chat:
    id: str
    tenant: str | None
    title: str
    settings: dict[str, Any]
    messages: list[dict[str, Any]]
    message_count: int
    renamed: bool
    client_id: str | None
    version: int
    created_at: float
    updated_at: float

    @classmethod
    def from_row(cls, row: Any) -> Chat:
        return cls(
            id=row.id,
            tenant=row.tenant,
            title=row.title,
            settings=dict(row.settings or {}),
            messages=list(row.messages or []),
            message_count=int(row.message_count),
            renamed=bool(row.renamed),
            client_id=row.client_id,
            version=int(row.version),
            created_at=float(row.created_at),
            updated_at=float(row.updated_at),
        )

    def summary(self) -> dict[str, Any]:
        """The chat less its messages (what a list shows)."""
        return {
            "id": self.id,
            "title": self.title,
            "renamed": self.renamed,
            "settings": self.settings,
            "message_count": self.message_count,
            "client_id": self.client_id,
            "tenant": self.tenant,
            "version": self.version,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "messages": self.messages}


# -- validation ----------------------------------------------------------------------------


def _title(value: Any, where: str = "title") -> str:
    if not isinstance(value, str):
        raise Invalid(f"{where} must be a string", where=where)
    value = value.strip()
    if len(value) > MAX_TITLE:
        raise Invalid(f"{where} has at most {MAX_TITLE} characters", where=where)
    return value


def _settings(value: Any, where: str = "settings") -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise Invalid(f"{where} must be an object", where=where)
    return dict(value)


def _message(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise Invalid(f"{where} must be an object {{role, content, ...}}", where=where)
    role = value.get("role")
    if role not in ROLES:
        raise Invalid(f"{where}.role must be one of {', '.join(sorted(ROLES))}", where=f"{where}.role")
    if not isinstance(value.get("content", ""), str):
        raise Invalid(f"{where}.content must be a string", where=f"{where}.content")
    mid = value.get("id")
    if mid is not None and (not isinstance(mid, str) or not mid or len(mid) > 200):
        raise Invalid(f"{where}.id must be a non-empty string", where=f"{where}.id")
    return dict(value)


def _messages(value: Any, where: str = "messages") -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Invalid(f"{where} must be an array of messages", where=where)
    if len(value) > MAX_MESSAGES:
        raise Invalid(f"{where}: at most {MAX_MESSAGES} messages", where=where)
    return [_message(m, f"{where}[{i}]") for i, m in enumerate(value)]


def _upsert(messages: list[dict[str, Any]], changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each of ``changes`` replacing the message of its id, or appended."""
    out = list(messages)
    at = {m.get("id"): i for i, m in enumerate(out) if m.get("id") is not None}
    for i, m in enumerate(changes):
        mid = m.get("id")
        if mid is None:
            raise Invalid(f"messages_upsert[{i}].id is required", where=f"messages_upsert[{i}].id")
        if mid in at:
            out[at[mid]] = m
        else:
            at[mid] = len(out)
            out.append(m)
    if len(out) > MAX_MESSAGES:
        raise Invalid(f"a chat has at most {MAX_MESSAGES} messages", where="messages_upsert")
    return out


def _default_title(messages: list[dict[str, Any]]) -> str:
    for m in messages:
        if m.get("role") == "user" and str(m.get("content", "")).strip():
            text = " ".join(str(m["content"]).split())
            return text[:60] + ("…" if len(text) > 60 else "")
    return "New chat"


def _search_text(title: str, messages: list[dict[str, Any]]) -> str:
    return "\n".join([title, *(str(m.get("content", "")) for m in messages)])


def _epoch(value: Any, where: str) -> float | None:
    """A browser's time (milliseconds since the epoch, as ``Date.now()``), or ISO-8601."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise Invalid(f"{where} must be a time", where=where)
    if isinstance(value, int | float):
        return float(value) / 1000.0
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise Invalid(f"{where} must be milliseconds since the epoch or ISO-8601", where=where)


def _match_query(q: str, sqlite: bool) -> str | None:
    words = _WORDS.findall(q.casefold())[:20]
    if not words:
        return None
    if sqlite:
        # Every word (AND), the last as a prefix; quoted, so FTS5's operators are plain text.
        return " ".join([*(f'"{w}"' for w in words[:-1]), f'"{words[-1]}"*'])
    return " & ".join([*words[:-1], words[-1] + ":*"])


class ChatStore:
    """The chats of one database."""

    def __init__(self, engine: Engine, *, clock: Any = time.time) -> None:
        self.engine = engine
        self.clock = clock
        self.sqlite = engine.dialect.name == "sqlite"

    # -- reading ---------------------------------------------------------------------------

    def _row(self, conn: Connection, id: str, tenant: str | None) -> Any:
        row = conn.execute(sa.select(chats).where(_c.id == id)).first()
        if row is None or (tenant is not None and row.tenant != tenant):
            raise NotFound(f"no chat '{id}'", where="id")
        return row

    def get(self, id: str, *, tenant: str | None = None) -> Chat:
        """The chat, if ``tenant`` (None: any) may see it."""
        with self.engine.connect() as conn:
            return Chat.from_row(self._row(conn, id, tenant))

    def list(
        self, *, tenant: str | None = None, q: str | None = None, limit: int = 50, offset: int = 0
    ) -> tuple[int, list[dict[str, Any]]]:
        """``(total, summaries)``: the chats ``tenant`` may see, newest first; with ``q``,
        those matching it, best first, each with a ``snippet`` around the match."""
        if not 1 <= limit <= MAX_PAGE:
            raise Invalid(f"limit must be between 1 and {MAX_PAGE}", where="limit")
        if offset < 0:
            raise Invalid("offset must not be negative", where="offset")
        match = _match_query(q, self.sqlite) if q else None
        if q and match is None:
            return 0, []
        params: dict[str, Any] = {"limit": limit, "offset": offset, "tenant": tenant, "q": match}
        who = "" if tenant is None else " AND c.tenant = :tenant"
        columns = ("c.id, c.tenant, c.title, c.settings, c.message_count, c.renamed, "
                   "c.client_id, c.version, c.created_at, c.updated_at")  # fmt: skip
        if match is None:
            sql = (f"SELECT {columns}, count(*) OVER () AS total, NULL AS snippet FROM chats c "
                   f"WHERE 1 = 1{who} ORDER BY c.updated_at DESC, c.id LIMIT :limit OFFSET :offset")  # fmt: skip
        elif self.sqlite:
            # Ranked and counted over ids and scores (FTS5's bm25 cannot be evaluated inside
            # a window), the snippets made for the page alone.
            matches = ("SELECT c.id, c.updated_at, bm25(chats_fts, 4.0, 1.0) AS score "
                       "FROM chats_fts JOIN chats c ON c.rowid = chats_fts.rowid "
                       f"WHERE chats_fts MATCH :q{who}")  # fmt: skip
            page = (f"SELECT m.id, m.score, count(*) OVER () AS total FROM ({matches}) AS m "
                    "ORDER BY m.score, m.updated_at DESC, m.id LIMIT :limit OFFSET :offset")  # fmt: skip
            sql = (f"SELECT {columns}, p.total, snippet(chats_fts, 1, '', '', '…', 12) AS snippet "
                   "FROM chats_fts JOIN chats c ON c.rowid = chats_fts.rowid "
                   f"JOIN ({page}) AS p ON p.id = c.id WHERE chats_fts MATCH :q "
                   "ORDER BY p.score, c.updated_at DESC, c.id")  # fmt: skip
        else:
            vector = "to_tsvector('english', c.search_text)"
            query = "to_tsquery('english', :q)"
            page = (f"SELECT c.id, count(*) OVER () AS total, ts_rank({vector}, {query}) AS score "
                    f"FROM chats c WHERE {vector} @@ {query}{who} "
                    "ORDER BY score DESC, c.updated_at DESC, c.id LIMIT :limit OFFSET :offset")  # fmt: skip
            # The headline is made for the page alone (it reads the whole text).
            sql = (f"SELECT {columns}, p.total, ts_headline('english', c.search_text, {query}, "
                   "'StartSel=\"\", StopSel=\"\", MaxWords=24, MinWords=8') AS snippet "
                   f"FROM ({page}) AS p JOIN chats c ON c.id = p.id "
                   "ORDER BY p.score DESC, c.updated_at DESC, c.id")  # fmt: skip
        with self.engine.connect() as conn:
            typed = sa.text(sql).columns(settings=sa.JSON)
            rows = conn.execute(typed, params).mappings().all()
        total = int(rows[0]["total"]) if rows else 0
        out = []
        for r in rows:
            summary = Chat.from_row(_Row({**r, "messages": []})).summary()
            if match is not None:
                summary["snippet"] = " ".join(str(r["snippet"] or "").split())
            out.append(summary)
        if not rows and offset:
            total = self._count(tenant, match)
        return total, out

    def _count(self, tenant: str | None, match: str | None) -> int:
        """The number of chats a list would have (for a page past the last)."""
        who = "" if tenant is None else " AND c.tenant = :tenant"
        if match is None:
            sql = f"SELECT count(*) FROM chats c WHERE 1 = 1{who}"
        elif self.sqlite:
            sql = ("SELECT count(*) FROM chats_fts JOIN chats c ON c.rowid = chats_fts.rowid "
                   f"WHERE chats_fts MATCH :q{who}")  # fmt: skip
        else:
            sql = ("SELECT count(*) FROM chats c WHERE to_tsvector('english', c.search_text) @@ "
                   f"to_tsquery('english', :q){who}")  # fmt: skip
        with self.engine.connect() as conn:
            return int(conn.execute(sa.text(sql), {"tenant": tenant, "q": match}).scalar() or 0)

    # -- writing ---------------------------------------------------------------------------

    def create(self, body: Mapping[str, Any], *, tenant: str | None) -> Chat:
        """A new chat ``{title?, renamed?, settings?, messages?}`` of ``tenant``."""
        for field in body:
            if field not in CREATABLE:
                raise Invalid(f"unknown field '{field}'; a chat has {', '.join(CREATABLE)}", where=field)
        messages = _messages(body.get("messages"))
        title = _title(body["title"]) if body.get("title") is not None else _default_title(messages)
        renamed = body.get("renamed", False)
        if not isinstance(renamed, bool):
            raise Invalid("renamed must be true or false", where="renamed")
        now = self.clock()
        row = self._new_row(tenant, title, _settings(body.get("settings")), messages, renamed,
                            None, now, now)  # fmt: skip
        with self.engine.begin() as conn:
            conn.execute(sa.insert(chats).values(row))
        return Chat.from_row(_Row(row))

    @staticmethod
    def _new_row(
        tenant: str | None,
        title: str,
        settings: dict[str, Any],
        messages: builtins.list[dict[str, Any]],
        renamed: bool,
        client_id: str | None,
        created: float,
        updated: float,
    ) -> dict[str, Any]:
        return {
            "id": new_id(), "tenant": tenant, "title": title, "settings": settings,
            "messages": messages, "message_count": len(messages), "renamed": renamed,
            "search_text": _search_text(title, messages), "client_id": client_id, "version": 1,
            "created_at": created, "updated_at": updated,
        }  # fmt: skip

    def update(self, id: str, changes: Mapping[str, Any], *, tenant: str | None) -> Chat:
        """Change a chat: ``title``, ``renamed``, ``settings``, ``messages`` (all of them),
        ``messages_upsert`` (each replaces the message of its id, or is appended); with
        ``version``, only if the chat is still at that version (``409`` otherwise)."""
        if not isinstance(changes, Mapping):
            raise Invalid("a chat change must be an object")
        for field in changes:
            if field not in CHANGEABLE:
                raise Invalid(
                    f"'{field}' cannot be changed; a change may set {', '.join(CHANGEABLE)}",
                    where=field,
                )
        if "messages" in changes and "messages_upsert" in changes:
            raise Invalid("give messages or messages_upsert, not both", where="messages_upsert")
        expected = changes.get("version")
        if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int)):
            raise Invalid("version must be an integer", where="version")
        with self.engine.begin() as conn:
            row = self._row(conn, id, tenant)
            if expected is not None and expected != row.version:
                raise Conflict(
                    f"chat '{id}' is at version {row.version}, not {expected}: it changed meanwhile",
                    where="version",
                )
            title, messages = row.title, list(row.messages or [])
            values: dict[str, Any] = {}
            if "title" in changes:
                values["title"] = title = _title(changes["title"])
            if "renamed" in changes:
                if not isinstance(changes["renamed"], bool):
                    raise Invalid("renamed must be true or false", where="renamed")
                values["renamed"] = changes["renamed"]
            if "settings" in changes:
                values["settings"] = _settings(changes["settings"])
            if "messages" in changes:
                messages = _messages(changes["messages"])
            elif "messages_upsert" in changes:
                messages = _upsert(messages, _messages(changes["messages_upsert"], "messages_upsert"))
            if "messages" in changes or "messages_upsert" in changes:
                values["messages"] = messages
                values["message_count"] = len(messages)
            if "title" in values or "messages" in values:
                values["search_text"] = _search_text(title, messages)
            if not values:
                return Chat.from_row(row)
            values["version"] = row.version + 1
            values["updated_at"] = max(self.clock(), row.updated_at)
            conn.execute(sa.update(chats).where(_c.id == id).values(values))
            got = conn.execute(sa.select(chats).where(_c.id == id)).one()
        return Chat.from_row(got)

    def delete(self, id: str, *, tenant: str | None) -> None:
        with self.engine.begin() as conn:
            self._row(conn, id, tenant)
            conn.execute(sa.delete(chats).where(_c.id == id))

    def import_chats(
        self, items: Iterable[Any], *, tenant: str | None
    ) -> builtins.list[dict[str, Any]]:
        """A browser's chats (the studio's IndexedDB records ``{id, title, renamed?, created,
        updated, settings, messages}``, times in milliseconds) into ``tenant``'s, all or
        none. Importing a chat again changes nothing unless the browser's copy is newer,
        which replaces the server's. Returns ``[{client_id, id, status}]`` (``created``,
        ``updated`` or ``unchanged``)."""
        if not isinstance(items, list):
            raise Invalid("chats must be an array", where="chats")
        if len(items) > MAX_IMPORT:
            raise Invalid(f"at most {MAX_IMPORT} chats per import", where="chats")
        parsed = [self._imported(item, f"chats[{i}]") for i, item in enumerate(items)]
        seen: set[str] = set()
        for i, p in enumerate(parsed):
            if p["client_id"] in seen:
                raise Invalid(f"chats[{i}].id repeats an earlier chat's", where=f"chats[{i}].id")
            seen.add(p["client_id"])
        out: builtins.list[dict[str, Any]] = []
        now = self.clock()
        with self.engine.begin() as conn:
            for p in parsed:
                q = sa.select(chats).where(_c.client_id == p["client_id"])
                q = q.where(_c.tenant.is_(None) if tenant is None else _c.tenant == tenant)
                existing = conn.execute(q).first()
                created = p["created"] or now
                updated = p["updated"] or created
                if existing is None:
                    row = self._new_row(tenant, p["title"], p["settings"], p["messages"],
                                        p["renamed"], p["client_id"], created, updated)  # fmt: skip
                    conn.execute(sa.insert(chats).values(row))
                    out.append({"client_id": p["client_id"], "id": row["id"], "status": "created"})
                elif updated > existing.updated_at:
                    values = {
                        "title": p["title"], "settings": p["settings"], "messages": p["messages"],
                        "message_count": len(p["messages"]), "renamed": p["renamed"],
                        "search_text": _search_text(p["title"], p["messages"]),
                        "version": existing.version + 1, "updated_at": updated,
                    }  # fmt: skip
                    conn.execute(sa.update(chats).where(_c.id == existing.id).values(values))
                    out.append({"client_id": p["client_id"], "id": existing.id, "status": "updated"})
                else:
                    out.append({"client_id": p["client_id"], "id": existing.id, "status": "unchanged"})
        return out

    @staticmethod
    def _imported(item: Any, where: str) -> dict[str, Any]:
        if not isinstance(item, Mapping):
            raise Invalid(f"{where} must be a chat object", where=where)
        cid = item.get("id")
        if not isinstance(cid, str) or not cid or len(cid) > 200:
            raise Invalid(f"{where}.id must be the chat's id in the browser", where=f"{where}.id")
        messages = _messages(item.get("messages"), f"{where}.messages")
        raw_title = item.get("title")
        title = _title(raw_title, f"{where}.title") if raw_title else _default_title(messages)
        renamed = item.get("renamed", False)
        return {
            "client_id": cid,
            "title": title or _default_title(messages),
            "renamed": bool(renamed),
            "settings": _settings(item.get("settings"), f"{where}.settings"),
            "messages": messages,
            "created": _epoch(item.get("created"), f"{where}.created"),
            "updated": _epoch(item.get("updated"), f"{where}.updated"),
        }


class _Row:
    """A mapping read as a row (attribute access), for :meth:`Chat.from_row`."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.__dict__.update(data)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)
