"""The marketplace service: publish, search, list, install and uninstall.

Synchronous SQLAlchemy Core (the routes run it in a worker thread). Everything a publish
writes (the version row, the ``latest`` flags, the search index) is written in one
transaction, so search never sees half a publish.

Installing makes an agent available to orchestration through an :class:`AgentSink`; the
marketplace keeps its own record of what is installed (name, version, digest, origin and the
verified manifest), and hands every installed agent to the sink again when one is attached
(on server start).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, RowMapping

from conch.config import Settings
from conch.marketplace import tables, versions
from conch.marketplace.errors import (
    ConflictError,
    IntegrityError,
    MarketplaceError,
    UpstreamError,
    conflict,
    invalid,
    not_found,
)
from conch.marketplace.federation import Upstream, UpstreamUnavailable
from conch.marketplace.records import (
    MANIFEST_FIELDS,
    MAX_CATEGORY,
    Manifest,
    PublishRequest,
    build_manifest,
    normalise_name,
    slug,
    verify,
)

log = logging.getLogger(__name__)

LOCAL = "local"
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
# How many upstream matches a federated search merges (the upstream's own page limit).
UPSTREAM_WINDOW = MAX_LIMIT

_WORDS = re.compile(r"[^\W_]+")


@dataclass(frozen=True)
class InstalledAgent:
    """An installed agent as orchestration needs it."""

    name: str
    version: str
    digest: str
    origin: str
    description: str
    system_prompt: str
    tools: list[str]
    model: str


class AgentSink(Protocol):
    """Where installed agents go to become runnable (the orchestration agent registry)."""

    def register(self, agent: InstalledAgent) -> None: ...

    def remove(self, name: str) -> bool: ...

    def is_busy(self, name: str) -> bool: ...


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _json_list(value: Any) -> list[str]:
    # Rows read through raw SQL (search, list) carry JSON columns as text on SQLite; rows read
    # through the table (and every row on PostgreSQL) carry them decoded.
    return list(json.loads(value) if isinstance(value, str) else value)


def _record(row: RowMapping) -> dict[str, Any]:
    return {
        "name": row["name"],
        "version": row["version"],
        "description": row["description"],
        "system_prompt": row["system_prompt"],
        "tools": _json_list(row["tools"]),
        "model": row["model"],
        "category": row["category"],
        "tags": _json_list(row["tags"]),
        "author": row["author"],
        "digest": row["digest"],
        "published_at": row["published_at"],
        "downloads": row["downloads"],
    }


def _listed(row: RowMapping) -> dict[str, Any]:
    out = _record(row)
    out["origin"] = LOCAL
    installed_version = row["installed_version"]
    out["installed"] = installed_version is not None
    out["installed_version"] = installed_version
    return out


def _manifest_of(row: RowMapping | dict[str, Any]) -> dict[str, Any]:
    return {f: (_json_list(row[f]) if f in ("tools", "tags") else row[f]) for f in MANIFEST_FIELDS}


def _fts_query(words: list[str]) -> str:
    # Any word may match (bm25 ranks rows matching more of them higher); the last word is a
    # prefix, so a query typed so far ("csv anal") already finds its agent. Words are quoted,
    # so FTS5 operators in the query are plain text.
    terms = [f'"{w}"' for w in words[:-1]] + [f'"{words[-1]}"*']
    return " OR ".join(terms)


class MarketplaceService:
    def __init__(
        self,
        engine: Engine,
        *,
        upstream: Upstream | None = None,
        sink: AgentSink | None = None,
        clock: Callable[[], str] = _now,
    ) -> None:
        self.engine = engine
        self.upstream = upstream
        self.sink = sink
        self._clock = clock
        self._sqlite = engine.dialect.name == "sqlite"

    @classmethod
    def from_settings(cls, settings: Settings) -> MarketplaceService:
        """The service on the configured database (schema migrated on first use), with the
        upstream of ``marketplace_url`` if one is set."""
        from conch import db

        upstream = None
        if settings.marketplace_url:
            upstream = Upstream(
                settings.marketplace_url,
                api_key=settings.marketplace_api_key,
                timeout_s=settings.marketplace_timeout_s,
            )
        return cls(db.engine_for(settings.effective_database_url), upstream=upstream)

    # -- install state handed to orchestration ------------------------------------------

    def attach_sink(self, sink: AgentSink) -> None:
        """Use ``sink`` from now on and hand it every installed agent."""
        self.sink = sink
        for agent in self.installed():
            sink.register(agent)

    def installed(self) -> list[InstalledAgent]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(tables.installed).order_by(tables.installed.c.name))
            return [self._installed_agent(r._mapping) for r in rows]

    @staticmethod
    def _installed_agent(row: RowMapping) -> InstalledAgent:
        m = row["manifest"]
        return InstalledAgent(
            name=row["name"],
            version=row["version"],
            digest=row["digest"],
            origin=row["origin"],
            description=m["description"],
            system_prompt=m["system_prompt"],
            tools=list(m["tools"]),
            model=m["model"],
        )

    # -- publish --------------------------------------------------------------------------

    def publish(self, req: PublishRequest) -> dict[str, Any]:
        """Store a new immutable version; returns its record. Without ``version`` the next
        patch is assigned (retried if another publish took it meanwhile)."""
        explicit = versions.exact(req.version) if req.version is not None else None
        name = normalise_name(req.name)
        # Validate everything once before touching the database.
        build_manifest(req, explicit or "0.0.0")
        for _attempt in range(5):
            try:
                return self._publish_once(req, name, explicit)
            except sa.exc.IntegrityError:
                if explicit is not None:
                    raise conflict(f"{name}@{explicit} is already published", "version") from None
        raise conflict(f"{name}: too many concurrent publishes, try again")

    def _publish_once(self, req: PublishRequest, name: str, explicit: str | None) -> dict[str, Any]:
        a = tables.agents
        with self.engine.begin() as conn:
            existing = conn.execute(
                sa.select(a.c.id, a.c.version, a.c.latest).where(a.c.name == name)
            ).all()
            published = [r.version for r in existing]
            if explicit is not None and explicit in published:
                raise conflict(
                    f"{name}@{explicit} is already published; versions are immutable, "
                    "publish a new version",
                    "version",
                )
            version = explicit or versions.next_patch(published)
            manifest = build_manifest(req, version)
            row = {
                **manifest.to_dict(),
                "digest": manifest.digest,
                "published_at": self._clock(),
                "downloads": 0,
                "prerelease": versions.is_prerelease(version),
                "latest": False,
                "search_text": " ".join(
                    [manifest.name.replace("-", " "), *manifest.tags, manifest.description]
                ),
            }
            inserted = conn.execute(a.insert().values(**row)).inserted_primary_key
            assert inserted is not None
            new_id = inserted[0]
            if versions.newest([*published, version]) == version:
                previous = [r.id for r in existing if r.latest]
                conn.execute(a.update().where(a.c.name == name, a.c.latest).values(latest=False))
                conn.execute(a.update().where(a.c.id == new_id).values(latest=True))
                self._index(conn, previous, new_id, manifest)
            stored = conn.execute(sa.select(a).where(a.c.id == new_id)).one()._mapping
            return _record(stored)

    def _index(self, conn: Connection, previous: list[int], new_id: int, m: Manifest) -> None:
        if not self._sqlite:
            return  # PostgreSQL indexes search_text of the latest rows by itself
        for old in previous:
            conn.exec_driver_sql("DELETE FROM marketplace_fts WHERE rowid = ?", (old,))
        conn.exec_driver_sql(
            "INSERT INTO marketplace_fts (rowid, name, description, tags) VALUES (?, ?, ?, ?)",
            (new_id, m.name.replace("-", " "), m.description, " ".join(m.tags)),
        )

    # -- read -----------------------------------------------------------------------------

    def versions_of(self, name: str) -> dict[str, Any]:
        """Every version of one agent, newest first (what a downstream server installs from)."""
        key = normalise_name(name)
        a = tables.agents
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(a).where(a.c.name == key)).all()
            inst = conn.execute(
                sa.select(tables.installed.c.version).where(tables.installed.c.name == key)
            ).scalar()
        if not rows:
            raise not_found(f"no agent named {key!r}", "name")
        order = {v: i for i, v in enumerate(versions.sort_desc([r.version for r in rows]))}
        records = sorted((_record(r._mapping) for r in rows), key=lambda r: order[r["version"]])
        return {"name": key, "versions": records, "installed_version": inst}

    def search(
        self,
        q: str | None,
        category: str | None = None,
        *,
        limit: int = DEFAULT_LIMIT,
        offset: int = 0,
        federated: bool = True,
    ) -> dict[str, Any]:
        """``{query, category, total, limit, offset, results, notes}``: the exact name first,
        then by relevance (name, tags, description), ties by name; latest version of each."""
        query = (q or "").strip()
        cat = slug(category, "category", MAX_CATEGORY) if category else None
        if not 1 <= limit <= MAX_LIMIT:
            raise invalid(f"limit must be between 1 and {MAX_LIMIT}", "limit")
        if offset < 0:
            raise invalid("offset must not be negative", "offset")
        notes: list[str] = []
        upstream = self.upstream if federated else None
        if upstream is None:
            total, results = self._search_local(query, cat, limit, offset)
        else:
            total, results = self._search_federated(upstream, query, cat, limit, offset, notes)
        return {
            "query": query,
            "category": cat,
            "total": total,
            "limit": limit,
            "offset": offset,
            "results": results,
            "notes": notes,
        }

    def _exact_name(self, query: str) -> str:
        try:
            return normalise_name(query)
        except MarketplaceError:
            return ""

    def _search_local(
        self, query: str, cat: str | None, limit: int, offset: int
    ) -> tuple[int, list[dict[str, Any]]]:
        words = _WORDS.findall(query.casefold())
        params: dict[str, Any] = {"limit": limit, "offset": offset, "category": cat}
        where_cat = " AND a.category = :category" if cat else ""
        # Ranking reads only id, name and score for every match; whole rows (prompts, search
        # text) are read for the page alone. A common word matches thousands of agents.
        if not words:
            matches = f"SELECT a.id, a.name FROM marketplace_agents a WHERE a.latest{where_cat}"
            order = "{t}name"
        elif self._sqlite:
            params["match"] = _fts_query(words)
            params["exact"] = self._exact_name(query)
            # Column weights: a word in the name counts most, then tags, then description.
            matches = (
                "SELECT a.id, a.name, bm25(marketplace_fts, 10.0, 1.0, 4.0) AS score "
                "FROM marketplace_fts JOIN marketplace_agents a ON a.id = marketplace_fts.rowid "
                f"WHERE marketplace_fts MATCH :match{where_cat}"
            )
            order = "({t}name = :exact) DESC, {t}score, {t}name"
        else:
            params["tsq"] = " | ".join([*words[:-1], words[-1] + ":*"])
            params["exact"] = self._exact_name(query)
            vector = "to_tsvector('english', a.search_text)"
            matches = (
                f"SELECT a.id, a.name, ts_rank({vector}, to_tsquery('english', :tsq)) AS score "
                f"FROM marketplace_agents a "
                f"WHERE a.latest AND {vector} @@ to_tsquery('english', :tsq){where_cat}"
            )
            order = "({t}name = :exact) DESC, {t}score DESC, {t}name"
        # The count of all matches rides along with the page (one index scan, not two); the
        # window sits outside because FTS5's bm25 cannot be evaluated inside one.
        page = (
            f"SELECT m.*, count(*) OVER () AS total FROM ({matches}) AS m "
            f"ORDER BY {order.format(t='')} LIMIT :limit OFFSET :offset"
        )
        sql = (
            f"SELECT a.*, i.version AS installed_version, p.total FROM ({page}) AS p "
            "JOIN marketplace_agents a ON a.id = p.id "
            "LEFT JOIN marketplace_installed i ON i.name = a.name "
            f"ORDER BY {order.format(t='p.')}"
        )
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text(sql), params).mappings().all()
            if rows:
                total = rows[0]["total"]
            else:  # past the last page: no row to read the count from
                count = f"SELECT count(*) FROM ({matches}) AS m"
                total = conn.execute(sa.text(count), params).scalar() or 0
        return int(total), [_listed(r) for r in rows]

    def _search_federated(
        self,
        upstream: Upstream,
        query: str,
        cat: str | None,
        limit: int,
        offset: int,
        notes: list[str],
    ) -> tuple[int, list[dict[str, Any]]]:
        if offset + limit > UPSTREAM_WINDOW:
            notes.append(
                f"upstream agents are merged into the first {UPSTREAM_WINDOW} results; "
                "this page shows local agents only"
            )
            return self._search_local(query, cat, limit, offset)
        local_total, local = self._search_local(query, cat, UPSTREAM_WINDOW, 0)
        try:
            remote = upstream.search(query, cat, UPSTREAM_WINDOW)
        except UpstreamUnavailable as exc:
            notes.append(f"{exc}; showing local agents only")
            return local_total, local[offset : offset + limit]
        shadowed = self._local_names(r.get("name") for r in remote["results"])
        installed = self._installed_versions()
        theirs = []
        for r in remote["results"]:
            name = r.get("name")
            if not isinstance(name, str) or name in shadowed:
                continue
            theirs.append(self._remote_listing(r, upstream.url, installed))
        exact = self._exact_name(query)
        merged = local + theirs
        first = [r for r in merged if r["name"] == exact][:1]
        ordered = first + [r for r in merged if not first or r is not first[0]]
        total = local_total + int(remote.get("total", len(theirs))) - len(shadowed)
        return max(total, len(ordered)), ordered[offset : offset + limit]

    def _remote_listing(
        self, r: dict[str, Any], origin: str, installed: dict[str, str]
    ) -> dict[str, Any]:
        out = {k: r.get(k) for k in (*MANIFEST_FIELDS, "digest", "published_at", "downloads")}
        out["origin"] = origin
        out["installed"] = r.get("name") in installed
        out["installed_version"] = installed.get(str(r.get("name")))
        return out

    def _local_names(self, names: Iterable[Any]) -> set[str]:
        wanted = [n for n in names if isinstance(n, str)]
        if not wanted:
            return set()
        a = tables.agents
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(a.c.name).where(a.c.latest, a.c.name.in_(wanted)))
            return {r.name for r in rows}

    def _installed_versions(self) -> dict[str, str]:
        i = tables.installed
        with self.engine.connect() as conn:
            return {r.name: r.version for r in conn.execute(sa.select(i.c.name, i.c.version))}

    def list_agents(self, *, federated: bool = True) -> tuple[list[dict[str, Any]], list[str]]:
        """Every agent (latest version) with ``installed`` and ``installed_version``, local
        ones first; then the upstream's and agents installed from an upstream."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT a.*, i.version AS installed_version FROM marketplace_agents a "
                    "LEFT JOIN marketplace_installed i ON i.name = a.name "
                    "WHERE a.latest ORDER BY a.name"
                )
            ).mappings()
            out = [_listed(r) for r in rows]
            extra = conn.execute(
                sa.select(tables.installed).where(tables.installed.c.origin != LOCAL)
            ).all()
        notes: list[str] = []
        seen = {r["name"] for r in out}
        installed = self._installed_versions()
        if federated and self.upstream is not None:
            try:
                remote = self.upstream.agents()
            except UpstreamUnavailable as exc:
                notes.append(f"{exc}; listing local agents only")
            else:
                for r in sorted(remote, key=lambda r: str(r.get("name"))):
                    if isinstance(r, dict) and r.get("name") not in seen:
                        seen.add(str(r.get("name")))
                        out.append(self._remote_listing(r, self.upstream.url, installed))
        for row in extra:
            m = row._mapping
            if m["name"] in seen:
                continue
            listing = {**m["manifest"], "digest": m["digest"], "published_at": None}
            listing.update(downloads=None, origin=m["origin"], installed=True)
            listing["installed_version"] = m["version"]
            out.append(listing)
        return out, notes

    # -- install --------------------------------------------------------------------------

    def install(self, name: str, version: str | None = None) -> dict[str, Any]:
        """Resolve ``version`` (exact, range, ``latest`` or none), verify the record's digest,
        record the installation and hand the agent to the sink. The installed version again
        is a no-op."""
        key = normalise_name(name)
        a = tables.agents
        with self.engine.connect() as conn:
            published = conn.execute(sa.select(a.c.version).where(a.c.name == key)).scalars().all()
        if published:
            chosen = versions.resolve(key, list(published), version)
            with self.engine.connect() as conn:
                row = (
                    conn.execute(sa.select(a).where(a.c.name == key, a.c.version == chosen))
                    .one()
                    ._mapping
                )
            manifest = _manifest_of(row)
            verify(manifest, row["digest"], "this marketplace's record")
            return self._record_install(key, manifest, row["digest"], LOCAL)
        if self.upstream is None:
            raise not_found(f"no agent named {key!r}", "name")
        try:
            remote = self.upstream.versions(key)
        except UpstreamUnavailable as exc:
            raise UpstreamError(
                f"{key!r} is not published here and {exc}", field="name"
            ) from None
        if not remote:
            raise not_found(f"no agent named {key!r} here or upstream", "name")
        by_version = {str(r.get("version")): r for r in remote if isinstance(r, dict)}
        chosen = versions.resolve(key, list(by_version), version)
        record = by_version[chosen]
        manifest = {f: record.get(f) for f in MANIFEST_FIELDS}
        if manifest["name"] != key:
            raise IntegrityError(
                f"upstream answered {manifest['name']!r} for {key!r}"
            )
        verify(manifest, str(record.get("digest")), f"upstream {self.upstream.url}")
        return self._record_install(key, manifest, str(record["digest"]), self.upstream.url)

    def _record_install(
        self, key: str, manifest: dict[str, Any], digest: str, origin: str
    ) -> dict[str, Any]:
        i = tables.installed
        agent = InstalledAgent(
            name=key,
            version=manifest["version"],
            digest=digest,
            origin=origin,
            description=manifest["description"],
            system_prompt=manifest["system_prompt"],
            tools=list(manifest["tools"]),
            model=manifest["model"],
        )
        answer = {
            "name": key,
            "version": agent.version,
            "digest": digest,
            "installed": True,
            "origin": origin,
        }
        with self.engine.connect() as conn:
            current = conn.execute(sa.select(i).where(i.c.name == key)).first()
        if current is not None and current.version == agent.version and current.digest == digest:
            if self.sink is not None:
                self.sink.register(agent)  # idempotent; heals a registry that lost it
            return {**answer, "changed": False}
        # The registry first: if it refuses, nothing is recorded. (Not inside this
        # transaction: the registry writes through its own connection, and SQLite would
        # make it wait for ours.)
        if self.sink is not None:
            self.sink.register(agent)
        values = {
            "version": agent.version,
            "digest": digest,
            "origin": origin,
            "manifest": manifest,
            "installed_at": self._clock(),
        }
        try:
            with self.engine.begin() as conn:
                if current is None:
                    conn.execute(i.insert().values(name=key, **values))
                else:
                    conn.execute(i.update().where(i.c.name == key).values(**values))
                if origin == LOCAL:
                    a = tables.agents
                    conn.execute(
                        a.update()
                        .where(a.c.name == key, a.c.version == agent.version)
                        .values(downloads=a.c.downloads + 1)
                    )
        except Exception:
            if self.sink is not None:
                if current is None:
                    self.sink.remove(key)
                else:
                    self.sink.register(self._installed_agent(current._mapping))
            raise
        return {**answer, "changed": True, "previous_version": current.version if current else None}

    def uninstall(self, name: str) -> dict[str, Any]:
        key = normalise_name(name)
        i = tables.installed
        with self.engine.connect() as conn:
            current = conn.execute(sa.select(i).where(i.c.name == key)).first()
        if current is None:
            raise not_found(f"{key!r} is not installed", "name")
        if self.sink is not None:
            if self.sink.is_busy(key):
                raise conflict(
                    f"{key} is running a task; wait for it to finish or cancel it, then uninstall",
                    "name",
                )
            self.sink.remove(key)
        with self.engine.begin() as conn:
            conn.execute(i.delete().where(i.c.name == key))
        return {"name": key, "version": current.version, "installed": False}

    # -- curated catalogue --------------------------------------------------------------------

    def seed(self, manifests: Iterable[PublishRequest]) -> list[str]:
        """Publish each manifest whose name has no version yet; returns the names published."""
        done = []
        a = tables.agents
        for req in manifests:
            key = normalise_name(req.name)
            with self.engine.connect() as conn:
                if conn.execute(sa.select(a.c.id).where(a.c.name == key).limit(1)).first():
                    continue
            try:
                self.publish(req)
            except MarketplaceError as exc:
                if not isinstance(exc, ConflictError):  # another replica seeded it meanwhile
                    raise
            done.append(key)
        return done
