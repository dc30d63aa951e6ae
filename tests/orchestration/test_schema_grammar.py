"""The action schema compiles to a llama.cpp grammar that llama.cpp accepts, for the
default agent's whole tool list too (a bound too large on a string makes llama.cpp refuse
the grammar)."""

from __future__ import annotations

import pytest

from conch.inference.engines.llama.grammar import schema_grammar
from conch.orchestration.agents import default_tools
from conch.orchestration.protocols import action_schema, parse_action

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.mark.parametrize("tools", [["ls", "len"], [], None])
def test_llama_cpp_accepts_the_action_grammar(tools: list[str] | None) -> None:
    schema = action_schema(default_tools() if tools is None else tools)
    grammar = schema_grammar(schema, "response_format")
    parsed = llama_cpp.LlamaGrammar.from_string(grammar, verbose=False)
    assert parsed is not None


def test_lenient_parser() -> None:
    assert parse_action('Sure: {"tool": "ls", "args": {"path": "."}} done') == {
        "tool": "ls",
        "args": {"path": "."},
    }
    assert parse_action('```json\n{"final": "ok"}\n```') == {"final": "ok"}
    assert parse_action('{"x": 1} {"tool": "len"}') == {"tool": "len", "args": {}}
    for bad in ("no json", '{"tool": 3}', '{"tool": "ls", "args": [1]}', "{broken"):
        with pytest.raises(ValueError):
            parse_action(bad)
