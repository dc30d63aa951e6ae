"""The language schema: types, builtins and syntax as data, and exports of it for tools.

Everything here is derived from the builtin registry, so the schema cannot drift from what
the interpreter runs. :func:`export` renders it in the formats agents consume: a JSON Schema
document, an OpenAPI 3.1 document with one operation per builtin (``POST /api/v1/call/{name}``,
usable as GPT Actions), OpenAI and Anthropic tool definitions, and an MCP tool list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conch import __version__
from conch.lang.builtins.registry import Builtin, Param, all_builtins, type_names


def _error_properties() -> dict[str, Any]:
    """The fields of a caught error, as the Error type and a run envelope's ``error`` show them
    (a fresh dict each call: schemas are handed out and may be changed by their reader)."""
    return {
        "kind": {"type": "string"},
        "message": {"type": "string"},
        "line": {"type": ["integer", "null"]},
        "column": {"type": ["integer", "null"]},
        "hint": {"type": ["string", "null"]},
    }


FORMATS = ("json", "openapi", "openai", "anthropic", "mcp")

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

_TYPES: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
    ("Null", "The absence of a value: `null`.", {"type": "null"}, {}),
    ("Bool", "`true` or `false`.", {"type": "boolean"}, {}),
    (
        "Int",
        "An integer of arbitrary precision (`42`, `0x1f`, `10kb`, `250ms`).",
        {"type": "integer"},
        {},
    ),
    (
        "Float",
        "An IEEE double; infinities and NaN appear in JSON as the strings "
        '"Infinity", "-Infinity" and "NaN".',
        {"anyOf": [{"type": "number"}, {"enum": ["Infinity", "-Infinity", "NaN"]}]},
        {},
    ),
    ("String", "Unicode text.", {"type": "string"}, {}),
    ("Array", "An ordered, heterogeneous sequence.", {"type": "array"}, {}),
    (
        "Table",
        "An Array of Records that all have the same keys in the same order "
        "(what `ls` returns); every Array builtin accepts it.",
        {"type": "array", "items": {"type": "object"}},
        {},
    ),
    ("Record", "String keys to values, insertion order kept.", {"type": "object"}, {}),
    (
        "Range",
        "A lazy range of Int (`a..b` end-exclusive, `a..=b` inclusive, `range(a, b, step)`); "
        "behaves as an Array of Int.",
        {"type": "array", "items": {"type": "integer"}},
        {},
    ),
    (
        "Function",
        "A lambda, a named function or a builtin. Over HTTP a Function argument is given as "
        'conch source, e.g. "fn(x) => x * 2".',
        {"type": "string", "description": "conch source of a function"},
        {},
    ),
    (
        "Error",
        "A caught error (`try { ... } catch e { ... }`): a Record-like value.",
        {
            "type": "object",
            "properties": _error_properties(),
            "required": ["kind", "message", "line", "column", "hint"],
        },
        {
            "kind": "String",
            "message": "String",
            "line": "Int?",
            "column": "Int?",
            "hint": "String?",
        },
    ),
]

# Records of a known shape that builtins return.
_SHAPES: list[tuple[str, str, dict[str, str]]] = [
    (
        "FileEntry",
        "A directory entry as returned by `ls` (a Table of them); `modified` is ISO-8601 UTC.",
        {"name": "String", "type": "String", "size": "Int", "modified": "String"},
    ),
    (
        "IndexedItem",
        "An element of `enumerate`'s result.",
        {"index": "Int", "item": "Any"},
    ),
]

_SCALAR_SCHEMAS: dict[str, dict[str, Any]] = {name: json for name, _, json, _ in _TYPES}
_SCALAR_SCHEMAS.update({"Any": {}, "None": {"type": "null"}, "Number": {"type": "number"}})

OPERATORS: list[dict[str, Any]] = [
    {"symbol": "|", "precedence": 1, "associativity": "left", "description": "pipeline"},
    {
        "symbol": "||",
        "precedence": 2,
        "associativity": "left",
        "description": "logical or (also `or`)",
    },
    {
        "symbol": "&&",
        "precedence": 3,
        "associativity": "left",
        "description": "logical and (also `and`)",
    },
    *(
        {"symbol": s, "precedence": 4, "associativity": "none", "description": d}
        for s, d in (
            ("==", "equal"),
            ("!=", "not equal"),
            ("<", "less than"),
            ("<=", "less or equal"),
            (">", "greater than"),
            (">=", "greater or equal"),
            ("in", "membership"),
            ("not in", "non-membership"),
            ("=~", "regex match"),
        )
    ),
    {
        "symbol": "..",
        "precedence": 5,
        "associativity": "none",
        "description": "range, end exclusive",
    },
    {
        "symbol": "..=",
        "precedence": 5,
        "associativity": "none",
        "description": "range, end inclusive",
    },
    {
        "symbol": "+",
        "precedence": 6,
        "associativity": "left",
        "description": "add; concatenate strings and arrays; merge records",
    },
    {"symbol": "-", "precedence": 6, "associativity": "left", "description": "subtract"},
    {"symbol": "*", "precedence": 7, "associativity": "left", "description": "multiply"},
    {"symbol": "/", "precedence": 7, "associativity": "left", "description": "true division"},
    {"symbol": "//", "precedence": 7, "associativity": "left", "description": "floor division"},
    {"symbol": "%", "precedence": 7, "associativity": "left", "description": "remainder"},
    {"symbol": "**", "precedence": 8, "associativity": "right", "description": "power"},
    {"symbol": "-x", "precedence": 9, "associativity": "prefix", "description": "negation"},
    {
        "symbol": "!",
        "precedence": 9,
        "associativity": "prefix",
        "description": "logical not (also `not`)",
    },
    {"symbol": "f(x)", "precedence": 10, "associativity": "postfix", "description": "call"},
    {
        "symbol": ".field",
        "precedence": 10,
        "associativity": "postfix",
        "description": "field access",
    },
    {
        "symbol": "?.field",
        "precedence": 10,
        "associativity": "postfix",
        "description": "field access, null when missing",
    },
    {
        "symbol": "[index]",
        "precedence": 10,
        "associativity": "postfix",
        "description": "index or slice",
    },
]

STATEMENTS: list[dict[str, str]] = [
    {"name": "let", "form": "let name = expr", "description": "immutable binding"},
    {
        "name": "let mut",
        "form": "let mut name = expr",
        "description": "mutable binding; `name = expr` reassigns",
    },
    {
        "name": "fn",
        "form": "fn name(params) => expr | fn name(params) { ... }",
        "description": "named function; recursion allowed",
    },
    {
        "name": "if",
        "form": "if cond { ... } else if cond { ... } else { ... }",
        "description": "conditional expression",
    },
    {
        "name": "match",
        "form": "match value { pattern => expr, ... }",
        "description": "pattern matching with guards",
    },
    {"name": "for", "form": "for x in items { ... }", "description": "loop over an Array"},
    {"name": "while", "form": "while cond { ... }", "description": "loop while a condition holds"},
    {"name": "break", "form": "break", "description": "leave the innermost loop"},
    {"name": "continue", "form": "continue", "description": "next iteration of the innermost loop"},
    {"name": "return", "form": "return expr", "description": "return from a function"},
    {
        "name": "try",
        "form": "try { ... } catch e { ... }",
        "description": "catch an error as an Error value",
    },
    {"name": "throw", "form": "throw value", "description": "raise a UserError"},
    {
        "name": "expression",
        "form": "expr",
        "description": "the program's value is its last statement's",
    },
]

LITERALS: list[dict[str, str]] = [
    {"type": "Int", "examples": "42, 1_000, 0x1f, 0b101, 10kb, 4kib, 250ms, 5s, 2min, 1h"},
    {"type": "Float", "examples": "3.14, 1e-3"},
    {"type": "String", "examples": '"text ${expr}", \'raw\', """multi-line"""'},
    {"type": "Bool", "examples": "true, false"},
    {"type": "Null", "examples": "null"},
    {"type": "Array", "examples": "[1, 2, 3]"},
    {"type": "Record", "examples": '{name: "a", "two words": 2}'},
    {"type": "Range", "examples": "1..10, 1..=10"},
    {"type": "Function", "examples": "fn(x) => x * 2"},
]

KEYWORDS = [
    "let", "mut", "fn", "if", "else", "match", "for", "in", "while", "break", "continue",
    "return", "try", "catch", "throw", "true", "false", "null", "and", "or", "not",
]  # fmt: skip


# -- types -------------------------------------------------------------------------------


def type_schema(type_name: str) -> dict[str, Any]:
    """The JSON Schema of a declared conch type (``Int``, ``String | Array``, ``Int?``)."""
    names = type_names(type_name)
    if "Any" in names:
        return {}
    schemas: list[dict[str, Any]] = []
    for n in names:
        s = _SCALAR_SCHEMAS.get(n, {})
        if s not in schemas:
            schemas.append(s)
    if len(schemas) == 1:
        return dict(schemas[0])
    return {"anyOf": schemas}


def types() -> list[dict[str, Any]]:
    """Every value type of the language, then the record shapes builtins return."""
    out = [
        {"name": name, "description": desc, "json": json, "properties": props}
        for name, desc, json, props in _TYPES
    ]
    for name, desc, fields in _SHAPES:
        out.append(
            {
                "name": name,
                "description": desc,
                "json": {
                    "type": "object",
                    "properties": {k: type_schema(v) for k, v in fields.items()},
                    "required": list(fields),
                },
                "properties": dict(fields),
            }
        )
    return out


# -- builtins ----------------------------------------------------------------------------


def builtins(category: str | None = None) -> list[dict[str, Any]]:
    return [b.summary() for b in all_builtins() if category is None or b.category == category]


def categories() -> list[str]:
    return sorted({b.category for b in all_builtins()})


def _param_schema(p: Param) -> dict[str, Any]:
    schema = type_schema(p.type)
    if p.variadic:
        schema = {"type": "array", "items": schema}
    elif not p.required and p.default is not None:
        from conch.lang import values

        schema = {**schema, "default": values.to_json_value(p.default)}
    return schema


def parameters_schema(b: Builtin) -> dict[str, Any]:
    """A builtin's parameters as one JSON object schema (what tool-calling models fill in)."""
    props: dict[str, Any] = {}
    required: list[str] = []
    for p in b.params:
        props[p.name] = {**_param_schema(p), "description": f"{p.name}: {p.type}"}
        if p.required and not p.variadic:
            required.append(p.name)
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    return schema


def call_request_schema(b: Builtin) -> dict[str, Any]:
    """The body of ``POST /api/v1/call/{name}``: positional ``args`` and/or named ``kwargs``."""
    positional = [_param_schema(p) for p in b.params if not p.variadic]
    variadic = next((p for p in b.params if p.variadic), None)
    args: dict[str, Any] = {"type": "array", "description": "positional arguments in order"}
    if positional:
        args["prefixItems"] = positional
    args["items"] = type_schema(variadic.type) if variadic else False
    kwargs = parameters_schema(b)
    kwargs.pop("required", None)
    kwargs["description"] = "arguments by parameter name"
    kwargs["additionalProperties"] = False
    return {
        "type": "object",
        "properties": {"args": args, "kwargs": kwargs},
        "description": f"Call `{b.signature}`",
    }


def language_schema() -> dict[str, Any]:
    return {
        "language": {"name": "conch", "version": __version__},
        "types": types(),
        "builtins": [b.to_dict() for b in all_builtins()],
        "syntax": {
            "statements": STATEMENTS,
            "operators": OPERATORS,
            "literals": LITERALS,
            "keywords": KEYWORDS,
        },
    }


# -- exports -----------------------------------------------------------------------------


def _tool_description(b: Builtin) -> str:
    return f"{b.description} Signature: {b.signature}. Effect: {b.effect}."


def json_schema() -> dict[str, Any]:
    """A JSON Schema (2020-12) document: every conch type and every builtin's parameters
    under ``$defs``; the root accepts any conch value."""
    defs: dict[str, Any] = {}
    for t in types():
        defs[t["name"]] = {**t["json"], "description": t["description"]}
    for b in all_builtins():
        defs[f"builtin.{b.name}"] = {
            **parameters_schema(b),
            "title": b.name,
            "description": _tool_description(b),
        }
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"urn:conch:schema:{__version__}",
        "title": "conch language schema",
        "description": "Value types of the conch language and the parameters of its builtins.",
        "$defs": defs,
        "anyOf": [{"$ref": f"#/$defs/{name}"} for name, *_ in _TYPES],
    }


ENVELOPE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "success": {"type": "boolean"},
        "result": {"type": ["string", "null"], "description": "string rendering of the value"},
        "type": {"type": ["string", "null"], "description": "conch type name of the value"},
        "value": {"description": "the value as JSON"},
        "output": {"type": "array", "items": {"type": "string"}},
        "error": {
            "anyOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "properties": _error_properties(),
                    "required": ["kind", "message"],
                },
            ]
        },
        "elapsed_ms": {"type": "integer"},
    },
    "required": ["success", "result", "type", "value", "output", "error", "elapsed_ms"],
}


def openapi(server_url: str | None = None) -> dict[str, Any]:
    """An OpenAPI 3.1 document with one operation per builtin (GPT Actions style)."""
    paths: dict[str, Any] = {}
    for b in all_builtins():
        paths[f"/api/v1/call/{b.name}"] = {
            "post": {
                "operationId": f"call_{b.name}",
                "summary": b.description[:300],
                "description": _tool_description(b),
                "tags": [b.category],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": call_request_schema(b)}},
                },
                "responses": {
                    "200": {
                        "description": "The call's result (success false with an error on a conch error)",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/Envelope"}
                            }
                        },
                    },
                    "400": {"description": "Malformed request"},
                },
            }
        }
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "conch builtins",
            "version": __version__,
            "description": "Every conch builtin as an HTTP operation of the conch server.",
        },
        "paths": paths,
        "components": {"schemas": {"Envelope": ENVELOPE_SCHEMA}},
    }
    if server_url:
        doc["servers"] = [{"url": server_url}]
    return doc


def openai_tools() -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": b.name,
                "description": _tool_description(b),
                "parameters": parameters_schema(b),
            },
        }
        for b in all_builtins()
    ]


def anthropic_tools() -> list[dict[str, Any]]:
    return [
        {"name": b.name, "description": _tool_description(b), "input_schema": parameters_schema(b)}
        for b in all_builtins()
    ]


def mcp_tools() -> dict[str, Any]:
    """The result of an MCP ``tools/list`` request."""
    return {
        "tools": [
            {
                "name": b.name,
                "description": _tool_description(b),
                "inputSchema": parameters_schema(b),
                "annotations": {
                    "title": b.signature,
                    "readOnlyHint": b.effect in ("pure", "read"),
                    "destructiveHint": b.effect == "write",
                    "openWorldHint": b.effect in ("network", "process", "model"),
                },
            }
            for b in all_builtins()
        ]
    }


_EXPORTS: dict[str, Callable[[], Any]] = {
    "json": json_schema,
    "openapi": openapi,
    "openai": openai_tools,
    "anthropic": anthropic_tools,
    "mcp": mcp_tools,
}


def export(fmt: str) -> Any:
    """The schema in format ``fmt`` (one of :data:`FORMATS`); ``KeyError`` otherwise."""
    return _EXPORTS[fmt]()
