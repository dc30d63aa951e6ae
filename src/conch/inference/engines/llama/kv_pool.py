"""The KV pool: one unified llama.cpp KV cache shared by every sequence, and prompt-prefix reuse.

Any sequence may grow to ``n_ctx``; the pool holds ``kv_total`` cells (two full contexts when
several sequences run). A finished sequence keeps its cells as a cached prefix; a new request
takes the idle sequence sharing the longest prefix with its prompt and skips that much
prefill. Idle prefixes are evicted, largest first, when running sequences need the room.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conch.inference.engines.llama.backend import init_backend

if TYPE_CHECKING:
    from conch.inference.engines.llama.scheduler import Job


class KVPool:
    def __init__(self, ctx: Any, *, kv_total: int, n_seqs: int, cache_prompt: bool, active: list[Job]) -> None:
        self._ctx = ctx
        self.kv_total = kv_total
        self.cache_prompt = cache_prompt
        # The scheduler's list of running jobs (shared, not copied): their cells are in use.
        self._active = active
        self.free_seqs: list[int] = list(range(n_seqs))
        # Tokens still in the KV cache of each idle sequence, for prompt-prefix reuse.
        self.seq_cache: dict[int, list[int]] = {}

    def used(self) -> int:
        return sum(j.n_past for j in self._active) + sum(len(c) for c in self.seq_cache.values())

    def free(self) -> int:
        return self.kv_total - self.used()

    def clear(self, seq: int) -> None:
        init_backend().llama_memory_seq_rm(self._ctx.memory, seq, -1, -1)
        self.seq_cache[seq] = []

    def evict_idle(self, need: int) -> None:
        """Drop cached prefixes of idle sequences, largest first, until ``need`` cells are free."""
        for seq, cached in sorted(self.seq_cache.items(), key=lambda kv: -len(kv[1])):
            if self.free() >= need:
                return
            if cached:
                self.clear(seq)

    def room_for(self, need: int) -> bool:
        if self.free() < need:
            self.evict_idle(need)
        # With nothing running, the oldest request always gets in (a prompt is < n_ctx).
        return not self._active or self.free() >= need

    def assign(self, job: Job) -> None:
        """Give the job the idle sequence whose cached tokens share the longest prefix with its prompt."""
        llama_cpp = init_backend()
        best, best_len = self.free_seqs[-1], -1
        for seq in self.free_seqs:
            cached = self.seq_cache.get(seq, [])
            n = 0
            for a, b in zip(cached, job.tokens, strict=False):
                if a != b:
                    break
                n += 1
            if n > best_len:
                best, best_len = seq, n
        self.free_seqs.remove(best)
        # At least one prompt token is decoded again: its logits give the first sample. With
        # micro-batches under EXACT_UBATCH the reused prefix holds exactly the KV a fresh
        # prefill would compute, so reuse never changes an output.
        keep = min(best_len, len(job.tokens) - 1) if self.cache_prompt else 0
        if keep > 0 and llama_cpp.llama_memory_seq_rm(self._ctx.memory, best, keep, -1):
            job.n_past = keep
        else:
            llama_cpp.llama_memory_seq_rm(self._ctx.memory, best, -1, -1)
            job.n_past = 0
        self.seq_cache.pop(best, None)
        job.seq = best

    def release(self, job: Job, *, keep: bool) -> None:
        """Give the job's sequence back; with ``keep`` its cells stay as a reusable prefix."""
        if keep:
            # The next prompt sharing a prefix skips that much prefill.
            n_prompt = len(job.tokens)
            if job.n_past <= n_prompt:
                self.seq_cache[job.seq] = job.tokens[: job.n_past]
            else:
                self.seq_cache[job.seq] = job.tokens + job.generated[: job.n_past - n_prompt]
        else:
            self.clear(job.seq)
        self.free_seqs.append(job.seq)
        job.seq = -1
