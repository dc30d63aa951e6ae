"""Publish: records, digests, immutable versions and every refusal, over real HTTP."""

from __future__ import annotations

import hashlib
import re

import httpx
import rfc8785

from tests.marketplace.conftest import agent

MANIFEST = (
    "name",
    "version",
    "description",
    "system_prompt",
    "tools",
    "model",
    "category",
    "tags",
    "author",
)


def test_publish_returns_the_record_with_a_digest_of_the_canonical_manifest(
    client: httpx.Client,
) -> None:
    body = agent("Digest Check", category="Testing", tags=["One", "two"], author="ann")
    r = client.post("/api/v1/marketplace/publish", json=body)
    assert r.status_code == 201, r.text
    rec = r.json()
    assert set(rec) == {*MANIFEST, "digest", "published_at", "downloads"}
    assert rec["name"] == "digest-check"
    assert rec["version"] == "1.0.0"
    assert rec["category"] == "testing"
    assert rec["tags"] == ["one", "two"]
    assert rec["author"] == "ann"
    assert rec["downloads"] == 0
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", rec["published_at"])
    canonical = rfc8785.dumps({k: rec[k] for k in MANIFEST})
    assert rec["digest"] == "sha256:" + hashlib.sha256(canonical).hexdigest()


def test_without_version_the_next_patch_is_assigned(client: httpx.Client) -> None:
    versions = [
        client.post("/api/v1/marketplace/publish", json=agent("auto-ver")).json()["version"]
        for _ in range(3)
    ]
    assert versions == ["1.0.0", "1.0.1", "1.0.2"]
    r = client.post("/api/v1/marketplace/publish", json=agent("auto-ver", version="2.4.0"))
    assert r.status_code == 201
    r = client.post("/api/v1/marketplace/publish", json=agent("auto-ver"))
    assert r.json()["version"] == "2.4.1"


def test_the_same_version_twice_is_a_conflict_and_changes_nothing(client: httpx.Client) -> None:
    first = client.post("/api/v1/marketplace/publish", json=agent("twice", version="1.2.3"))
    assert first.status_code == 201
    again = client.post(
        "/api/v1/marketplace/publish",
        json=agent("twice", version="1.2.3", description="something else"),
    )
    assert again.status_code == 409
    err = again.json()["error"]
    assert err["kind"] == "ConflictError" and err["field"] == "version"
    assert "immutable" in err["message"]
    stored = client.get("/api/v1/marketplace/agents/twice").json()["versions"]
    assert [v["description"] for v in stored] == ["twice does useful things"]


def test_look_alike_names_are_the_same_agent(client: httpx.Client) -> None:
    assert (
        client.post(
            "/api/v1/marketplace/publish", json=agent("csv-cleaner", version="1.0.0")
        ).status_code
        == 201
    )
    for look_alike in ("CSV_Cleaner", "csv.cleaner", " csv--cleaner ", "ｃｓｖ-cleaner"):
        r = client.post("/api/v1/marketplace/publish", json=agent(look_alike, version="1.0.0"))
        assert r.status_code == 409, look_alike
    r = client.post("/api/v1/marketplace/publish", json=agent("CSV Cleaner"))
    assert (r.status_code, r.json()["name"], r.json()["version"]) == (201, "csv-cleaner", "1.0.1")


def test_other_scripts_look_alikes_are_refused(client: httpx.Client) -> None:
    r = client.post("/api/v1/marketplace/publish", json=agent("сsv-cleaner"))  # Cyrillic с
    assert r.status_code == 400
    assert r.json()["error"]["field"] == "name"


def test_range_looking_versions_are_refused(client: httpx.Client) -> None:
    for version in ("^1.2", "~1", ">=1", "1.x", "*", "1.2", "latest", ">=1.0 <2"):
        r = client.post("/api/v1/marketplace/publish", json=agent("ranged", version=version))
        assert r.status_code == 400, version
        err = r.json()["error"]
        assert err["field"] == "version" and "range" in err["message"], version
    r = client.post("/api/v1/marketplace/publish", json=agent("ranged", version="one"))
    assert r.status_code == 400 and "not a semantic version" in r.json()["error"]["message"]


def test_prerelease_and_v_prefixed_versions_are_exact(client: httpx.Client) -> None:
    r = client.post("/api/v1/marketplace/publish", json=agent("pre", version="v2.0.0-beta.1"))
    assert r.status_code == 201 and r.json()["version"] == "2.0.0-beta.1"


def test_unknown_tools_are_refused_naming_the_tool(client: httpx.Client) -> None:
    r = client.post("/api/v1/marketplace/publish", json=agent("bad-tools", tools=["cat", "grpe"]))
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["field"] == "tools[1]" and "grpe" in err["message"] and "grep" in err["message"]
    r = client.post("/api/v1/marketplace/publish", json=agent("bad-tools", tools=["cat", "cat"]))
    assert r.status_code == 400 and r.json()["error"]["field"] == "tools[1]"


def test_malformed_model_strings_are_refused(client: httpx.Client) -> None:
    for model in ("smollm2", ":model", "local:", "Local Provider:x", "local:a b"):
        r = client.post("/api/v1/marketplace/publish", json=agent("bad-model", model=model))
        assert r.status_code == 400, model
        assert r.json()["error"]["field"] == "model"
    r = client.post(
        "/api/v1/marketplace/publish", json=agent("ok-model", model="ollama:qwen2.5:7b")
    )
    assert r.status_code == 201 and r.json()["model"] == "ollama:qwen2.5:7b"


def test_oversize_fields_are_refused_naming_the_field(client: httpx.Client) -> None:
    cases = {
        "description": "x" * 2001,
        "system_prompt": "x" * 20_001,
        "name": "n" * 200,
        "author": "a" * 101,
        "tags": [f"t{i}" for i in range(21)],
        "tools": ["cat"] * 65,
        "model": "local:" + "m" * 300,
    }
    for field, value in cases.items():
        body = agent("big")
        body[field] = value
        r = client.post("/api/v1/marketplace/publish", json=body)
        assert r.status_code == 400, field
        assert r.json()["error"]["field"] == field, (field, r.json())
    r = client.post("/api/v1/marketplace/publish", json=agent("n" * 70))
    assert r.status_code == 400 and r.json()["error"]["field"] == "name"


def test_missing_and_unknown_fields_and_bad_json(client: httpx.Client) -> None:
    body = agent("missing")
    del body["system_prompt"]
    r = client.post("/api/v1/marketplace/publish", json=body)
    assert r.status_code == 400 and r.json()["error"]["field"] == "system_prompt"
    r = client.post("/api/v1/marketplace/publish", json=agent("extra", licence="MIT"))
    assert r.status_code == 400 and r.json()["error"]["field"] == "licence"
    r = client.post("/api/v1/marketplace/publish", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["field"] == "body"
    # the server keeps serving
    assert client.get("/health").status_code == 200


def test_curl_style_form_content_type_is_read_as_json(client: httpx.Client) -> None:
    import json

    r = client.post(
        "/api/v1/marketplace/publish",
        content=json.dumps(agent("curl-style")).encode(),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 201
