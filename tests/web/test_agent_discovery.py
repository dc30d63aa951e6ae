"""Discovery routes: builtins, types, the language schema and its exports (SPEC §2.2)."""

from __future__ import annotations

import jsonschema
import pytest
from openapi_spec_validator import validate

from conch.lang.builtins.registry import all_builtins
from tests.web.agent_fixtures import *  # noqa: F403
from tests.web.agent_fixtures import AgentServer


def test_builtins_list_is_bare_array_of_summaries(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        items = c.get("/api/v1/builtins").json()
    assert isinstance(items, list)
    assert len(items) == len(all_builtins()) >= 120
    for item in items:
        assert set(item) == {"name", "description", "category"}
        assert all(isinstance(v, str) and v for v in item.values())
    names = {i["name"] for i in items}
    assert {"ls", "map", "where", "sum", "print"} <= names


def test_builtins_category_filter(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        fs = c.get("/api/v1/builtins", params={"category": "filesystem"}).json()
        coll = c.get("/api/v1/builtins", params={"category": "collections"}).json()
        none = c.get("/api/v1/builtins", params={"category": "nope"}).json()
    assert fs and all(i["category"] == "filesystem" for i in fs)
    assert "ls" in {i["name"] for i in fs}
    assert coll and all(i["category"] == "collections" for i in coll)
    assert none == []


def test_builtin_detail(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        d = c.get("/api/v1/builtins/map").json()
    for key, kind in (
        ("name", str),
        ("description", str),
        ("category", str),
        ("signature", str),
        ("examples", list),
        ("parameters", list),
        ("returns", str),
        ("effect", str),
        ("aliases", list),
    ):
        assert isinstance(d[key], kind), key
    assert d["name"] == "map" and d["category"] == "collections"
    assert d["signature"].startswith("map(")
    assert d["examples"] and all(isinstance(e, str) for e in d["examples"])
    assert {p["name"] for p in d["parameters"]} >= {"items"} or d["parameters"]


def test_builtin_alias_resolves(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        d = c.get("/api/v1/builtins/filter").json()
    assert d["name"] == "where"


def test_unknown_builtin_404_did_you_mean(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        r = c.get("/api/v1/builtins/lenght")
    assert r.status_code == 404
    body = r.json()
    assert body["success"] is False
    assert "did you mean" in body["error"]["hint"]
    assert "length" in body["error"]["hint"]


def test_types(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        types = c.get("/api/v1/types").json()
    by_name = {t["name"]: t for t in types}
    for name in (
        "Null",
        "Bool",
        "Int",
        "Float",
        "String",
        "Array",
        "Table",
        "Record",
        "Range",
        "Function",
        "Error",
        "FileEntry",
    ):
        assert name in by_name, name
        t = by_name[name]
        assert set(t) >= {"name", "description", "json", "properties"}
        jsonschema.Draft202012Validator.check_schema(t["json"])
    assert by_name["FileEntry"]["properties"] == {
        "name": "String",
        "type": "String",
        "size": "Int",
        "modified": "String",
    }


def test_language_schema(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        doc = c.get("/api/v1/schema").json()
    assert doc["language"]["name"] == "conch"
    assert isinstance(doc["language"]["version"], str)
    assert len(doc["builtins"]) == len(all_builtins())
    assert {t["name"] for t in doc["types"]} >= {"Int", "Table"}
    syntax = doc["syntax"]
    assert set(syntax) >= {"statements", "operators", "literals", "keywords"}
    ops = {o["symbol"]: o for o in syntax["operators"]}
    assert ops["|"]["precedence"] < ops["+"]["precedence"] < ops["*"]["precedence"]
    assert ops["**"]["associativity"] == "right"
    assert "let" in syntax["keywords"]


def test_schema_json_is_valid_json_schema(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        doc = c.get("/api/v1/schema/json").json()
    jsonschema.Draft202012Validator.check_schema(doc)
    validator = jsonschema.Draft202012Validator(doc)
    assert validator.is_valid([1, "a", {"k": None}])
    params = jsonschema.Draft202012Validator(doc["$defs"]["builtin.split"])
    assert params.is_valid({"s": "a,b", "sep": ","}) or params.is_valid({})


def test_schema_openapi_validates_as_31(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        doc = c.get("/api/v1/schema/openapi").json()
    assert doc["openapi"].startswith("3.1")
    validate(doc)
    assert len(doc["paths"]) == len(all_builtins())
    op = doc["paths"]["/api/v1/call/upper"]["post"]
    assert op["operationId"] == "call_upper"
    assert doc["servers"][0]["url"] == agent_server.url


def test_schema_openapi_operations_really_work(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        doc = c.get("/api/v1/schema/openapi").json()
        schema = doc["paths"]["/api/v1/call/split"]["post"]["requestBody"]["content"][
            "application/json"
        ]["schema"]
        body = {"args": ["a,b"], "kwargs": {}}
        first = next(p["name"] for p in c.get("/api/v1/builtins/split").json()["parameters"][1:])
        body["kwargs"] = {first: ","}
        jsonschema.validate(body, schema)
        r = c.post("/api/v1/call/split", json=body).json()
    assert r["value"] == ["a", "b"]


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "mcp"])
def test_tool_formats(agent_server: AgentServer, fmt: str) -> None:
    with agent_server.client() as c:
        doc = c.get(f"/api/v1/schema/{fmt}").json()
    if fmt == "openai":
        tools = doc
        assert all(t["type"] == "function" for t in tools)
        params = [t["function"]["parameters"] for t in tools]
        names = [t["function"]["name"] for t in tools]
    elif fmt == "anthropic":
        tools = doc
        params = [t["input_schema"] for t in tools]
        names = [t["name"] for t in tools]
    else:
        tools = doc["tools"]
        params = [t["inputSchema"] for t in tools]
        names = [t["name"] for t in tools]
    assert len(tools) == len(all_builtins())
    assert "map" in names
    for p in params:
        assert p["type"] == "object"
        jsonschema.Draft202012Validator.check_schema(p)


def test_unknown_schema_format_404_lists_valid(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        r = c.get("/api/v1/schema/yaml")
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    for fmt in ("json", "openapi", "openai", "anthropic", "mcp"):
        assert fmt in message
