"""The language's port to its host (conch.lang.host): what ``ai``, ``embed`` and ``agent`` ask
of the program running them, and a run that was given no host.

The host here is a second implementation of the port, written for these tests (the real ones,
conch.host's, are tested in tests/core/test_host.py and through the shell and the servers):
it answers from a table and keeps what it was asked."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conch.lang import run
from conch.lang.context import Context, Limits
from conch.lang.errors import ConchError
from conch.lang.host import ModelRequestError


class TableHost:
    """Answers chat with ``reply`` (or raises ``fail``), embeddings with one vector per
    input; an agent run calls the tools it is given, each in turn, on a thread of its own."""

    def __init__(self, reply: str = "hello", fail: ModelRequestError | None = None,
                 calls: list[tuple[str, dict[str, Any]]] | None = None) -> None:
        self.reply = reply
        self.fail = fail
        self.calls = calls or []
        self.asked: list[tuple[str, dict[str, Any], float | None]] = []
        self.agents: list[dict[str, Any]] = []

    def chat(self, body: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        self.asked.append(("chat", body, deadline))
        if self.fail is not None:
            raise self.fail
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": self.reply},
                             "finish_reason": "stop"}]}

    def embed(self, body: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        self.asked.append(("embed", body, deadline))
        if self.fail is not None:
            raise self.fail
        return {"data": [{"index": i, "embedding": [float(len(text)), 1.0]}
                         for i, text in enumerate(body["input"])]}

    def run_agent(self, *, goal: str, tools: list[str] | None, max_steps: int,
                  model: str | None, deadline: float | None, call_tool: Any) -> dict[str, Any]:
        results: list[dict[str, Any]] = []

        def loop() -> None:  # as conch.host does inside a running event loop
            results.extend(call_tool(name, args) for name, args in self.calls)

        thread = threading.Thread(target=loop)
        thread.start()
        thread.join()
        self.agents.append({"goal": goal, "tools": tools, "max_steps": max_steps,
                            "model": model, "deadline": deadline})
        return {"id": "task_test", "status": "succeeded", "result": "done", "steps": results,
                "error": None}


# -- a run without a host -------------------------------------------------------------------


@pytest.mark.parametrize(("code", "message"), [
    ('ai("hi")', "ai: this run has no host to reach a model"),
    ('embed("hi")', "embed: this run has no host to reach a model"),
    ('agent({goal: "g", tools: [], max_steps: 0})', "agent: this run has no host to run an agent"),
])
def test_a_run_without_a_host_says_what_is_missing(code: str, message: str) -> None:
    with pytest.raises(ConchError) as info:
        run(code, context=Context())
    assert info.value.kind == "ProviderError"
    assert info.value.message == message
    assert info.value.hint is not None and "Context(host=" in info.value.hint


def test_without_a_host_the_error_can_be_caught_and_nothing_else_changes() -> None:
    assert run('try { ai("hi") } catch e { e.kind }', context=Context()) == "ProviderError"
    assert run("embed([])", context=Context()) == []  # nothing to ask a model


def test_the_arguments_are_checked_before_the_host_is_asked_for() -> None:
    with pytest.raises(ConchError) as info:
        run('agent({goal: "g", tools: ["no_such_builtin"]})', context=Context())
    assert info.value.kind == "NameError"
    with pytest.raises(ConchError) as info:
        run('embed([1])', context=Context())
    assert info.value.kind == "TypeError"


# -- a run with a host ----------------------------------------------------------------------


def test_ai_asks_the_host_for_a_chat_completion() -> None:
    host = TableHost(reply="hi there")
    ctx = Context(host=host)
    assert run('ai("Say hi.", system="Be brief.", max_tokens=5, temperature=0)', context=ctx) == "hi there"
    kind, body, deadline = host.asked[0]
    assert kind == "chat" and deadline is None
    assert body == {"model": None, "max_tokens": 5, "temperature": 0,
                    "messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Say hi."}]}
    run('ai("x", model="openai:gpt-4o-mini")', context=ctx)
    assert host.asked[1][1]["model"] == "openai:gpt-4o-mini"


def test_ai_with_a_schema_parses_the_answer() -> None:
    host = TableHost(reply='{"colour": "red"}')
    value = run('ai("A colour?", schema={type: "object"})', context=Context(host=host))
    assert value == {"colour": "red"}
    assert host.asked[0][1]["response_format"]["json_schema"]["schema"] == {"type": "object"}


def test_the_host_gets_the_runs_deadline() -> None:
    host = TableHost()
    started = time.monotonic()
    run('ai("x")', context=Context(host=host, limits=Limits(wall_time_s=30)))
    deadline = host.asked[0][2]
    assert deadline is not None and started + 29 < deadline <= time.monotonic() + 30


def test_embed_asks_the_host_for_vectors() -> None:
    host = TableHost()
    ctx = Context(host=host)
    assert run('embed("abc")', context=ctx) == [3.0, 1.0]
    assert run('embed(["a", "bb"], model="local:minilm")', context=ctx) == [[1.0, 1.0], [2.0, 1.0]]
    assert host.asked[1][1] == {"input": ["a", "bb"], "encoding_format": "float", "model": "local:minilm"}


@pytest.mark.parametrize(("status", "kind"), [
    (400, "ValueError"), (404, "ValueError"), (422, "ValueError"), (504, "TimeoutError"),
    (502, "ProviderError"), (500, "ProviderError"),
])
def test_a_failed_model_request_becomes_a_conch_error(status: int, kind: str) -> None:
    ctx = Context(host=TableHost(fail=ModelRequestError(status, "the reason")))
    for code, name in (('ai("x")', "ai"), ('embed("x")', "embed")):
        with pytest.raises(ConchError) as info:
            run(code, context=ctx)
        assert (info.value.kind, info.value.message) == (kind, f"{name}: the reason")


def test_agent_hands_its_spec_to_the_host() -> None:
    host = TableHost()
    ctx = Context(host=host)
    out = run('agent({goal: "Count", tools: ["len"], max_steps: 3, model: "local:m"})', context=ctx)
    assert out == {"id": "task_test", "status": "succeeded", "result": "done", "steps": [], "error": None}
    run('agent({goal: "Defaults"})', context=ctx)
    assert host.agents == [
        {"goal": "Count", "tools": ["len"], "max_steps": 3, "model": "local:m", "deadline": None},
        # No tools given: the host's default agent's; no model: the host's default.
        {"goal": "Defaults", "tools": None, "max_steps": 10, "model": None, "deadline": None},
    ]


def test_agent_tool_calls_run_in_the_calling_run(tmp_path: Path) -> None:
    """The host may run its loop anywhere (here on another thread): a tool call still runs
    under the run's context, so its workspace and effects bind it."""
    (tmp_path / "note.txt").write_text("inside")
    host = TableHost(calls=[
        ("len", {"value": [1, 2, 3]}),
        ("cat", {"path": "note.txt"}),
        ("cat", {"path": "/etc/hostname"}),
        ("write", {"path": "out.txt", "content": "x"}),
        ("len", {"value": 3}),
    ])
    ctx = Context(workspace=tmp_path, host=host, allowed_effects=frozenset({"pure", "read", "model"}))
    steps = run('agent({goal: "g", tools: ["len", "cat", "write"]}).steps', context=ctx)
    assert steps[0] == {"success": True, "result": "3"}
    assert steps[1] == {"success": True, "result": "inside"}
    assert steps[2]["success"] is False and steps[2]["error"]["kind"] == "PermissionError"
    assert "outside the workspace" in steps[2]["error"]["message"]
    assert steps[3]["success"] is False and steps[3]["error"]["kind"] == "PermissionError"
    assert not (tmp_path / "out.txt").exists()
    assert steps[4]["success"] is False and steps[4]["error"]["kind"] == "TypeError"


def test_the_model_effect_is_checked_before_the_host_is_asked() -> None:
    host = TableHost()
    ctx = Context(host=host, allowed_effects=frozenset({"pure", "read"}))
    for code in ('ai("x")', 'embed("x")', 'agent({goal: "g", tools: []})'):
        with pytest.raises(ConchError) as info:
            run(code, context=ctx)
        assert info.value.kind == "PermissionError"
    assert host.asked == [] and host.agents == []
