"""Embeddings on llama.cpp: a second context (mean pooling, set explicitly) created on first use.

Inputs are packed into one decode, a sequence id each, as many as fit; the pooled vector of
each sequence is L2-normalised. Decoders are fed in micro-batches smaller than an input, which
keeps the compute buffers (and RSS) small; encoders (BERT family) need a whole input in one.
"""

from __future__ import annotations

import threading
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import numpy as np

from conch.inference.engines.base import ContextLengthExceeded, EngineError
from conch.inference.engines.llama.backend import init_backend, open_context, release_openmp_threads

EMBED_SEQS = 32
# Tokens packed into one embedding decode (a longer input goes alone). llama.cpp keeps a logits
# row per token even when only embeddings are read, so this bounds that buffer's resident size.
EMBED_BATCH_TOKENS = 256


@dataclass(eq=False)
class Embedder:
    """Embeddings of one loaded model, on a context of their own opened on first use."""

    model: Any
    _: KW_ONLY
    n_ctx: int
    n_embd: int
    n_threads: int
    n_threads_batch: int
    bidirectional: bool
    encoder_only: bool
    _ctx: Any = field(default=None, init=False, repr=False)
    _batch: Any = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def _context(self) -> Any:
        if self._ctx is None:
            llama_cpp = init_backend()
            self._ctx = open_context(
                self.model,
                n_ctx=self.n_ctx,
                n_batch=self.n_ctx,
                n_ubatch=self.n_ctx if self.bidirectional else min(self.n_ctx, 512),
                n_seq_max=EMBED_SEQS,
                kv_unified=True,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads_batch,
                embeddings=True,
                pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                no_perf=True,
            )
            self._batch = llama_cpp.llama_batch_init(self.n_ctx, 0, 1)
        return self._ctx

    def close(self) -> None:
        with self._lock:
            if self._batch is not None:
                init_backend().llama_batch_free(self._batch)
                self._batch = None
            if self._ctx is not None:
                self._ctx.close()
                self._ctx = None

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        try:
            return self._embed(inputs)
        finally:
            # Embeddings run on whichever thread asked; it must not keep a second OpenMP pool
            # beside the decode worker's (backend.release_openmp_threads says why).
            release_openmp_threads()

    def _embed(self, inputs: list[list[int]]) -> list[list[float]]:
        llama_cpp = init_backend()
        for toks in inputs:
            if len(toks) > self.n_ctx:
                raise ContextLengthExceeded(len(toks), self.n_ctx)
        out: list[list[float]] = [[] for _ in inputs]
        with self._lock:
            ectx = self._context()
            batch = self._batch
            i = 0
            while i < len(inputs):
                # Pack as many inputs as fit into one decode: one sequence id each.
                group: list[int] = []
                n = 0
                while i < len(inputs) and len(group) < EMBED_SEQS and (
                    not group or n + max(1, len(inputs[i])) <= EMBED_BATCH_TOKENS
                ):
                    toks = inputs[i] or [self.model.token_bos()]
                    seq = len(group)
                    for p, t in enumerate(toks):
                        batch.token[n] = t
                        batch.pos[n] = p
                        batch.n_seq_id[n] = 1
                        batch.seq_id[n][0] = seq
                        batch.logits[n] = 1
                        n += 1
                    group.append(i)
                    i += 1
                batch.n_tokens = n
                if ectx.memory is not None:
                    llama_cpp.llama_memory_clear(ectx.memory, False)
                if self.encoder_only:
                    rc = llama_cpp.llama_encode(ectx.ctx, batch)
                else:
                    rc = llama_cpp.llama_decode(ectx.ctx, batch)
                if rc != 0:
                    raise EngineError(f"llama.cpp failed to embed the input (status {rc})")
                for seq, idx in enumerate(group):
                    ptr = llama_cpp.llama_get_embeddings_seq(ectx.ctx, seq)
                    if not ptr:
                        raise EngineError("llama.cpp returned no pooled embedding")
                    vec = np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).astype(np.float64)
                    norm = float(np.linalg.norm(vec)) or 1.0
                    out[idx] = (vec / norm).tolist()
        return out
