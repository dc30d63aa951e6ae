"""The agent loop: ask the model for its next action, run the tools, feed back the
observations, until a final answer or the step budget runs out. Two protocols:

- ``native`` (:func:`run_native_loop`): the tools go to the model API as ``tools``; a reply's
  ``tool_calls`` are run (several of one turn concurrently) and each result goes back as a
  ``tool`` message; a reply without tool calls is the final answer.
- ``json`` (:func:`run_agent_loop`), for models without tool support, described below.

An action is ``{"tool": NAME, "args": {...}}`` or ``{"final": ANSWER}``. The model is asked to
answer with a JSON Schema generated from the chosen tools' declared parameters (an ``anyOf``
with one branch per tool plus the final answer), which the conch inference server turns into
a llama.cpp grammar; a provider that cannot constrain may still answer with prose or code
fences around the object, so the reply goes through a lenient parser, and a reply that still
is not an action gets one corrective retry.

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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from conch.lang.builtins.registry import lookup

FINAL_MAX_CHARS = 200
STRING_MAX_CHARS = 100


class ModelError(Exception):
    """The model could not be reached or answered with something that is not a completion."""


@dataclass
class Reply:
    text: str
    usage: dict[str, int] = field(default_factory=dict)
    # Native protocol: the reply's tool calls ``{id, name, arguments}`` (arguments as the
    # model wrote them: a JSON string), in order; None for a reply without any.
    tool_calls: list[dict[str, str]] | None = None


def call_id(index: int, k: int | None = None) -> str:
    """The id of a tool call of step ``index``: ``call_{index}`` for the one call of a step,
    ``call_{index}_{k}`` for the ``k``-th of several calls in one model turn (native)."""
    return f"call_{index}" if k is None else f"call_{index}_{k}"


@dataclass
class ToolResult:
    """What the model is told a tool call came to. ``args``: the arguments the call ran
    with, when they are not the model's (a person edited them)."""

    observation: str
    error: dict[str, Any] | None = None
    args: dict[str, Any] | None = None


class ToolsUnsupported(ModelError):
    """The model server refused a request carrying ``tools``: the model has no tool support
    (the JSON-action protocol is used for it from then on)."""


class Interrupt(Exception):
    """Raised by a call function: these calls wait for a person's decision, and the loop
    stops here (to be resumed from the task's checkpoint once they are decided)."""

    def __init__(self, pending: list[dict[str, Any]]) -> None:
        super().__init__(f"{len(pending)} tool call(s) wait for approval")
        self.pending = pending


ChatFn = Callable[[list[dict[str, Any]], dict[str, Any]], Awaitable[Reply]]
# Native protocol: (messages, the API's ``tools``) -> the reply.
ToolsChatFn = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Awaitable[Reply]]
ToolFn = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
# A tool call of step ``index``: (index, tool, args, call id) -> what the model is told.
CallFn = Callable[[int, str, dict[str, Any], str], Awaitable[ToolResult]]
StepFn = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class Outcome:
    status: str  # succeeded | failed
    result: Any = None
    error: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)


def unknown_tools(tools: list[str]) -> list[str]:
    return [name for name in tools if lookup(name) is None]


def _bounded(schema: dict[str, Any]) -> dict[str, Any]:
    # A small model under a grammar may otherwise write one string forever: bound them.
    # Tuples (prefixItems) are not in llama.cpp's schema-to-grammar subset: any array then.
    if "prefixItems" in schema:
        schema = {
            k: v for k, v in schema.items() if k not in ("prefixItems", "minItems", "maxItems")
        }
    if schema.get("type") == "string" and "maxLength" not in schema:
        return {**schema, "maxLength": STRING_MAX_CHARS}
    if "anyOf" in schema:
        return {**schema, "anyOf": [_bounded(s) for s in schema["anyOf"]]}
    if schema.get("items") == {}:
        # llama-cpp-python reads an empty ``items`` as absent and then fails: the same meaning.
        return {k: v for k, v in schema.items() if k != "items"}
    if isinstance(schema.get("items"), dict):
        return {**schema, "items": _bounded(schema["items"])}
    return schema


def tool_parameters(name: str) -> dict[str, Any]:
    """A builtin's declared parameters as the JSON Schema of an action's ``args``."""
    from conch.lang.schema import parameters_schema

    b = lookup(name)
    if b is None:
        raise KeyError(name)
    schema = parameters_schema(b)
    props = {}
    for key, prop in schema.get("properties", {}).items():
        prop = {k: v for k, v in prop.items() if k not in ("description", "default")}
        props[key] = _bounded(prop)
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if schema.get("required"):
        out["required"] = schema["required"]
    return out


def action_schema(tools: list[str]) -> dict[str, Any]:
    """The JSON Schema of one action for these tools."""
    variants: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {"tool": {"const": name}, "args": tool_parameters(name)},
            "required": ["tool", "args"],
            "additionalProperties": False,
        }
        for name in tools
    ]
    variants.append(
        {
            "type": "object",
            "properties": {"final": {"type": "string", "maxLength": FINAL_MAX_CHARS}},
            "required": ["final"],
            "additionalProperties": False,
        }
    )
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def _tool_line(name: str) -> str:
    b = lookup(name)
    assert b is not None
    return f"- {b.signature}: {b.description}"


def system_prompt(base: str, tools: list[str]) -> str:
    listing = "\n".join(_tool_line(n) for n in tools) or "(none: answer directly)"
    return (
        f"{base}\n\nTools:\n{listing}\n\n"
        'Reply with exactly one JSON object: {"tool": "<name>", "args": {...}} to call a tool '
        '(args by parameter name), or {"final": "<answer>"} when you have the answer.'
    )


def parse_action(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` that is an action (prose and code fences around it
    are ignored). Raises ``ValueError`` saying what is wrong."""
    decoder = json.JSONDecoder()
    found: Any = None
    pos = text.find("{")
    while pos != -1:
        try:
            found, _end = decoder.raw_decode(text, pos)
        except ValueError:
            pos = text.find("{", pos + 1)
            continue
        if isinstance(found, dict) and ("tool" in found or "final" in found):
            break
        pos = text.find("{", pos + 1)
        found = None
    if found is None:
        raise ValueError('no JSON object with "tool" or "final" in the reply')
    if "final" in found:
        return {"final": found["final"]}
    tool = found.get("tool")
    if not isinstance(tool, str):
        raise ValueError('"tool" must be a string naming a tool')
    args = found.get("args", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValueError('"args" must be an object of parameter values by name')
    return {"tool": tool, "args": args}


def check_args(name: str, args: dict[str, Any]) -> str | None:
    """Why ``args`` do not fit the tool's declared parameters, or None."""
    b = lookup(name)
    if b is None:
        return f"unknown tool {name!r}"
    declared = {p.name for p in b.params}
    extra = sorted(set(args) - declared)
    if extra:
        return f"{name} has no parameter {', '.join(extra)} (parameters: {', '.join(sorted(declared)) or 'none'})"
    missing = [p.name for p in b.params if p.required and not p.variadic and p.name not in args]
    if missing:
        return f"{name} needs {', '.join(missing)}"
    return None


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"… [truncated, {len(text) - limit} more characters]"


def observation_of(envelope: dict[str, Any], limit: int) -> tuple[str, dict[str, Any] | None]:
    """The text the model sees for a tool's result envelope, and the error if it failed."""
    if envelope.get("success"):
        result = envelope.get("result")
        return truncate("" if result is None else str(result), limit), None
    err = envelope.get("error") or {}
    error = {"kind": err.get("kind", "Error"), "message": err.get("message", "")}
    return truncate(f"{error['kind']}: {error['message']}", limit), error


def _add_usage(total: dict[str, int], usage: dict[str, int]) -> None:
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = usage.get(key)
        if isinstance(value, int):
            total[key] = total.get(key, 0) + value


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


async def run_agent_loop(
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
    """Run the loop. Tool calls go to ``run_call`` when given (it may raise
    :class:`Interrupt`, which stops the loop and propagates), else to ``call_tool``, whose
    result envelope becomes the observation. ``history``: messages placed between the system
    message and the goal (earlier tasks of a thread); ``notes``: user messages added before
    step ``i``'s model request, by ``i`` (a fork's added message)."""
    run_call = _call_fn(call_tool, run_call, observation_chars)
    schema = action_schema(tools)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt(system, tools)},
        *(history or ()),
        {"role": "user", "content": goal},
    ]
    out = Outcome(status="running")
    allowed = set(tools)
    for index in range(max_steps):
        if notes:
            messages.extend({"role": "user", "content": n} for n in notes.get(index, ()))
        started = time.perf_counter()
        usage: dict[str, int] = {}
        reply = await chat(messages, schema)
        _add_usage(usage, reply.usage)
        try:
            action = parse_action(reply.text)
        except ValueError as first:
            # One corrective retry: the model sees its reply and what was wrong with it.
            retry = [
                *messages,
                {"role": "assistant", "content": reply.text},
                {
                    "role": "user",
                    "content": f"That reply is not a valid action ({first}). Answer with one "
                    'JSON object only: {"tool": ..., "args": {...}} or {"final": ...}.',
                },
            ]
            reply = await chat(retry, schema)
            _add_usage(usage, reply.usage)
            try:
                action = parse_action(reply.text)
            except ValueError as second:
                _add_usage(out.usage, usage)
                out.status = "failed"
                out.error = {
                    "kind": "ProviderError",
                    "message": f"the model did not give a valid action after a corrective retry: {second}",
                }
                return out
        _add_usage(out.usage, usage)
        final = "final" in action
        error: dict[str, Any] | None = None
        if final:
            name, args, observation = "final", {"final": action["final"]}, None
        else:
            name, args = action["tool"], action["args"]
            problem = (
                f"unknown tool {name!r}; the tools are: {', '.join(tools) or 'none'}"
                if name not in allowed
                else check_args(name, args)
            )
            if problem is not None:
                error = {
                    "kind": "NameError" if name not in allowed else "TypeError",
                    "message": problem,
                }
                observation = f"{error['kind']}: {problem}"
            else:
                done = await run_call(index, name, args, call_id(index))
                observation, error = done.observation, done.error
                if done.args is not None:
                    # The call ran with a person's edit of the arguments: the conversation
                    # shows the call as it ran.
                    args = done.args
                    action = {"tool": name, "args": args}
        step: dict[str, Any] = {
            "index": index,
            "action": name,
            "args": args,
            "observation": observation,
            "error": error,
            "elapsed_ms": _ms(started),
            "usage": usage,
        }
        out.steps.append(step)
        if on_step is not None:
            await on_step(step)
        if final:
            out.status = "succeeded"
            out.result = action["final"]
            return out
        messages.append({"role": "assistant", "content": json.dumps(action, ensure_ascii=False)})
        messages.append({"role": "user", "content": f"Observation: {observation}"})
    out.status = "failed"
    out.error = {
        "kind": "LimitError",
        "message": f"no final answer within max_steps={max_steps} steps",
    }
    return out


def transcript(
    goal: str,
    steps: list[dict[str, Any]],
    *,
    history: list[dict[str, Any]] | None = None,
    notes: Mapping[int, list[str]] | None = None,
    native: bool = False,
) -> list[dict[str, Any]]:
    """The conversation (less the system message) that the loop held after these recorded
    steps, its final answer included: the history, the goal, each step's action and
    observation, the notes where they were added. What a later task of the same thread
    starts from. It must build the messages as the loops do: ``native`` for
    :func:`run_native_loop` (an assistant message with ``tool_calls`` and one ``tool``
    message per call, the final answer as text), else :func:`run_agent_loop`'s JSON actions."""
    messages: list[dict[str, Any]] = [*(history or ()), {"role": "user", "content": goal}]
    notes = notes or {}
    for step in steps:
        index = int(step["index"])
        messages.extend({"role": "user", "content": n} for n in notes.get(index, ()))
        if native:
            messages.extend(_native_turn(step))
            continue
        if step["action"] == "final":
            action: dict[str, Any] = {"final": step["args"].get("final")}
        else:
            action = {"tool": step["action"], "args": step["args"]}
        messages.append({"role": "assistant", "content": json.dumps(action, ensure_ascii=False)})
        if step["action"] != "final":
            messages.append({"role": "user", "content": f"Observation: {step['observation']}"})
    # Notes added after the last step (its model request failed, or was never answered).
    after = max((int(s["index"]) for s in steps), default=-1)
    for index in sorted(i for i in notes if i > after):
        messages.extend({"role": "user", "content": n} for n in notes[index])
    return messages


def _native_turn(step: dict[str, Any]) -> list[dict[str, Any]]:
    """A recorded native step as the messages of its turn (call ids as recorded: the
    model's own ids are not kept, and any consistent ids pair calls with results)."""
    if step["action"] == "final":
        return [{"role": "assistant", "content": str(step["args"].get("final") or "")}]
    calls = step.get("calls") or [
        {"call_id": call_id(int(step["index"])), "tool": step["action"], "args": step["args"],
         "observation": step["observation"]}
    ]  # fmt: skip
    tool_calls = [
        {
            "id": c["call_id"],
            "type": "function",
            "function": {"name": c["tool"], "arguments": json.dumps(c["args"], ensure_ascii=False)},
        }
        for c in calls
    ]
    results = [{"role": "tool", "tool_call_id": c["call_id"], "content": c["observation"]} for c in calls]
    return [{"role": "assistant", "content": None, "tool_calls": tool_calls}, *results]


# -- the native protocol ------------------------------------------------------------------


def tool_specs(tools: list[str]) -> list[dict[str, Any]]:
    """The chosen builtins as the chat API's ``tools`` (OpenAI function tools)."""
    out = []
    for name in tools:
        b = lookup(name)
        if b is None:
            raise KeyError(name)
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": f"{b.signature}: {b.description}",
                    "parameters": tool_parameters(name),
                },
            }
        )
    return out


def native_system_prompt(base: str, tools: list[str]) -> str:
    if not tools:
        return f"{base}\n\nAnswer directly."
    return (
        f"{base}\n\nCall the tools you need (several at once when they do not depend on "
        "each other); when you have the answer, reply with it as plain text."
    )


def _call_args(name: str, raw: str, allowed: set[str], tools: list[str]) -> tuple[dict[str, Any], dict[str, Any] | None]:  # fmt: skip
    """A tool call's arguments, and the error the model is told instead of running it."""
    if name not in allowed:
        problem = f"unknown tool {name!r}; the tools are: {', '.join(tools) or 'none'}"
        return {}, {"kind": "NameError", "message": problem}
    try:
        args = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        return {}, {"kind": "TypeError", "message": f"the arguments of {name} are not JSON: {exc}"}
    if not isinstance(args, dict):
        return {}, {"kind": "TypeError", "message": f"the arguments of {name} are not an object"}
    wrong = check_args(name, args)
    if wrong is not None:
        return args, {"kind": "TypeError", "message": wrong}
    return args, None


async def run_native_loop(
    *,
    goal: str,
    tools: list[str],
    max_steps: int,
    system: str,
    chat: ToolsChatFn,
    call_tool: ToolFn | None = None,
    on_step: StepFn | None = None,
    observation_chars: int = 4000,
    run_call: CallFn | None = None,
    history: list[dict[str, Any]] | None = None,
    notes: Mapping[int, list[str]] | None = None,
) -> Outcome:
    """The loop with the model API's own tool calls (``history`` and ``notes`` as in
    :func:`run_agent_loop`). Each model turn is one step (``max_steps``
    counts turns): a reply with ``tool_calls`` runs them all, concurrently, each through
    ``run_call`` (ids: :func:`call_id`); a reply without is the final answer (its text).

    The turn's step is ``{index, action, args, observation, error, elapsed_ms, usage,
    calls}``: ``calls`` lists ``{call_id, tool, args, observation, error}`` for every call of
    the turn, and ``action``/``args``/``observation``/``error`` repeat the first one's (as
    in a JSON-protocol step). When calls of the turn raise :class:`Interrupt`, the others
    still run to their end, and one :class:`Interrupt` with every pending call propagates."""
    run = _call_fn(call_tool, run_call, observation_chars)
    specs = tool_specs(tools)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": native_system_prompt(system, tools)},
        *(history or ()),
        {"role": "user", "content": goal},
    ]
    out = Outcome(status="running")
    allowed = set(tools)

    async def one(
        index: int, cid: str, call: dict[str, str], edited: set[str]
    ) -> dict[str, Any]:
        name = call["name"]
        args, error = _call_args(name, call.get("arguments") or "", allowed, tools)
        if error is not None:
            observation = f"{error['kind']}: {error['message']}"
        else:
            done = await run(index, name, args, cid)
            observation, error = done.observation, done.error
            if done.args is not None:
                args = done.args  # a person's edit: the conversation shows it as it ran
                edited.add(cid)
        return {"call_id": cid, "tool": name, "args": args,
                "observation": observation, "error": error}  # fmt: skip

    for index in range(max_steps):
        started = time.perf_counter()
        if notes:
            messages.extend({"role": "user", "content": n} for n in notes.get(index, ()))
        reply = await chat(messages, specs)
        usage: dict[str, int] = {}
        _add_usage(usage, reply.usage)
        _add_usage(out.usage, usage)
        if not reply.tool_calls:
            step: dict[str, Any] = {
                "index": index, "action": "final", "args": {"final": reply.text},
                "observation": None, "error": None, "elapsed_ms": _ms(started), "usage": usage,
            }  # fmt: skip
            out.steps.append(step)
            if on_step is not None:
                await on_step(step)
            out.status = "succeeded"
            out.result = reply.text
            return out
        several = len(reply.tool_calls) > 1
        ids = [call_id(index, k if several else None) for k in range(len(reply.tool_calls))]
        edited: set[str] = set()

        got = await asyncio.gather(
            *(one(index, cid, c, edited) for cid, c in zip(ids, reply.tool_calls, strict=True)),
            return_exceptions=True,
        )
        pending: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        for item in got:
            if isinstance(item, Interrupt):
                pending.extend(item.pending)
            elif isinstance(item, BaseException):
                raise item
            else:
                calls.append(item)
        if pending:
            raise Interrupt(pending)
        first = calls[0]
        step = {
            "index": index, "action": first["tool"], "args": first["args"],
            "observation": first["observation"], "error": first["error"],
            "elapsed_ms": _ms(started), "usage": usage, "calls": calls,
        }  # fmt: skip
        out.steps.append(step)
        if on_step is not None:
            await on_step(step)
        messages.append(
            {
                "role": "assistant",
                "content": reply.text or None,
                "tool_calls": [
                    {
                        "id": c.get("id") or cid,
                        "type": "function",
                        "function": {
                            "name": c["name"],
                            "arguments": json.dumps(done["args"], ensure_ascii=False)
                            if cid in edited
                            else c.get("arguments") or "{}",
                        },
                    }
                    for cid, c, done in zip(ids, reply.tool_calls, calls, strict=True)
                ],
            }
        )
        for cid, c, done in zip(ids, reply.tool_calls, calls, strict=True):
            messages.append(
                {"role": "tool", "tool_call_id": c.get("id") or cid, "content": done["observation"]}
            )
    out.status = "failed"
    out.error = {
        "kind": "LimitError",
        "message": f"no final answer within max_steps={max_steps} steps (model turns)",
    }
    return out
