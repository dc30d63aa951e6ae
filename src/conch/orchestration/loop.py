"""The agent loop: ask the model for its next turn, run the tools it calls, feed back the
observations, until a final answer or the step budget runs out.

One loop (:func:`run_loop`) for both tool-call protocols (:mod:`.protocols`): the protocol
says how a turn is asked for and read and how it continues the conversation; the loop keeps
the steps, the token usage, the notes and the step limit. :func:`run_agent_loop` (JSON
actions) and :func:`run_native_loop` (the model API's tool calls) are its two entry points.

A model that repeats a tool call that fails the same way each time (same tool, arguments and
error) is told so in the observation of its third such call (:data:`NOTE_AT`), and a fourth
ends the task as failed with ``StuckError`` (:class:`Repeats`) rather than letting it spend
its remaining steps.

The loop knows nothing of HTTP, databases or processes: the model call, the tool call and
what to do with each step are functions given to it. Given the same model replies and tool
results it makes the same calls in the same order, which is what lets the orchestrator
resume a task from its checkpoint by replaying recorded replies and results (and what lets a
tool call stop the loop to wait for a person: :class:`Interrupt`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conch.orchestration.protocols import PROTOCOLS, Call, Done, ToolProtocol
from conch.orchestration.turns import (
    CallFn,
    ChatFn,
    Interrupt,
    ModelError,
    Reply,
    StepFn,
    ToolFn,
    ToolResult,
    ToolsUnsupported,
    add_usage,
    call_id,
    observation_of,
)

__all__ = [
    "Interrupt",
    "ModelError",
    "Outcome",
    "Reply",
    "ToolResult",
    "ToolsUnsupported",
    "call_id",
    "run_agent_loop",
    "run_loop",
    "run_native_loop",
    "transcript",
]



# The third time one call fails the same way the model is told so; the fourth ends the task.
NOTE_AT = 3
STUCK_AT = 4
# What a person whose task ended so can change (a new user's first task, on the bundled
# 135M model, ends one of these two ways).
STUCK_HINT = (
    "a model that repeats a failing call is usually too small for tool use: give the task a "
    'model that can use tools ("model": "ollama:qwen2.5:7b", or any OpenAI-compatible '
    'provider); docs/orchestration.md, "Which model for agents"'
)
LIMIT_HINT = (
    "raise max_steps, or give the task a more capable model; docs/orchestration.md, "
    '"Which model for agents"'
)


class Repeats:
    """The tool calls of a run that failed, counted by what they were and how they failed.
    Counted from the steps as the loop meets them, replayed ones included, so a resumed or
    forked task notices what its first run noticed, and adds the same note."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str, str], int] = {}

    def see(self, done: list[Done]) -> dict[str, Any] | None:
        """Count the failed calls of a turn; add the note to the observation of a call that
        failed the same way for the :data:`NOTE_AT`-th time; the ``StuckError`` once one has
        for the :data:`STUCK_AT`-th, else None."""
        stuck: dict[str, Any] | None = None
        for d in done:
            r = d.record
            error = r.get("error")
            if not error:
                continue
            args = json.dumps(r["args"], sort_keys=True, ensure_ascii=False, default=str)
            kind, message = str(error.get("kind")), str(error.get("message"))
            key = (r["tool"], args, kind, message)
            n = self.counts[key] = self.counts.get(key, 0) + 1
            if n == NOTE_AT:
                r["observation"] = (
                    f"{r['observation']}\n\nNote: this exact call ({r['tool']} with these "
                    f"arguments) has now failed {n} times in the same way. Calling it again "
                    "will not help, and the task stops if it is repeated unchanged: change "
                    "the arguments, use another tool, or give your final answer."
                )
            elif n >= STUCK_AT and stuck is None:
                stuck = {
                    "kind": "StuckError",
                    "message": f"stuck: the model called {r['tool']}({args}) {n} times and it "
                    f"failed the same way each time: {kind}: {message}",
                    "call": {"tool": r["tool"], "args": r["args"]},
                    "count": n,
                    "error": {"kind": kind, "message": message},
                    "hint": STUCK_HINT,
                }
        return stuck


@dataclass
class Outcome:
    status: str  # succeeded | failed
    result: Any = None
    error: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)


def _ms(since: float) -> int:
    return int((time.perf_counter() - since) * 1000)


def _call_fn(call_tool: ToolFn | None, run_call: CallFn | None, chars: int) -> CallFn:
    if run_call is not None:
        return run_call
    if call_tool is None:
        raise TypeError("the agent loop needs call_tool or run_call")
    tool_fn = call_tool

    async def run_envelope(_index: int, name: str, args: dict[str, Any], _cid: str) -> ToolResult:
        observation, error = observation_of(await tool_fn(name, args), chars)
        return ToolResult(observation, error)

    return run_envelope


async def _run_one(run: CallFn, index: int, call: Call) -> Done:
    if call.error is not None:
        observation = f"{call.error['kind']}: {call.error['message']}"
        return Done(_call_record(call, call.args, observation, call.error))
    result = await run(index, call.tool, call.args, call.call_id)
    edited = result.args is not None
    args = result.args if result.args is not None else call.args
    return Done(_call_record(call, args, result.observation, result.error), edited)


def _call_record(call: Call, args: dict[str, Any], observation: str, error: Any) -> dict[str, Any]:
    return {"call_id": call.call_id, "tool": call.tool, "args": args,
            "observation": observation, "error": error}  # fmt: skip


async def _run_calls(run: CallFn, index: int, calls: list[Call]) -> list[Done]:
    """Run a turn's calls: one at once, several concurrently. When calls raise
    :class:`Interrupt`, the others still run to their end, and one :class:`Interrupt` with
    every pending call propagates."""
    if len(calls) == 1:
        return [await _run_one(run, index, calls[0])]
    got = await asyncio.gather(*(_run_one(run, index, c) for c in calls), return_exceptions=True)
    pending: list[dict[str, Any]] = []
    done: list[Done] = []
    for item in got:
        if isinstance(item, Interrupt):
            pending.extend(item.pending)
        elif isinstance(item, BaseException):
            raise item
        else:
            done.append(item)
    if pending:
        raise Interrupt(pending)
    return done


async def run_loop(
    protocol: str | ToolProtocol,
    *,
    goal: str,
    tools: list[str],
    max_steps: int,
    system: str,
    chat: ChatFn,
    call_tool: ToolFn | None = None,
    on_step: StepFn | None = None,
    observation_chars: int = 4000,
    run_call: CallFn | None = None,
    history: list[dict[str, Any]] | None = None,
    notes: Mapping[int, list[str]] | None = None,
) -> Outcome:
    """Run the loop in ``protocol`` (``json``, ``native``, or a protocol object).
    ``chat(messages, constraint)`` asks the model (the constraint: a JSON Schema of an action,
    or the API's ``tools``). Tool calls go to ``run_call`` when given (it may raise
    :class:`Interrupt`, which stops the loop and propagates), else to ``call_tool``, whose
    result envelope becomes the observation. ``history``: messages placed between the system
    message and the goal (earlier tasks of a thread); ``notes``: user messages added before
    step ``i``'s model request, by ``i`` (a fork's added message).

    A step is ``{index, action, args, observation, error, elapsed_ms, usage}``; a native step
    adds ``calls``, every call of its turn (``{call_id, tool, args, observation, error}``,
    run concurrently), and its ``action``, ``args``, ``observation`` and ``error`` repeat the
    first one's. ``max_steps`` counts model turns (a JSON corrective retry is part of its
    step). A call that failed the same way for the fourth time ends the run as ``failed``
    with ``StuckError`` (:class:`Repeats`)."""
    run = _call_fn(call_tool, run_call, observation_chars)
    strategy = PROTOCOLS[protocol](tools) if isinstance(protocol, str) else protocol
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": strategy.system_prompt(system)},
        *(history or ()),
        {"role": "user", "content": goal},
    ]
    out = Outcome(status="running")
    repeats = Repeats()

    async def record(step: dict[str, Any]) -> None:
        out.steps.append(step)
        if on_step is not None:
            await on_step(step)

    for index in range(max_steps):
        if notes:
            messages.extend({"role": "user", "content": n} for n in notes.get(index, ()))
        started = time.perf_counter()
        turn = await strategy.ask(chat, messages, index)
        add_usage(out.usage, turn.usage)
        if turn.failure is not None:
            out.status, out.error = "failed", turn.failure
            return out
        if turn.final:
            await record({
                "index": index, "action": "final", "args": {"final": turn.answer},
                "observation": None, "error": None, "elapsed_ms": _ms(started),
                "usage": turn.usage,
            })  # fmt: skip
            out.status, out.result = "succeeded", turn.answer
            return out
        done = await _run_calls(run, index, turn.calls)
        stuck = repeats.see(done)
        await record(strategy.step(index, done, _ms(started), turn.usage))
        if stuck is not None:
            out.status, out.error = "failed", stuck
            return out
        strategy.add_turn(messages, turn, done)
    out.status = "failed"
    out.error = {
        "kind": "LimitError",
        "message": f"no final answer within max_steps={max_steps} steps{strategy.limit_note}",
        "hint": LIMIT_HINT,
    }
    return out


async def run_agent_loop(**kw: Any) -> Outcome:
    """:func:`run_loop` with JSON actions (one action per model turn, for any model)."""
    return await run_loop("json", **kw)


async def run_native_loop(**kw: Any) -> Outcome:
    """:func:`run_loop` with the model API's tool calls (several per turn, concurrently)."""
    return await run_loop("native", **kw)


def transcript(
    goal: str,
    steps: list[dict[str, Any]],
    *,
    history: list[dict[str, Any]] | None = None,
    notes: Mapping[int, list[str]] | None = None,
    native: bool = False,
) -> list[dict[str, Any]]:
    """The conversation (less the system message) that the loop held after these recorded
    steps, its final answer included: the history, the goal, each step's turn, the notes
    where they were added. What a later task of the same thread starts from; built as the
    loop builds it, in the protocol the steps were recorded in (``native`` or JSON)."""
    replay = PROTOCOLS["native" if native else "json"].replay
    messages: list[dict[str, Any]] = [*(history or ()), {"role": "user", "content": goal}]
    notes = notes or {}
    for step in steps:
        index = int(step["index"])
        messages.extend({"role": "user", "content": n} for n in notes.get(index, ()))
        messages.extend(replay(step))
    # Notes added after the last step (its model request failed, or was never answered).
    after = max((int(s["index"]) for s in steps), default=-1)
    for index in sorted(i for i in notes if i > after):
        messages.extend({"role": "user", "content": n} for n in notes[index])
    return messages
