"""Chat completion as domain logic: messages to prompt, constraints to grammars, text to tool calls.

Nothing here knows about HTTP. The web layer turns a validated request into
:class:`ChatSpec` and the :class:`ChatEvent` stream back into OpenAI objects.

Tool calls use the ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` convention
(Hermes/Qwen style, which SmolLM2 was tuned on). With ``tool_choice`` "required" or a named
function the whole output is grammar-constrained to one call; with "auto" the grammar is
lazy: text is free until the model opens ``<tool_call>``, and from there it must be a valid
call, so a started call always parses.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from conch.inference.engine import EngineError, Generation, SamplingParams
from conch.inference.llama_engine import LlamaEngine

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"


class ChatInputError(ValueError):
    """A request the engine cannot honour, with the request field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class ToolSpec:
    name: str
    description: str | None
    parameters: dict[str, Any]


@dataclass
class ChatSpec:
    messages: list[dict[str, Any]]
    sampling: SamplingParams
    n: int = 1
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: str | None = None  # "none" | "auto" | "required" | a function name
    named_tool: str | None = None
    response_format: dict[str, Any] | None = None


@dataclass
class ChatEvent:
    kind: str  # "delta" | "tool_calls" | "finish"
    index: int
    text: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    completion_tokens: int = 0


# -- messages ------------------------------------------------------------------------------
def content_text(content: Any, param: str) -> str:
    """A message ``content``: a string, an array of text parts, or null."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for i, part in enumerate(content):
        ptype = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
        if ptype != "text" or not isinstance(text, str):
            raise ChatInputError(
                f"Only text content parts are supported; got type {ptype!r}", f"{param}[{i}].type"
            )
        parts.append(text)
    return "".join(parts)


def render_messages(messages: list[dict[str, Any]], tools: list[ToolSpec], inject_tools: bool) -> list[dict[str, Any]]:
    """Plain role/content messages for the chat template (tool traffic rendered as text)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role = m["role"]
        text = content_text(m.get("content"), f"messages[{i}].content")
        if role == "developer":
            role = "system"
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c["function"]
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except json.JSONDecodeError:
                    args = fn.get("arguments")
                calls.append(f"{TOOL_OPEN}{json.dumps({'name': fn['name'], 'arguments': args})}{TOOL_CLOSE}")
            text = (text + "\n" if text else "") + "\n".join(calls)
        if role == "tool":
            # ChatML templates rarely know the tool role; a tagged user turn keeps the meaning.
            role = "user"
            text = f"<tool_response>\n{text}\n</tool_response>"
        out.append({"role": role, "content": text})
    if tools and inject_tools:
        listing = "\n".join(
            json.dumps({"type": "function", "function": {"name": t.name, "description": t.description or "", "parameters": t.parameters}})
            for t in tools
        )
        instructions = (
            "You can call functions. The available tools are:\n<tools>\n"
            f"{listing}\n</tools>\n"
            "To call a function, reply with "
            f'{TOOL_OPEN}{{"name": <function-name>, "arguments": <arguments-object>}}{TOOL_CLOSE}'
        )
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + instructions}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out


# -- grammars ------------------------------------------------------------------------------
def schema_grammar(schema: dict[str, Any], param: str, prop_order: Sequence[str] = ()) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return json_schema_to_gbnf(json.dumps(schema), list(prop_order))
    except Exception as exc:
        raise ChatInputError(f"Unsupported JSON schema: {exc}", param)


def _tool_call_schema(tools: list[ToolSpec]) -> dict[str, Any]:
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.name},
                "arguments": t.parameters or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def _wrap_tool_grammar(inner: str) -> str:
    """Rename the object grammar's root and wrap it in the tool-call tags."""
    renamed = inner.replace("root ::=", "call ::=", 1)
    return f'root ::= "{TOOL_OPEN}" call "{TOOL_CLOSE}"\n{renamed}'


def plan_constraints(spec: ChatSpec) -> None:
    """Set the grammar (and trigger) on ``spec.sampling`` from response_format and tools."""
    if spec.tools and spec.tool_choice != "none":
        selected = spec.tools
        if spec.named_tool is not None:
            selected = [t for t in spec.tools if t.name == spec.named_tool]
            if not selected:
                raise ChatInputError(f"tool_choice names an unknown function '{spec.named_tool}'", "tool_choice")
        inner = schema_grammar(_tool_call_schema(selected), "tools", ("name", "arguments"))
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


def parse_tool_calls(text: str, tools: list[ToolSpec]) -> tuple[str, list[dict[str, Any]]]:
    """Split generated text into leading content and OpenAI-shaped tool calls."""
    names = {t.name for t in tools}
    calls: list[dict[str, Any]] = []
    start = text.find(TOOL_OPEN)
    if start < 0:
        return text, calls
    content = text[:start].strip()
    rest = text[start:]
    decoder = json.JSONDecoder()
    while rest.startswith(TOOL_OPEN):
        body = rest[len(TOOL_OPEN) :].lstrip()
        try:
            obj, end = decoder.raw_decode(body)
        except json.JSONDecodeError:
            break
        if isinstance(obj, dict) and obj.get("name") in names:
            args = obj.get("arguments", {})
            calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": obj["name"], "arguments": json.dumps(args)},
                }
            )
        rest = body[end:].lstrip()
        if rest.startswith(TOOL_CLOSE):
            rest = rest[len(TOOL_CLOSE) :].lstrip()
    if not calls:
        return text, calls
    return content, calls


# -- running ---------------------------------------------------------------------------------
def build_prompt(engine: LlamaEngine, spec: ChatSpec) -> list[int]:
    if spec.sampling.grammar and not engine.check_grammar(spec.sampling.grammar):
        param = "tools" if spec.tools and spec.tool_choice != "none" else "response_format"
        raise ChatInputError("The schema could not be turned into a grammar llama.cpp accepts", param)
    tools_active = bool(spec.tools) and spec.tool_choice != "none"
    messages = render_messages(spec.messages, spec.tools if tools_active else [], inject_tools=True)
    try:
        prompt = engine.format_chat(messages)
    except EngineError as exc:
        raise ChatInputError(str(exc), "messages")
    return engine.prompt_tokens(prompt)


def start_chat(engine: LlamaEngine, spec: ChatSpec, prompt: list[int]) -> AsyncIterator[ChatEvent]:
    """Start ``spec.n`` generations now; return their events interleaved as they come.

    Raises ``ContextLengthExceeded``/``QueueFull`` here, before any output exists, so the
    caller can still answer with an error status.
    """
    gens = []
    try:
        for i in range(spec.n):
            sampling = spec.sampling
            if spec.n > 1 and sampling.seed is not None:
                # One seed for every choice would make them identical; offset it per choice.
                sampling = replace(sampling, seed=sampling.seed + i)
            gens.append(engine.stream(prompt, sampling))
    except Exception:
        for g in gens:
            g.cancel()
        raise
    return _events(spec, gens)


async def _events(spec: ChatSpec, gens: list[Generation]) -> AsyncIterator[ChatEvent]:
    tools_active = bool(spec.tools) and spec.tool_choice != "none"
    forced = tools_active and spec.tool_choice != "auto"
    queue: asyncio.Queue[ChatEvent | None] = asyncio.Queue()

    async def pump(index: int) -> None:
        text = ""
        streamed = 0
        try:
            async for ev in gens[index]:
                text += ev.text
                if ev.finish_reason is not None:
                    if ev.finish_reason == "error":
                        raise EngineError(ev.error or "generation failed")
                    reason = ev.finish_reason
                    if tools_active:
                        content, calls = parse_tool_calls(text, spec.tools)
                        if calls:
                            if not forced and len(content) > streamed:
                                await queue.put(ChatEvent("delta", index, content[streamed:]))
                            await queue.put(ChatEvent("tool_calls", index, tool_calls=calls))
                            reason = "tool_calls"
                        elif len(text) > streamed:
                            await queue.put(ChatEvent("delta", index, text[streamed:]))
                    elif ev.text:
                        await queue.put(ChatEvent("delta", index, ev.text))
                    await queue.put(ChatEvent("finish", index, finish_reason=reason, completion_tokens=ev.n_tokens))
                    return
                if not tools_active:
                    if ev.text:
                        await queue.put(ChatEvent("delta", index, ev.text))
                elif not forced:
                    # Stream free text, but hold anything that may be the start of a tool call.
                    cut = text.find(TOOL_OPEN)
                    if cut < 0:
                        cut = len(text)
                        for k in range(min(len(TOOL_OPEN) - 1, len(text)), 0, -1):
                            if text.endswith(TOOL_OPEN[:k]):
                                cut = len(text) - k
                                break
                    if cut > streamed:
                        await queue.put(ChatEvent("delta", index, text[streamed:cut]))
                        streamed = cut
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(i)) for i in range(spec.n)]
    done = 0
    try:
        while done < len(tasks):
            item = await queue.get()
            if item is None:
                done += 1
                continue
            yield item
        for t in tasks:
            if t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    finally:
        for g in gens:
            g.cancel()
        for t in tasks:
            if not t.done():
                t.cancel()
