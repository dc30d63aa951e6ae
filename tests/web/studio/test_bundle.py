"""The shipped bundle is the build of the committed ui/ source, and is served as a web app
should be: hashed assets cached for good, gzip, the page config inlined, CORS only between
conch's own origins. (No Node needed: the build's inputs are hashed the same way here.)"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import httpx

from conch.web.studio import DIST, source_hash
from tests.web.studio.conftest import Servers

UI = Path(__file__).resolve().parents[3] / "ui"


def test_the_bundle_was_built_from_the_committed_source() -> None:
    manifest = json.loads((DIST / "studio-manifest.json").read_text())
    digest, count = source_hash(UI)
    assert (digest, count) == (manifest["source_sha256"], manifest["source_files"]), (
        "src/conch/web/studio/dist is stale: ui/ changed since the bundle was built; run `make ui`"
    )
    shipped = sorted(
        p.relative_to(DIST).as_posix()
        for p in DIST.rglob("*")
        if p.is_file() and p.name != "studio-manifest.json"
    )
    assert shipped == manifest["assets"]


# Issue 21: the whole bundle (every page's chunk, the CSS and index.html), gzip-compressed as
# it is served, stays within 400 kB. docs/studio.md states the figure.
BUNDLE_GZIP_LIMIT = 400_000


def test_the_whole_bundle_stays_within_400_kb_gzipped() -> None:
    sizes = {
        p.relative_to(DIST).as_posix(): len(gzip.compress(p.read_bytes(), 9))
        for p in DIST.rglob("*")
        if p.is_file() and p.name != "studio-manifest.json"
    }
    total = sum(sizes.values())
    assert total <= BUNDLE_GZIP_LIMIT, f"{total} bytes gzipped: {sorted(sizes.items(), key=lambda kv: -kv[1])}"


def test_index_references_only_shipped_local_assets() -> None:
    html = (DIST / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs, html
    for ref in refs:
        if ref.startswith("data:"):
            continue
        assert ref.startswith("/studio/"), ref  # nothing from a CDN
        assert (DIST / ref.removeprefix("/studio/")).is_file(), ref
    assert "<!--conch-config-->" in html


def _asset_paths(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="(/studio/assets/[^"]+)"', html)


def test_agent_server_serves_the_studio(servers: Servers) -> None:
    r = httpx.get(servers.agent + "/", headers={"Accept": "text/html", "Accept-Encoding": "gzip"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert r.headers["cache-control"] == "no-cache"
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and f":{servers.settings.models_port}" in csp
    config = json.loads(re.search(r'id="conch-config" type="application/json">(.*?)</script>', r.text).group(1))  # type: ignore[union-attr]
    assert config["server"] == "agent"
    assert config["inference_port"] == servers.settings.models_port
    assert set(config["pages"]) == {"playground", "chat", "models", "agents", "marketplace", "status"}
    for path in _asset_paths(r.text):
        raw = httpx.get(servers.agent + path, headers={"Accept-Encoding": "gzip"})
        assert raw.status_code == 200
        assert raw.headers["content-encoding"] == "gzip"
        assert raw.headers["cache-control"] == "public, max-age=31536000, immutable"
        plain = httpx.get(servers.agent + path, headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers
        assert raw.content == plain.content  # httpx decoded the gzip body
    assert httpx.get(servers.agent + "/studio/assets/nope.js").status_code == 404


def test_api_clients_asking_root_get_what_they_got_before(servers: Servers) -> None:
    # The inference server's root stays its JSON index for API clients.
    r = httpx.get(servers.inference + "/", headers={"Accept": "application/json"})
    assert r.json()["api"] == "/v1"
    page = httpx.get(servers.inference + "/", headers={"Accept": "text/html"})
    assert page.headers["content-type"].startswith("text/html")
    config = json.loads(re.search(r'id="conch-config" type="application/json">(.*?)</script>', page.text).group(1))  # type: ignore[union-attr]
    assert config["server"] == "inference"
    assert set(config["pages"]) == {"chat", "models", "status"}


def test_cors_allows_only_the_studio_origins(servers: Servers) -> None:
    own = f"http://127.0.0.1:{servers.settings.port}"
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    ok = httpx.options(servers.inference + "/v1/chat/completions", headers={"Origin": own, **preflight})
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == own
    evil = httpx.options(
        servers.inference + "/v1/chat/completions",
        headers={"Origin": "http://evil.example", **preflight},
    )
    assert "access-control-allow-origin" not in evil.headers
    simple = httpx.get(servers.inference + "/v1/models", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in simple.headers
    allowed = httpx.get(servers.inference + "/v1/models", headers={"Origin": f"http://localhost:{servers.settings.port}"})
    assert allowed.headers["access-control-allow-origin"] == f"http://localhost:{servers.settings.port}"


def test_cors_allows_the_studios_polling_header(servers: Servers) -> None:
    """The studio served by the agent server marks its polling of the inference server with
    X-Conch-Poll (left out of request rates): the preflight must allow that header."""
    own = f"http://127.0.0.1:{servers.settings.port}"
    r = httpx.options(servers.inference + "/v1/status/history", headers={
        "Origin": own, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "x-conch-poll"})
    assert r.status_code == 200, r.text
    assert "x-conch-poll" in r.headers["access-control-allow-headers"].lower()
    got = httpx.get(servers.inference + "/v1/status/history", headers={"Origin": own, "X-Conch-Poll": "studio"})
    assert got.status_code == 200 and got.headers["access-control-allow-origin"] == own


def test_a_rebound_host_name_gets_no_studio(servers: Servers) -> None:
    r = httpx.get(servers.agent + "/", headers={"Accept": "text/html", "Host": "evil.example"})
    assert r.status_code == 403
