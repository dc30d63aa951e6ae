"""The agent loop's two tool-call protocols, the strategies :func:`.loop.run_loop` runs:

- ``native`` (:class:`NativeTools`): the tools go to the model API as ``tools``; a reply's
  ``tool_calls`` are run (several of one turn concurrently) and each result goes back as a
  ``tool`` message; a reply without tool calls is the final answer.
- ``json`` (:class:`JsonActions`), for models without tool support: an action is
  ``{"tool": NAME, "args": {...}}`` or ``{"final": ANSWER}``. The model is asked to answer
  with a JSON Schema generated from the chosen tools' declared parameters (an ``anyOf`` with
  one branch per tool plus the final answer), which the conch inference server turns into a
  llama.cpp grammar; a provider that cannot constrain may still answer with prose or code
  fences around the object, so the reply goes through a lenient parser, and a reply that
  still is not an action gets one corrective retry.

A protocol says how to ask for a turn and read the reply (:meth:`ToolProtocol.ask`), what a
step records (:meth:`ToolProtocol.step`) and how a turn continues the conversation
(:meth:`ToolProtocol.add_turn`, and :meth:`ToolProtocol.replay` for a recorded step).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from conch.lang.builtins.registry import lookup
from conch.orchestration.turns import ChatFn, Reply, add_usage, call_id

FINAL_MAX_CHARS = 200
STRING_MAX_CHARS = 100

Messages = list[dict[str, Any]]


# -- the builtins as tools ----------------------------------------------------------------


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


# -- a turn, as a protocol reads it -------------------------------------------------------


@dataclass
class Call:
    """A tool call the model asked for; ``error``: refused before it runs (an unknown tool,
    arguments that do not fit), which is what the model is told."""

    call_id: str
    tool: str
    args: dict[str, Any]
    error: dict[str, Any] | None = None


@dataclass
class Turn:
    """One model turn: a final answer, tool calls to run, or (``failure``) neither."""

    usage: dict[str, int]
    final: bool = False
    answer: Any = None
    calls: list[Call] = field(default_factory=list)
    reply: Reply | None = None
    failure: dict[str, Any] | None = None


@dataclass
class Done:
    """A call of the turn, run (or refused): its record in the step, and whether it ran with
    a person's edit of the arguments."""

    record: dict[str, Any]
    edited: bool = False


class ToolProtocol(ABC):
    """How the loop asks the model for a turn and keeps the conversation (one per run)."""

    # Said after "no final answer within max_steps=N steps".
    limit_note = ""

    def __init__(self, tools: list[str]) -> None:
        self.tools = tools
        self.allowed = set(tools)

    def unknown(self, name: str) -> dict[str, Any]:
        problem = f"unknown tool {name!r}; the tools are: {', '.join(self.tools) or 'none'}"
        return {"kind": "NameError", "message": problem}

    @abstractmethod
    def system_prompt(self, base: str) -> str: ...

    @abstractmethod
    async def ask(self, chat: ChatFn, messages: Messages, index: int) -> Turn: ...

    def step(self, index: int, done: list[Done], elapsed_ms: int, usage: dict[str, int]) -> dict[str, Any]:  # fmt: skip
        """The step of a turn whose calls ran: the first call's tool, args and outcome."""
        first = done[0].record
        return {
            "index": index, "action": first["tool"], "args": first["args"],
            "observation": first["observation"], "error": first["error"],
            "elapsed_ms": elapsed_ms, "usage": usage,
        }  # fmt: skip

    @abstractmethod
    def add_turn(self, messages: Messages, turn: Turn, done: list[Done]) -> None:
        """Continue the conversation with a turn whose calls ran."""

    @staticmethod
    @abstractmethod
    def replay(step: dict[str, Any]) -> Messages:
        """A recorded step as the messages the loop added for it (its final answer too)."""


class JsonActions(ToolProtocol):
    """One JSON action per model turn, under a schema; one corrective retry."""

    def __init__(self, tools: list[str]) -> None:
        super().__init__(tools)
        self.schema = action_schema(tools)

    def system_prompt(self, base: str) -> str:
        listing = "\n".join(_tool_line(n) for n in self.tools) or "(none: answer directly)"
        return (
            f"{base}\n\nTools:\n{listing}\n\n"
            'Reply with exactly one JSON object: {"tool": "<name>", "args": {...}} to call a tool '
            '(args by parameter name), or {"final": "<answer>"} when you have the answer.'
        )

    async def ask(self, chat: ChatFn, messages: Messages, index: int) -> Turn:
        usage: dict[str, int] = {}
        reply = await chat(messages, self.schema)
        add_usage(usage, reply.usage)
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
            reply = await chat(retry, self.schema)
            add_usage(usage, reply.usage)
            try:
                action = parse_action(reply.text)
            except ValueError as second:
                return Turn(usage, failure={
                    "kind": "ProviderError",
                    "message": f"the model did not give a valid action after a corrective retry: {second}",
                })  # fmt: skip
        if "final" in action:
            return Turn(usage, final=True, answer=action["final"], reply=reply)
        name, args = action["tool"], action["args"]
        error = None
        if name not in self.allowed:
            error = self.unknown(name)
        else:
            problem = check_args(name, args)
            if problem is not None:
                error = {"kind": "TypeError", "message": problem}
        return Turn(usage, calls=[Call(call_id(index), name, args, error)], reply=reply)

    def add_turn(self, messages: Messages, turn: Turn, done: list[Done]) -> None:
        record = done[0].record
        action = {"tool": record["tool"], "args": record["args"]}
        messages.append({"role": "assistant", "content": json.dumps(action, ensure_ascii=False)})
        messages.append({"role": "user", "content": f"Observation: {record['observation']}"})

    @staticmethod
    def replay(step: dict[str, Any]) -> Messages:
        if step["action"] == "final":
            action: dict[str, Any] = {"final": step["args"].get("final")}
        else:
            action = {"tool": step["action"], "args": step["args"]}
        out = [{"role": "assistant", "content": json.dumps(action, ensure_ascii=False)}]
        if step["action"] != "final":
            out.append({"role": "user", "content": f"Observation: {step['observation']}"})
        return out


class NativeTools(ToolProtocol):
    """The model API's own tool calls: several per turn, run concurrently."""

    limit_note = " (model turns)"

    def __init__(self, tools: list[str]) -> None:
        super().__init__(tools)
        self.specs = tool_specs(tools)

    def system_prompt(self, base: str) -> str:
        if not self.tools:
            return f"{base}\n\nAnswer directly."
        return (
            f"{base}\n\nCall the tools you need (several at once when they do not depend on "
            "each other); when you have the answer, reply with it as plain text."
        )

    async def ask(self, chat: ChatFn, messages: Messages, index: int) -> Turn:
        reply = await chat(messages, self.specs)
        usage: dict[str, int] = {}
        add_usage(usage, reply.usage)
        if not reply.tool_calls:
            return Turn(usage, final=True, answer=reply.text, reply=reply)
        several = len(reply.tool_calls) > 1
        calls = []
        for k, c in enumerate(reply.tool_calls):
            args, error = self._call_args(c["name"], c.get("arguments") or "")
            calls.append(Call(call_id(index, k if several else None), c["name"], args, error))
        return Turn(usage, calls=calls, reply=reply)

    def _call_args(self, name: str, raw: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """A tool call's arguments, and the error the model is told instead of running it."""
        if name not in self.allowed:
            return {}, self.unknown(name)
        try:
            args = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            return {}, {"kind": "TypeError", "message": f"the arguments of {name} are not JSON: {exc}"}  # fmt: skip
        if not isinstance(args, dict):
            return {}, {"kind": "TypeError", "message": f"the arguments of {name} are not an object"}  # fmt: skip
        wrong = check_args(name, args)
        if wrong is not None:
            return args, {"kind": "TypeError", "message": wrong}
        return args, None

    def step(self, index: int, done: list[Done], elapsed_ms: int, usage: dict[str, int]) -> dict[str, Any]:  # fmt: skip
        """As a JSON-protocol step, with ``calls``: every call of the turn."""
        return {**super().step(index, done, elapsed_ms, usage), "calls": [d.record for d in done]}

    def add_turn(self, messages: Messages, turn: Turn, done: list[Done]) -> None:
        assert turn.reply is not None and turn.reply.tool_calls
        asked = list(zip(turn.calls, turn.reply.tool_calls, done, strict=True))
        messages.append(
            {
                "role": "assistant",
                "content": turn.reply.text or None,
                "tool_calls": [
                    {
                        "id": c.get("id") or call.call_id,
                        "type": "function",
                        "function": {
                            "name": c["name"],
                            # A person's edit: the conversation shows the call as it ran.
                            "arguments": json.dumps(d.record["args"], ensure_ascii=False)
                            if d.edited
                            else c.get("arguments") or "{}",
                        },
                    }
                    for call, c, d in asked
                ],
            }
        )
        for call, c, d in asked:
            messages.append(
                {"role": "tool", "tool_call_id": c.get("id") or call.call_id,
                 "content": d.record["observation"]}
            )  # fmt: skip

    @staticmethod
    def replay(step: dict[str, Any]) -> Messages:
        # Call ids as recorded: the model's own ids are not kept, and any consistent ids
        # pair calls with results.
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


PROTOCOLS: dict[str, type[ToolProtocol]] = {"json": JsonActions, "native": NativeTools}


def _tool_line(name: str) -> str:
    b = lookup(name)
    assert b is not None
    return f"- {b.signature}: {b.description}"
