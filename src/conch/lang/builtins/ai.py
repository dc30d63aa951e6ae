"""AI builtins: ``ai`` (one chat completion) and ``embed`` (embedding vectors), effect ``model``.

Model strings are the inference server's: ``"<provider>:<model>"`` (``ollama:qwen2.5:7b``,
``openai:gpt-4o-mini``, ``local:smollm2-135m-instruct``) or a local model id; the default is
the host's default model (chat) and its default embedding model (embed).

The requests go to the run's host (:mod:`conch.lang.host`), which decides where models are:
in the agent server the inference server's API at ``models_url`` (sandbox workers never load
a model); in the shell a serving layer inside the process (local models and configured
providers), unless ``models_url`` is set explicitly, then that server.
"""

from __future__ import annotations

import json

from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Array, Int, Number, Record, String
from conch.lang.context import current
from conch.lang.errors import ConchError
from conch.lang.host import ModelRequestError, require

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _call(name: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    ctx = current()
    host = require(ctx.host, name, "reach a model")
    try:
        if kind == "chat":
            return dict(host.chat(body, ctx.deadline))
        return dict(host.embed(body, ctx.deadline))
    except ModelRequestError as exc:
        kind_ = "TimeoutError" if exc.status == 504 else (
            "ValueError" if exc.status in (400, 404, 422) else "ProviderError")
        raise ConchError(kind_, f"{name}: {exc.message}") from None


@builtin(
    "ai",
    category="ai",
    effect="model",
    description="One chat completion: the model's answer to `prompt` as a String. With `schema` "
    "(a JSON Schema), the answer is decoded under that schema and returned parsed. `model` is "
    '"<provider>:<model>" or a local model id (default: the server\'s default model).',
    examples=[
        Example('ai("Say hello in one word.", max_tokens=8, temperature=0)', type="String"),
        Example(
            'ai("Give a colour.", schema={type: "object", properties: {colour: {type: "string"}}, '
            'required: ["colour"]}, max_tokens=32, temperature=0) | keys',
            ["colour"],
        ),
    ],
)
def ai(prompt: String, model: String | None = None, system: String | None = None,
       temperature: Number | None = None, max_tokens: Int | None = None,
       schema: Record | None = None) -> Any:
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt})
    body: dict[str, Any] = {"model": model, "messages": messages}
    if temperature is not None:
        body["temperature"] = temperature
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "result", "schema": schema, "strict": True}}
    answer = _call("ai", "chat", body)
    try:
        message = answer["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise ConchError("ProviderError", "ai: the answer has no message") from None
    text = message.get("content") or ""
    if schema is None:
        return text
    try:
        return json.loads(text)
    except ValueError:
        reason = answer["choices"][0].get("finish_reason")
        hint = "raise max_tokens: the answer was cut off" if reason == "length" else None
        raise ConchError("ValueError", f"ai: the answer is not JSON under the schema: {text[:200]!r}",
                         hint=hint) from None


@builtin(
    "embed",
    category="ai",
    effect="model",
    description="The embedding vector of a String (an Array of Float), or of each String of an "
    "Array (an Array of Arrays). `model` as for `ai`; default: the server's embedding model.",
    # A real vector needs an embedding model (`conch models setup` installs the default), which
    # the examples cannot assume; tests/lang/builtins/test_ai.py embeds through a provider.
    examples=[
        Example("embed([])", []),
        Example('try { embed("hello", model="no-such-model") } catch e { e.kind }', "ValueError"),
    ],
)
def embed(text: String | Array, model: String | None = None) -> Array:
    from conch.lang import values

    single = isinstance(text, str)
    items = [text] if single else values.as_list(text)
    if not items:
        return []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise ConchError("TypeError", f"embed: element {i} is {values.type_of(item)}, not String")
    body: dict[str, Any] = {"input": items, "encoding_format": "float"}
    if model is not None:
        body["model"] = model
    answer = _call("embed", "embeddings", body)
    data = sorted(answer.get("data") or [], key=lambda d: d.get("index", 0))
    vectors = [list(d["embedding"]) for d in data]
    if len(vectors) != len(items):
        raise ConchError("ProviderError", f"embed: asked for {len(items)} vectors, got {len(vectors)}")
    return vectors[0] if single else vectors
