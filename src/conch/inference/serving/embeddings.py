"""Embeddings as a service: an OpenAI embeddings request in, an OpenAI ``list`` object out."""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

from conch.inference.api.openai import EmbeddingRequest
from conch.inference.engines.base import Engine
from conch.inference.models.acquire import default_embedding_record
from conch.inference.models.store import ModelRecord
from conch.inference.serving.base import (
    Meter,
    Serving,
    estimate_tokens,
    request_body,
    usage_tokens,
)
from conch.inference.serving.errors import InvalidRequest


class EmbeddingServing(Serving):
    prompt_field = "input"

    async def create(self, req: EmbeddingRequest, meter: Meter | None = None) -> dict[str, Any]:
        """An OpenAI embeddings ``list`` object; without ``model``, the default embedding model
        answers. ``meter``: the request's token budget (:class:`~.base.Meter`): the inputs'
        tokens, reserved once tokenized and settled once embedded."""
        remote = self.remote(req.model)
        if remote is not None:
            provider, name = remote
            body = request_body(req)
            if meter is None:
                return await provider.embed(name, body)
            estimate = estimate_tokens(body.get("input"))
            await meter.reserve(str(req.model), estimate, 0)
            used = 0
            try:
                out = await provider.embed(name, body)
                used = usage_tokens(out) or estimate
                return out
            finally:
                await meter.settle(used)
        record = await self._record(req.model)
        items = _inputs(req.input)
        async with self.lease(record, req.keep_alive) as engine:
            token_lists = _tokenize(engine, items)
            if req.dimensions is not None and req.dimensions > engine.n_embd:
                raise InvalidRequest(
                    f"'dimensions' must be at most {engine.n_embd} for this model", where="dimensions"
                )
            n_tokens = sum(len(t) for t in token_lists)
            if meter is not None:
                await meter.reserve(req.model or record.id, n_tokens, 0)
            try:
                # On the model's account: a chat model opens its embedding context on first use.
                vectors = await self.manager.run(record.id, engine.embed, token_lists)
            except BaseException:
                if meter is not None:
                    await meter.settle(0)
                raise
            if meter is not None:
                await meter.settle(n_tokens)
        data = []
        for i, vec in enumerate(vectors):
            if req.dimensions is not None:
                # Matryoshka-style shortening: keep the first dimensions, then re-normalise.
                vec = vec[: req.dimensions]
                norm = sum(v * v for v in vec) ** 0.5 or 1.0
                vec = [v / norm for v in vec]
            emb: list[float] | str = vec
            if req.encoding_format == "base64":
                emb = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode("ascii")
            data.append({"object": "embedding", "index": i, "embedding": emb})
        self.metrics.prompt_tokens += n_tokens
        self.metrics.embedded_inputs += len(items)
        return {
            "object": "list",
            "data": data,
            "model": req.model or record.id,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }

    async def _record(self, model: str | None) -> ModelRecord:
        if model is not None:
            return self.resolver.local_record(model, "embeddings")
        default = await asyncio.to_thread(default_embedding_record, self.manager.store)
        if default is None:
            raise InvalidRequest(
                "'model' is required: no default embedding model is installed "
                "(`conch models setup` installs all-minilm-l6-v2)",
                where="model",
                code="missing_required_parameter",
            )
        return default


def _inputs(raw: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(raw, str):
        items: list[str | list[int]] = [raw]
    elif raw and all(isinstance(x, int) for x in raw):
        items = [list(raw)]  # type: ignore[arg-type]
    else:
        items = list(raw)  # type: ignore[arg-type]
    if not items:
        raise InvalidRequest("'input' must not be empty", where="input")
    return items


def _tokenize(engine: Engine, items: list[str | list[int]]) -> list[list[int]]:
    token_lists: list[list[int]] = []
    n_vocab = engine.n_vocab
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not item:
                raise InvalidRequest(f"'input[{i}]' must not be an empty string", where="input")
            token_lists.append(engine.tokenize(item))
        else:
            if not item or any(t < 0 or t >= n_vocab for t in item):
                raise InvalidRequest(
                    f"'input[{i}]' must be a non-empty array of token ids below {n_vocab}", where="input"
                )
            token_lists.append(list(item))
    return token_lists
