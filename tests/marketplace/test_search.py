"""Search: exact name first, then relevance, ties by name; paging; the curated catalogue."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from conch.marketplace.catalogue import CATALOGUE
from tests.marketplace.conftest import agent
from tests.web.agent_fixtures import AgentServer

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    """A fresh server with the catalogue and 300 more agents."""
    from tests.web.agent_fixtures import start_agent_server

    running = start_agent_server(tmp_path_factory.mktemp("many"), workers=1)
    with running.client() as c:
        for i in range(300):
            w = WORDS[i % len(WORDS)]
            body = agent(
                f"{w}-tool-{i:03d}",
                description=f"A {w} helper number {i}, for {'reports' if i % 3 else 'logs'}.",
                category="bulk" if i % 2 else "other",
                tags=[w, "bulk"],
            )
            assert c.post("/api/v1/marketplace/publish", json=body).status_code == 201
        # "report" names this one; many others only mention reports in their description
        c.post(
            "/api/v1/marketplace/publish",
            json=agent("report", description="Writes one report.", tags=["reports"]),
        )
        c.post(
            "/api/v1/marketplace/publish",
            json=agent("report-builder", description="Builds a report from data."),
        )
    yield running
    running.stop()


def search(c: httpx.Client, **params: object) -> dict:
    r = c.get("/api/v1/marketplace/search", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_fresh_server_answers_from_the_curated_catalogue(many: AgentServer) -> None:
    with many.client() as c:
        names = {a["name"] for a in c.get("/api/v1/marketplace/agents").json()}
        assert {m.name for m in CATALOGUE} <= names
        assert len(CATALOGUE) >= 5
        out = search(c, q="csv")
        assert out["results"][0]["name"] == "csv-analyst"
        assert search(c, q="logs errors")["results"][0]["name"] == "log-analyst"
        assert search(c, q="summarise file")["results"][0]["name"] == "file-summariser"
        assert search(c, q="json")["results"][0]["name"] == "json-transformer"
        assert search(c, q="search code")["results"][0]["name"] == "code-searcher"


def test_the_response_shape(many: AgentServer) -> None:
    with many.client() as c:
        out = search(c, q="foxtrot", category="bulk")
    assert set(out) == {"query", "category", "total", "limit", "offset", "results", "notes"}
    assert (out["query"], out["category"], out["limit"], out["offset"]) == (
        "foxtrot",
        "bulk",
        20,
        0,
    )
    first = out["results"][0]
    assert {
        "name",
        "version",
        "description",
        "system_prompt",
        "tools",
        "model",
        "category",
        "tags",
        "author",
        "digest",
        "published_at",
        "downloads",
        "origin",
        "installed",
        "installed_version",
    } <= set(first)
    assert all(r["category"] == "bulk" for r in out["results"])
    assert first["origin"] == "local"


def test_exact_name_first_then_relevance_ties_by_name(many: AgentServer) -> None:
    with many.client() as c:
        out = search(c, q="report", limit=100)
    names = [r["name"] for r in out["results"]]
    assert names[0] == "report"
    assert names[1] == "report-builder"  # the word in the name outranks the description
    # then the agents that only mention reports in their description (or tags)
    assert out["total"] == 2 + 200 + 1  # and log-analyst, which "reports" errors
    assert all("report" in r["description"] for r in out["results"][2:])


def test_paging_covers_every_result_once(many: AgentServer) -> None:
    with many.client() as c:
        total = search(c, q="bulk", limit=1)["total"]
        assert total == 300
        seen: list[str] = []
        for offset in range(0, total, 37):
            page = search(c, q="bulk", limit=37, offset=offset)
            assert page["total"] == total
            seen += [r["name"] for r in page["results"]]
        assert len(seen) == total == len(set(seen))
        assert seen == sorted(seen)  # every one equally relevant: ties by name
        assert search(c, q="bulk", offset=total)["results"] == []


def test_category_without_query_lists_by_name(many: AgentServer) -> None:
    with many.client() as c:
        out = search(c, category="Bulk", limit=100)
        assert out["total"] == 150 and out["category"] == "bulk"
        names = [r["name"] for r in out["results"]]
        assert names == sorted(names)
        everything = search(c, limit=1)["total"]
        assert everything == 300 + 2 + len(CATALOGUE)


def test_latest_version_per_agent(many: AgentServer) -> None:
    with many.client() as c:
        for v in ("1.0.0", "3.0.0", "2.0.0", "4.0.0-beta.1"):
            c.post(
                "/api/v1/marketplace/publish",
                json=agent("versioned", version=v, description=f"versioned {v}"),
            )
        out = search(c, q="versioned")
    hits = [r for r in out["results"] if r["name"] == "versioned"]
    assert len(hits) == 1 and hits[0]["version"] == "3.0.0"
    assert hits[0]["description"] == "versioned 3.0.0"


def test_query_syntax_is_plain_text_and_bad_paging_is_400(many: AgentServer) -> None:
    with many.client() as c:
        for q in ('"', "a OR", "NEAR(x y)", "*", "-", "col:umn", "'); DROP TABLE x; --"):
            assert c.get("/api/v1/marketplace/search", params={"q": q}).status_code == 200, q
        assert c.get("/api/v1/marketplace/search", params={"limit": 0}).status_code == 400
        assert c.get("/api/v1/marketplace/search", params={"limit": 101}).status_code == 400
        assert c.get("/api/v1/marketplace/search", params={"offset": -1}).status_code == 400
        assert c.get("/api/v1/marketplace/search", params={"category": "%%"}).status_code == 400


def test_search_and_list_give_back_the_published_lists(many: AgentServer) -> None:
    """tools and tags come back as the lists that were published, from search and from list."""
    with many.client() as c:
        hit = search(c, q="report")["results"][0]
        assert hit["name"] == "report"
        assert hit["tags"] == ["reports"]
        published = agent("report")
        assert hit["tools"] == published["tools"]
        assert all(isinstance(t, str) and len(t) > 1 for t in hit["tools"])
        listed = {a["name"]: a for a in c.get("/api/v1/marketplace/agents").json()}
        assert listed["report"]["tools"] == published["tools"]
        assert listed["report"]["tags"] == ["reports"]
