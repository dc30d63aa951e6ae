"""The engine seam: what the server needs from a model runtime, and nothing more.

An engine owns one loaded model. :class:`Engine` is a ``typing.Protocol`` that every runtime
implements in full (llama.cpp in ``engines/llama``, onnxruntime in ``engines/onnx.py``; the
remote providers plug in here next). A runtime without a capability still answers the
method and raises :class:`Unsupported`, so callers check ``capabilities`` rather than
the engine's class.

``generate`` is the low-level, engine-neutral generation entry point: a prompt (text or
token ids) and :class:`SamplingParams` in, a :class:`Generation` of :class:`TokenEvent` out.
Chat is built on it (``engines/chat.py``), as the legacy ``/v1/completions`` is. A chat reaches
an engine as a :class:`ChatSpec` (messages, sampling, tools as :class:`ToolSpec`), which each
engine renders with its own template (:meth:`Engine.chat_prompt`).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from conch import errors


class EngineError(errors.DomainError, code="inference_error"):
    """A runtime failure inside the engine (the request was fine): a 500 whose message says
    that inference failed. The classes below say what else went wrong, each on the base of
    :mod:`conch.errors` that names its status; ``where`` is the request field at fault."""

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        if self.status >= 500:
            self.message = f"Inference failed: {message}"

    @property
    def param(self) -> str | None:
        """``where`` as the OpenAI envelope names it."""
        return self.where


class Unsupported(EngineError, errors.Invalid, code="unsupported_model"):
    """The model cannot do what was asked (an embedding-only model asked to chat)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, where="model")


class ContextLengthExceeded(EngineError, errors.Invalid, code="context_length_exceeded"):
    """A prompt longer than the model's context. Engines blame the chat's ``messages``; the
    serving layer names the field of its own API (:meth:`blame`)."""

    def __init__(self, n_prompt: int, n_ctx: int) -> None:
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx
        super().__init__(self._text("prompt"), where="messages")

    def blame(self, field: str) -> None:
        """Name ``field`` (``input``, ``prompt``) as the request's prompt."""
        self.where = field
        self.message = self._text("prompt" if field == "messages" else field)

    def _text(self, noun: str) -> str:
        return f"This model's maximum context length is {self.n_ctx} tokens, but the {noun} has {self.n_prompt} tokens."


class QueueFull(EngineError, errors.LimitExceeded, code="queue_full"):
    def __init__(self, limit: int) -> None:
        super().__init__(f"The server is busy: {limit} requests are already queued for this model.", retry_after=1)
        self.limit = limit


class RuntimeMissing(EngineError, errors.NotImplementedHere, code="runtime_not_installed"):
    """The model's runtime (an optional extra) is not installed."""

    def __init__(self, message: str) -> None:
        super().__init__(message, where="model")


class ChatInputError(EngineError, errors.Invalid, code="invalid_request_error"):
    """A chat the engine cannot honour, with the request field at fault (``messages[0].content``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, where=param)


@dataclass
class EngineStats:
    """What an engine counts itself: tokens sampled, cancelled streams included (the server's
    ``generated_tokens``; the serving layer counts what reached a client). Written by the
    engine's worker thread only (the prompt cache's saves: by its writer thread)."""

    completion_tokens: int = 0
    # Prompt tokens decoded, counted at each step (a long prompt moves it while it is read;
    # prefixes reused from the KV cache are not decoded and not counted).
    prefill_tokens: int = 0
    # The prompt cache on disk (llama.cpp engine): prefix tokens loaded instead of prefilled,
    # and tokens written (docs/inference.md, "Prompt cache across restarts").
    prompt_cache_restored_tokens: int = 0
    prompt_cache_saved_tokens: int = 0
    # Speculative decoding: tokens drafted into steps, and those of them that were kept.
    draft_tokens: int = 0
    draft_accepted_tokens: int = 0


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
    # GBNF grammar constraining the output (root rule ``root``); engines without grammar
    # support raise ``Unsupported`` rather than ignore it.
    grammar: str | None = None
    # When set, the grammar only applies once the output matches one of these regexes
    # (tool calls inside free text).
    grammar_triggers: Sequence[str] = ()
    # Added to the logits of these token ids before sampling (-100 bans, +100 forces).
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    # None: no log-probabilities; k >= 0: each sampled token's, with the k most likely.
    logprobs: int | None = None
    # llama.cpp sampling beyond OpenAI's fields (llama-server and Ollama expose these).
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    min_p: float = 0.0
    typical_p: float = 1.0


@dataclass
class TokenLogprob:
    """A sampled token's log-probability under the model (log-softmax of its raw logits), with
    the ``top`` most likely alternatives as ``(token id, bytes, logprob)``."""

    token: int
    piece: bytes
    logprob: float
    top: list[tuple[int, bytes, float]]


@dataclass
class TokenEvent:
    """One step of a generation: the new text (possibly empty) and, at the end, why it ended."""

    text: str
    n_tokens: int
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"
    error: str | None = None
    # The tokens sampled since the previous event, when ``SamplingParams.logprobs`` asked.
    logprobs: list[TokenLogprob] | None = None
    # On ``finish_reason == "stop"``: the stop string that matched (None for end of generation).
    stop_sequence: str | None = None


class Generation(abc.ABC):
    """A running generation. Iterate it for events; ``cancel`` stops it within one token."""

    prompt_tokens: int

    @property
    def generated(self) -> int:
        """Tokens sampled so far, whether or not their text went out yet (what a request
        that ends early is billed for)."""
        return 0

    @property
    def finished(self) -> bool:
        """Whether its last event (with its finish reason) was read: :attr:`generated` is
        then final."""
        return True

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[TokenEvent]: ...

    @abc.abstractmethod
    def cancel(self) -> None: ...


@dataclass
class ToolSpec:
    """A function the model may call: its name, description and JSON Schema of arguments."""

    name: str
    description: str | None
    parameters: dict[str, Any]


# Where an image stands in a rendered chat prompt: llama.cpp's default media marker (libmtmd).
MEDIA_MARKER = "<__media__>"


@dataclass
class ImageInput:
    """An image of a chat: its bytes (any format llama.cpp reads) and the request field it came
    from (named in errors). Messages hold ``{"type": "image"}`` parts in its place, in order."""

    data: bytes
    where: str


@dataclass
class ChatSpec:
    """The engine-neutral chat a request asks for (``serving/chat.py`` builds it)."""

    messages: list[dict[str, Any]]
    sampling: SamplingParams
    n: int = 1
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: str | None = None  # "none" | "auto" | "required" | "function"
    named_tool: str | None = None
    response_format: dict[str, Any] | None = None
    # The images of the messages' ``{"type": "image"}`` parts, in order (a vision model's).
    images: list[ImageInput] = field(default_factory=list)

    @property
    def tools_active(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


@dataclass
class ChatPrompt:
    """A chat rendered for one engine: prompt tokens and the sampling (constraints included)."""

    tokens: list[int]
    sampling: SamplingParams
    # A prompt with images: the engine's own record of them (llama.cpp: vision.MediaPrompt),
    # passed back to ``generate``; ``tokens`` then counts each image's tokens.
    media: Any = None


class Engine(Protocol):
    model_id: str
    n_ctx: int
    stats: EngineStats

    @property
    def capabilities(self) -> frozenset[str]:
        """What this loaded model can serve: ``"chat"``, ``"embeddings"``."""

    # -- lifecycle and load ---------------------------------------------------------------
    def unload(self) -> None: ...

    @property
    def busy(self) -> bool: ...

    @property
    def active_sequences(self) -> int: ...

    @property
    def queued(self) -> int: ...

    # -- generation -------------------------------------------------------------------------
    def chat_prompt(self, spec: ChatSpec) -> ChatPrompt:
        """The model's chat template and the spec's constraints applied (raises ``ChatInputError``)."""

    def generate(self, prompt: str | list[int], params: SamplingParams, *, media: Any = None) -> Generation:
        """Start generating; raises ``ContextLengthExceeded`` or ``QueueFull`` before starting.
        ``media``: a :class:`ChatPrompt`'s, when its prompt has images."""

    def text_prompt(self, text: str) -> list[int]:
        """Tokens of a raw text prompt, as a legacy completion feeds it (no chat template)."""

    def detokenize(self, tokens: list[int]) -> str:
        """Text of token ids (a token-array prompt echoed back)."""

    def fim_prompt(self, prefix: str, suffix: str) -> list[int]:
        """A fill-in-the-middle prompt; raises ``Unsupported`` for a model without FIM tokens."""

    # -- embeddings -------------------------------------------------------------------------
    @property
    def n_embd(self) -> int: ...

    @property
    def n_vocab(self) -> int: ...

    def tokenize(self, text: str) -> list[int]:
        """Token ids of an embedding input, as the model is fed them."""

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """Pooled, L2-normalised embeddings of already tokenized inputs (blocking)."""
