"""The engine interface: what the server needs from a model runtime.

An engine owns one loaded model. ``stream`` is the primitive: it yields text deltas as the
runtime produces them; ``chat`` is ``stream`` collected. Formatting messages with the model's
chat template is the engine's job too, because the template lives with the model file.
The llama.cpp engine (``llama_engine``) implements all of it; ONNX embedding models are served
by ``onnx_engine.OnnxEmbeddingEngine``, which has only the embedding half (no chat template,
no ``stream``).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any


class EngineError(Exception):
    """A runtime failure inside the engine (the request was fine)."""


class ContextLengthExceeded(EngineError):
    def __init__(self, n_prompt: int, n_ctx: int) -> None:
        super().__init__(
            f"This model's maximum context length is {n_ctx} tokens, "
            f"but the prompt has {n_prompt} tokens."
        )
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx


class QueueFull(EngineError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"The server is busy: {limit} requests are already queued for this model.")
        self.limit = limit


@dataclass
class EngineStats:
    """Counters the server exports as metrics (written by the engine's worker thread only)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    decode_time_s: float = 0.0


@dataclass
class SamplingParams:
    max_tokens: int | None = None
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: Sequence[str] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # GBNF grammar constraining the output (root rule ``root``).
    grammar: str | None = None
    # When set, the grammar only applies once the output matches one of these regexes
    # (tool calls inside free text).
    grammar_triggers: Sequence[str] = ()


@dataclass
class TokenEvent:
    """One step of a generation: the new text (possibly empty) and, at the end, why it ended."""

    text: str
    n_tokens: int
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"
    error: str | None = None


@dataclass
class Completion:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)


class Generation(abc.ABC):
    """A running generation. Iterate it for events; ``cancel`` stops it within one token."""

    prompt_tokens: int

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[TokenEvent]: ...

    @abc.abstractmethod
    def cancel(self) -> None: ...


class Engine(abc.ABC):
    model_id: str
    n_ctx: int

    @abc.abstractmethod
    def load(self) -> None: ...

    @abc.abstractmethod
    def unload(self) -> None: ...

    @abc.abstractmethod
    def tokenize(self, text: str, *, special: bool = False) -> list[int]: ...

    @abc.abstractmethod
    def format_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str: ...

    @abc.abstractmethod
    def stream(self, prompt: str | list[int], params: SamplingParams) -> Generation:
        """Start generating; raises ``ContextLengthExceeded`` or ``QueueFull`` before starting."""

    async def chat(self, prompt: str | list[int], params: SamplingParams) -> Completion:
        gen = self.stream(prompt, params)
        parts: list[str] = []
        n = 0
        reason = "stop"
        try:
            async for ev in gen:
                parts.append(ev.text)
                n = ev.n_tokens
                if ev.finish_reason is not None:
                    if ev.finish_reason == "error":
                        raise EngineError(ev.error or "generation failed")
                    reason = ev.finish_reason
        finally:
            gen.cancel()
        return Completion("".join(parts), reason, gen.prompt_tokens, n)

    @abc.abstractmethod
    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """Mean-pooled, L2-normalised embeddings of already tokenized inputs (blocking)."""

    @property
    @abc.abstractmethod
    def active_sequences(self) -> int: ...

    @property
    @abc.abstractmethod
    def queued(self) -> int: ...
