"""Speculative drafts from a second, smaller model (``draft_model`` in ``[model_overrides.ID]``).

The draft model has its own llama.cpp context with the target's shape (the same KV cells,
sequences, micro-batch and threads), and each of the target's sequences keeps the same sequence
id in it. :class:`DraftModel` records which tokens each draft sequence holds; before drafting,
a sequence is brought in line with the tokens the target accepted (cells past the common
prefix removed, the missing tokens decoded, a prompt chunk by chunk one step behind the
target's prefill), and then the draft model decodes greedily, one token per drafting sequence
per round, all drafting sequences in one batch.

Its greedy tokens go through the scheduler's verification unchanged: a drafted token is kept
only when it is the token the request's own sampler draws from the target's logits, which for
a draft that puts all its mass on one token is standard speculative sampling (speculative.py):
greedy and seeded outputs are the same as without drafting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from conch.inference.engines.base import EngineError
from conch.inference.engines.llama.backend import fast_calls, init_backend

log = logging.getLogger(__name__)

# Token ids whose texts are compared between target and draft (besides BOS, EOS and the last).
_VOCAB_PROBES = 64


def check_same_vocab(target: Any, draft: Any, *, name: str) -> None:
    """Raise :class:`EngineError` unless ``draft`` tokenizes as ``target`` does: the same
    tokenizer model, vocabulary size, BOS/EOS and token texts at ids spread over the vocabulary."""

    def describe(what: str) -> EngineError:
        return EngineError(f"draft_model {name!r} cannot draft for this model: its vocabulary differs ({what}); "
                           "a draft model must share the target's tokenizer (e.g. a smaller model of the same family)")

    n = int(target.n_vocab())
    if int(draft.n_vocab()) != n:
        raise describe(f"{draft.n_vocab()} tokens, not {n}")
    kind_t = target.metadata().get("tokenizer.ggml.model")
    kind_d = draft.metadata().get("tokenizer.ggml.model")
    if kind_t != kind_d:
        raise describe(f"tokenizer {kind_d!r}, not {kind_t!r}")
    if (int(target.token_bos()), int(target.token_eos())) != (int(draft.token_bos()), int(draft.token_eos())):
        raise describe("other BOS/EOS tokens")
    ids = sorted({*range(0, n, max(1, n // _VOCAB_PROBES)), n - 1})
    for i in ids:
        if _text(target, i) != _text(draft, i):
            raise describe(f"token {i} is {_text(draft, i)!r}, not {_text(target, i)!r}")


def _text(model: Any, token: int) -> bytes:
    try:
        return str(model.token_get_text(token)).encode("utf-8", "surrogateescape")
    except UnicodeDecodeError:
        return b"?"


@dataclass
class DraftRequest:
    """One sequence to bring in line with ``tokens`` and, with ``limit`` > 0, to draft for."""

    seq: int
    tokens: Sequence[int]  # what the target accepted (the sequence's last token included)
    limit: int = 0  # tokens to draft after ``tokens``; 0: only catch up


class DraftModel:
    """The draft model's context and per-sequence token record; used by the scheduler's thread."""

    def __init__(self, model: Any, ctx: Any, *, name: str, n_batch: int, is_eog: Callable[[int], bool]) -> None:
        self.model = model
        self.ctx = ctx
        self.name = name
        self.n_batch = n_batch
        self._is_eog = is_eog
        self._cells: dict[int, list[int]] = {}  # sequence -> tokens its draft KV holds, from position 0
        self._batch: Any = None
        self._greedy: Any = None

    def start(self) -> None:
        llama_cpp = init_backend()
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._greedy = llama_cpp.llama_sampler_init_greedy()

    def close(self) -> None:
        llama_cpp = init_backend()
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._greedy is not None:
            llama_cpp.llama_sampler_free(self._greedy)
            self._greedy = None
        self._cells.clear()

    # -- the record of each sequence's cells ------------------------------------------------
    def held(self, seq: int) -> list[int]:
        return self._cells.get(seq, [])

    def forget(self, seq: int) -> None:
        """Empty the sequence (its request finished, was preempted or cancelled)."""
        if self._cells.get(seq):
            init_backend().llama_memory_seq_rm(self.ctx.memory, seq, -1, -1)
        self._cells[seq] = []

    def trim(self, seq: int, n: int) -> None:
        """Keep the sequence's first ``n`` cells (a verification kept that many of its tokens)."""
        cells = self._cells.get(seq, [])
        if len(cells) > n:
            init_backend().llama_memory_seq_rm(self.ctx.memory, seq, n, -1)
            del cells[n:]

    def _rollback(self, seq: int, tokens: Sequence[int], keep_max: int) -> int:
        """Cut the sequence back to its common prefix with ``tokens`` (at most ``keep_max``)."""
        cells = self._cells.setdefault(seq, [])
        n = min(len(cells), len(tokens), keep_max)
        p = 0
        while p < n and cells[p] == tokens[p]:
            p += 1
        if p < len(cells):
            if not init_backend().llama_memory_seq_rm(self.ctx.memory, seq, p, -1):
                init_backend().llama_memory_seq_rm(self.ctx.memory, seq, -1, -1)
                p = 0
            del cells[p:]
        return p

    # -- one step's drafting -------------------------------------------------------------------
    def run(self, requests: list[DraftRequest], budget: int) -> dict[int, list[int]]:
        """Sync every request's sequence (drafting ones first, then others with at most
        ``budget`` catch-up tokens) and draft for those with a limit; sequence -> drafted tokens.

        A drafting sequence whose catch-up does not fit this step's batch drafts nothing this
        time and catches up by ``n_batch`` tokens per step. On a failed decode the draft
        context is emptied and nothing is drafted (the target goes on without drafts)."""
        fast = fast_calls()
        batch, ctx = self._batch, self.ctx.ctx
        n = 0
        logits_at: dict[int, int] = {}  # drafting sequence -> its row in the first batch
        room = self.n_batch
        for req in sorted(requests, key=lambda r: r.limit <= 0):
            drafting = req.limit > 0
            # A drafting sequence decodes at least its last token again: its logits give the draft.
            p = self._rollback(req.seq, req.tokens, len(req.tokens) - 1 if drafting else len(req.tokens))
            missing = len(req.tokens) - p
            if drafting and missing > room:
                drafting = False
            take = min(missing, room if drafting else min(room, budget))
            if take <= 0:
                continue
            if not drafting:
                budget -= take
            room -= take
            cells = self._cells[req.seq]
            for k in range(take):
                tok = req.tokens[p + k]
                batch.token[n] = tok
                batch.pos[n] = p + k
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = req.seq
                batch.logits[n] = 0
                cells.append(tok)
                n += 1
            if drafting:
                batch.logits[n - 1] = 1
                logits_at[req.seq] = n - 1
        if n == 0:
            return {}
        if not self._decode(n):
            return {}
        drafts: dict[int, list[int]] = {}
        limits = {r.seq: r.limit for r in requests}
        for seq, idx in logits_at.items():
            drafts[seq] = [int(fast.llama_sampler_sample(self._greedy, ctx, idx))]
        # Then one token per still-drafting sequence and round, all in one batch.
        while True:
            going = [s for s, d in drafts.items() if len(d) < limits[s] and not self._is_eog(d[-1])]
            if not going:
                break
            for n, seq in enumerate(going):
                cells = self._cells[seq]
                batch.token[n] = drafts[seq][-1]
                batch.pos[n] = len(cells)
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = seq
                batch.logits[n] = 1
                cells.append(drafts[seq][-1])
            if not self._decode(len(going)):
                return {}
            for n, seq in enumerate(going):
                drafts[seq].append(int(fast.llama_sampler_sample(self._greedy, ctx, n)))
        return drafts

    def _decode(self, n: int) -> bool:
        self._batch.n_tokens = n
        rc = init_backend().llama_decode(self.ctx.ctx, self._batch)
        if rc == 0:
            return True
        log.warning("draft model %s: llama_decode failed with status %d; its context is emptied", self.name, rc)
        for seq in list(self._cells):
            init_backend().llama_memory_seq_rm(self.ctx.memory, seq, -1, -1)
            self._cells[seq] = []
        return False
