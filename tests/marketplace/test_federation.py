"""Federation between two real conch servers on loopback, the upstream stopped mid-test."""

from __future__ import annotations

import httpx

from conch import db
from conch.marketplace import tables
from tests.marketplace.conftest import agent


def test_federation(fresh_server) -> None:  # type: ignore[no-untyped-def]
    up = fresh_server()
    down = fresh_server(marketplace_url=up.url, marketplace_timeout_s=1.0)
    with up.client() as u, down.client() as d:
        for v in ("1.0.0", "1.1.0", "2.0.0-beta.1"):
            assert (
                u.post(
                    "/api/v1/marketplace/publish", json=agent("remote-only", version=v)
                ).status_code
                == 201
            )
        u.post("/api/v1/marketplace/publish", json=agent("shared-name", description="upstream"))
        d.post("/api/v1/marketplace/publish", json=agent("shared-name", description="downstream"))
        u.post("/api/v1/marketplace/publish", json=agent("forged", version="1.0.0"))

        # search and list include the upstream's agents, marked with their origin
        out = d.get("/api/v1/marketplace/search", params={"q": "remote-only"}).json()
        assert out["notes"] == []
        first = out["results"][0]
        assert (first["name"], first["version"], first["origin"]) == (
            "remote-only",
            "1.1.0",
            up.url,
        )
        shared = [
            r
            for r in d.get("/api/v1/marketplace/search", params={"q": "shared"}).json()["results"]
            if r["name"] == "shared-name"
        ]
        assert [(r["origin"], r["description"]) for r in shared] == [("local", "downstream")]
        listed = {a["name"]: a for a in d.get("/api/v1/marketplace/agents").json()}
        assert listed["remote-only"]["origin"] == up.url
        assert listed["file-summariser"]["origin"] == "local"  # the local catalogue shadows

        # a request from another server is answered locally (no loops between servers)
        hop = d.get(
            "/api/v1/marketplace/search",
            params={"q": "remote-only"},
            headers={"X-Conch-Federation": "1"},
        ).json()
        assert all(r["name"] != "remote-only" for r in hop["results"])

        # install resolves the range against the upstream's versions and verifies the digest
        r = d.post("/api/v1/marketplace/install", json={"name": "remote-only", "version": "^1"})
        assert r.status_code == 200, r.text
        assert (r.json()["version"], r.json()["origin"]) == ("1.1.0", up.url)
        ids = {a["id"] for a in d.get("/api/v1/orchestration/agents").json()}
        assert "remote-only" in ids

        # a record altered on the upstream no longer matches its digest: refused downstream
        eng = db.engine_for(up.settings.effective_database_url)
        with eng.begin() as conn:
            conn.execute(
                tables.agents.update()
                .where(tables.agents.c.name == "forged")
                .values(tools=["cat", "rm"])
            )
        r = d.post("/api/v1/marketplace/install", json={"name": "forged"})
        assert r.status_code == 409 and r.json()["error"]["kind"] == "IntegrityError"

        # the upstream goes away: local search and list keep working, with a note
        up.stop()
        out = d.get("/api/v1/marketplace/search", params={"q": "shared"})
        assert out.status_code == 200
        body = out.json()
        assert [r["name"] for r in body["results"]][:1] == ["shared-name"]
        assert body["notes"] and "unreachable" in body["notes"][0]
        lst = d.get("/api/v1/marketplace/agents")
        assert lst.status_code == 200 and "unreachable" in lst.headers["x-conch-upstream-note"]
        names = {a["name"]: a for a in lst.json()}
        # the agent installed from the upstream is still there, from its verified manifest
        assert names["remote-only"]["installed_version"] == "1.1.0"
        assert names["remote-only"]["origin"] == up.url
        r = d.post("/api/v1/marketplace/install", json={"name": "remote-only", "version": "1.0.0"})
        assert r.status_code == 502 and r.json()["error"]["kind"] == "UpstreamError"
        # and it can still be uninstalled
        assert (
            d.post("/api/v1/marketplace/uninstall", json={"name": "remote-only"}).status_code == 200
        )
        assert isinstance(d.get("/health", timeout=httpx.Timeout(5)).json(), dict)
