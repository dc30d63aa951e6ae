"""GBNF grammars for llama.cpp from a chat's constraints: ``response_format`` and tools.

With ``tool_choice`` "required" or a named function the whole output is one tool call; with
"auto" the grammar is lazy: text is free until the model opens ``<tool_call>``, and from
there it must be a valid call, so a started call always parses.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from conch.inference.engines.base import ChatInputError, ChatSpec
from conch.inference.engines.tool_calls import TOOL_CLOSE, TOOL_OPEN, tool_call_schema


def schema_grammar(schema: dict[str, Any], param: str, prop_order: Sequence[str] = ()) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return json_schema_to_gbnf(json.dumps(schema), list(prop_order))
    except Exception as exc:
        # The converter raises bare Exceptions (and KeyErrors) for schema features it lacks;
        # to the client they are all one thing: a schema this server cannot enforce.
        raise ChatInputError(f"Unsupported JSON schema: {exc}", param) from exc


def _wrap_tool_grammar(inner: str) -> str:
    """Rename the object grammar's root and wrap it in the tool-call tags."""
    renamed = inner.replace("root ::=", "call ::=", 1)
    return f'root ::= "{TOOL_OPEN}" call "{TOOL_CLOSE}"\n{renamed}'


def plan_constraints(spec: ChatSpec) -> None:
    """Set the grammar (and trigger) on ``spec.sampling`` from response_format and tools."""
    if spec.tools_active:
        selected = spec.tools
        if spec.named_tool is not None:
            selected = [t for t in spec.tools if t.name == spec.named_tool]
            if not selected:
                raise ChatInputError(f"tool_choice names an unknown function '{spec.named_tool}'", "tool_choice")
        inner = schema_grammar(tool_call_schema(selected), "tools", ("name", "arguments"))
        spec.sampling.grammar = _wrap_tool_grammar(inner)
        if spec.tool_choice == "auto":
            spec.sampling.grammar_triggers = [r"[\s\S]*?(" + TOOL_OPEN + r")[\s\S]*"]
        return
    fmt = spec.response_format or {}
    ftype = fmt.get("type", "text")
    if ftype == "json_object":
        spec.sampling.grammar = schema_grammar({"type": "object"}, "response_format")
    elif ftype == "json_schema":
        js = fmt.get("json_schema") or {}
        schema = js.get("schema") or {"type": "object"}
        spec.sampling.grammar = schema_grammar(schema, "response_format.json_schema.schema")
