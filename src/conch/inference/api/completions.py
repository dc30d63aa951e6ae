"""OpenAI's legacy completions API (``POST /v1/completions``): the request model and the
``text_completion`` objects, chunks and legacy ``logprobs`` built from engine token events.

The prompt is used as-is (no chat template): a string, an array of strings, an array of token
ids or an array of token arrays; each prompt gets ``n`` choices, indexed prompt-major as OpenAI
does (choice ``i * n + j`` is prompt ``i``'s ``j``-th).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from conch.inference.api.dialect import TranslationError
from conch.inference.api.openai import StreamOptions


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    prompt: str | list[str] | list[int] | list[list[int]] = Field(description="Text, texts, token ids or arrays of token ids.")
    suffix: str | None = Field(default=None, description="Fill-in-the-middle: only for models with FIM tokens.")
    max_tokens: int | None = Field(default=16, ge=0, description="Default 16, as OpenAI's; null: up to the context.")
    temperature: float | None = Field(default=None, ge=0, le=2, description="Default 1.0.")
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=16)
    best_of: int | None = Field(default=None, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    keep_alive: float | str | None = None
    # llama.cpp sampling, as llama-server accepts it (the Ollama routes use these).
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    typical_p: float | None = Field(default=None, gt=0, le=1)
    repeat_penalty: float | None = Field(default=None, ge=0)
    repeat_last_n: int | None = Field(default=None, ge=-1)


def check(req: CompletionRequest) -> None:
    """Refusals that need no model (raises :class:`TranslationError` naming the field)."""
    if req.best_of is not None and req.best_of != req.n:
        raise TranslationError("'best_of' other than 'n' is not supported: conch returns every choice it generates", "best_of")
    if req.echo and req.logprobs is not None:
        raise TranslationError("'echo' with 'logprobs' is not supported: conch does not score prompt tokens", "echo")
    if req.echo and req.suffix is not None:
        raise TranslationError("'echo' cannot be combined with 'suffix'", "echo")
    stop = stop_list(req)
    if len(stop) > 4:
        raise TranslationError("At most 4 stop sequences are allowed", "stop")


def stop_list(req: CompletionRequest) -> list[str]:
    return [req.stop] if isinstance(req.stop, str) else list(req.stop or [])


def prompts(req: CompletionRequest) -> list[str | list[int]]:
    raw = req.prompt
    if isinstance(raw, str):
        return [raw]
    if not raw:
        raise TranslationError("'prompt' must not be empty", "prompt")
    if all(isinstance(x, int) for x in raw):
        return [list(raw)]  # type: ignore[arg-type]
    out: list[str | list[int]] = []
    for i, p in enumerate(raw):
        if isinstance(p, str):
            out.append(p)
        elif isinstance(p, list) and p:
            out.append([int(t) for t in p])
        else:
            raise TranslationError(f"'prompt[{i}]' must be a string or a non-empty token array", f"prompt[{i}]")
    return out


def logit_bias(req: CompletionRequest | Any, n_vocab: int) -> dict[int, float]:
    """``{"token id": bias}`` -> ``{id: bias}``, ids and range checked (−100…100)."""
    out: dict[int, float] = {}
    for key, value in (getattr(req, "logit_bias", None) or {}).items():
        try:
            tok = int(key)
        except ValueError:
            raise TranslationError(f"'logit_bias' keys must be token ids; got {key!r}", "logit_bias")
        if not 0 <= tok < n_vocab:
            raise TranslationError(f"'logit_bias' token {tok} is outside the vocabulary (0..{n_vocab - 1})", "logit_bias")
        if not -100 <= value <= 100:
            raise TranslationError(f"'logit_bias' values must be between -100 and 100; got {value}", "logit_bias")
        out[tok] = float(value)
    return out


# -- objects ----------------------------------------------------------------------------------
def new_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def legacy_logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    """Chat-shaped logprob entries (``{token, logprob, bytes, top_logprobs}``) in the legacy
    shape ``{tokens, token_logprobs, top_logprobs, text_offset}``; ``offset`` is where the
    first token's text starts in the choice's text."""
    tokens, values, tops, offsets = [], [], [], []
    for e in entries:
        tokens.append(e["token"])
        values.append(e["logprob"])
        tops.append({t["token"]: t["logprob"] for t in e.get("top_logprobs") or []})
        offsets.append(offset)
        offset += len(e["token"])
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def choice(index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}


def completion(cid: str, model: str, choices: list[dict[str, Any]], usage: dict[str, int],
               created: int | None = None) -> dict[str, Any]:
    return {"id": cid, "object": "text_completion", "created": created or int(time.time()), "model": model,
            "choices": choices, "usage": usage, "system_fingerprint": None}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
