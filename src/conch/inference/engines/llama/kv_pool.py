"""The KV pool: one unified llama.cpp KV cache shared by every sequence, and prompt-prefix reuse.

The pool holds ``kv_total`` cells (``n_ctx``) for all sequences together, and any one may fill
it. A finished sequence keeps its cells as a cached prefix; a new request takes the idle
sequence sharing the longest prefix with its prompt and skips that much prefill. Idle prefixes
are evicted, largest first, when running sequences or a new prompt need the room; never the one
the new prompt takes over (``room_for``).

With a :class:`~conch.inference.engines.llama.prompt_cache.PromptCache` (``disk``, set by the
engine), long prefixes are also saved when their sequence is released, and a request whose
prompt a saved prefix covers further than any in memory gets it loaded into its sequence.

How exact a reused prefix is. By default (llama-server's micro-batches of 512 on the CPU) a
prompt's rows run ggml's tiled kernels, whose rounding depends on how the prompt was split and
where its cells sit, so a reused prefix holds what a fresh prefill computes up to the kernels'
rounding (a few tenths of a nat in a log-probability for the bundled model, as much as two
fresh prefills on different kernels differ by): a greedy answer is the same except that it may
take the other branch at a near-tie (tests/inference/test_prefix_reuse_tokens.py), and the
whole common prefix is reused, generated tokens included, as llama-server does. With
``batch_invariant`` every micro-batch stays under 64 rows and runs ggml's reference kernels
(``backend.ReferenceKernels``): every cell is bitwise what any other split computes, so reuse
never changes an output (tests/inference/test_engine_exact.py).

Lone rows (``batch_invariant`` where the reference kernels were not found). ggml's CPU flash
attention computes a micro-batch of *one* row over 512 KV cells or more on another path
(split-KV: the cells cut into one chunk per thread, each summed in FP16) than a micro-batch of
several rows (one FP16 sum over all cells). The two differ well beyond the last bit. So a reused
prefix is cut back until the re-decoded tail ends the way a fresh prefill of the prompt ends
(its last micro-batch one row or several), and only cells a prefill computed alongside other
rows count as exact (``seq_exact``): the last prompt token and generated tokens (decoded one
row per step) are left out of what goes to disk.

Restored cells. The split-KV path cuts the pool's cells by index, so a lone row's result
depends on where its sequence's cells sit (and on how far the used cells reach), not only on
what they hold. A prefill writes its cells into the first free ones from llama.cpp's head;
``llama_state_seq_set_data`` takes one contiguous run. A saved prefix is therefore loaded into
the sequence a prefill would take (the idle one sharing the longest prefix, emptied first: a
prefill would overwrite all but that prefix), and only while no other sequence holds cells, so
it lands where the prefill's cells would. Loaded into another free sequence beside an idle
prefix (a "Hello" served first), it sat after that prefix's cells and the greedy answer
changed.

Both are flash attention's paths (on by default on the CPU; ``flash_attn = "off"`` has
neither); the pool keeps to these rules either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conch.inference.engines.llama.backend import init_backend
from conch.inference.engines.llama.prompt_cache import common_prefix

if TYPE_CHECKING:
    from conch.inference.engines.llama.job import Job
    from conch.inference.engines.llama.prompt_cache import PromptCache


class KVPool:
    def __init__(self, ctx: Any, *, kv_total: int, n_seqs: int, cache_prompt: bool, active: list[Job],
                 n_batch: int, n_ubatch: int, lone_rows: bool = False) -> None:
        self._ctx = ctx
        self.kv_total = kv_total
        self.cache_prompt = cache_prompt
        # The scheduler's list of running jobs (shared, not copied): their cells are in use.
        self._active = active
        self.free_seqs: list[int] = list(range(n_seqs))
        # Tokens still in the KV cache of each idle sequence, for prompt-prefix reuse.
        self.seq_cache: dict[int, list[int]] = {}
        # Of those, how many lead cells hold what a fresh prefill computes (see "Lone rows").
        self.seq_exact: dict[int, int] = {}
        # Running sequences: (exact cells, cells reused) when they were assigned.
        self._reused: dict[int, tuple[int, int]] = {}
        # The scheduler's prompt step (n_batch) and llama.cpp's micro-batch (n_ubatch), which
        # decide where a prefill's micro-batches end.
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        # Whether a lone row rounds apart from several (see "Lone rows"): reuse then keeps to it.
        self.lone_rows = lone_rows
        # Long prefixes saved across restarts (prompt_cache.py); None: memory only.
        self.disk: PromptCache | None = None

    def used(self) -> int:
        return sum(j.n_past for j in self._active) + sum(len(c) for c in self.seq_cache.values())

    def free(self) -> int:
        return self.kv_total - self.used()

    def clear(self, seq: int) -> None:
        init_backend().llama_memory_seq_rm(self._ctx.memory, seq, -1, -1)
        self.seq_cache[seq] = []
        self.seq_exact[seq] = 0

    def evict_idle(self, need: int, *, spare: int = -1) -> None:
        """Drop cached prefixes of idle sequences, largest first, until ``need`` cells are free;
        never ``spare``'s (the sequence a request about to be admitted takes over)."""
        for seq, cached in sorted(self.seq_cache.items(), key=lambda kv: -len(kv[1])):
            if self.free() >= need:
                return
            if cached and seq != spare:
                self.clear(seq)

    def room_for(self, tokens: list[int]) -> bool:
        """Whether a request for ``tokens`` can be admitted now (its prompt and a first token),
        after evicting other idle prefixes if need be.

        The idle sequence it would take (``assign``) counts as room: its cells are either reused
        as the prompt's prefix or removed, so evicting them never makes room for it. Counted as
        used, a prefix longer than the pool's free cells less the prompt was evicted by the very
        request that would reuse it: the same long prompt twice in a pool of ``n_ctx`` cells was
        prefilled twice (or read from disk again), and a long chat lost its earlier turns."""
        need = len(tokens) + 1
        best = self._best_cached(tokens)[0] if self.free_seqs else -1
        taken = len(self.seq_cache.get(best, []))
        if self.free() + taken < need:
            self.evict_idle(need - taken, spare=best)
        # With nothing running, the oldest request always gets in (a prompt is < n_ctx).
        return not self._active or self.free() + taken >= need

    def _best_cached(self, tokens: list[int]) -> tuple[int, int]:
        """The idle sequence whose cached tokens share the longest prefix with ``tokens``."""
        best, best_len = self.free_seqs[-1], -1
        for seq in self.free_seqs:
            n = common_prefix(self.seq_cache.get(seq, []), tokens)
            if n > best_len:
                best, best_len = seq, n
        return best, best_len

    def _lone_tail(self, n: int, start: int) -> bool:
        """Whether prefilling tokens ``start..n-1`` alone ends with a one-row micro-batch."""
        step = (n - start - 1) % self.n_batch + 1
        return (step - 1) % self.n_ubatch + 1 == 1

    def fit_keep(self, n: int, keep: int) -> int:
        """``keep`` (cells reused of an ``n``-token prompt) cut back until the re-decoded tail
        ends as a fresh prefill ends, so the first token's logits are the same (see "Lone rows")."""
        if not self.lone_rows:
            return keep
        lone = self._lone_tail(n, 0)
        while keep > 0 and self._lone_tail(n, keep) != lone:
            keep -= 1
        return keep

    def assign(self, job: Job) -> None:
        """Give the job the idle sequence whose cached tokens share the longest prefix with its
        prompt, or one loaded with a saved prefix from disk when that covers more."""
        llama_cpp = init_backend()
        n = len(job.tokens)
        best, best_len = self._best_cached(job.tokens)
        # At least one prompt token is decoded again: its logits give the first sample. With
        # batch_invariant (or without flash attention) the reused prefix holds exactly the KV a
        # fresh prefill would compute, so reuse never changes an output; by default, up to the
        # kernels' rounding (see "How exact a reused prefix is").
        keep = self.fit_keep(n, min(best_len, n - 1)) if self.cache_prompt else 0
        # A saved prefix goes into the sequence a prefill would take, in place of its cells.
        # (Never a prompt with images: the disk holds no image cells; see release.)
        if self.disk is not None and self.cache_prompt and job.media is None and self._restore(job, keep, best):
            self._reused[best] = (job.n_past, job.n_past)
        else:
            if self.disk is not None:
                # A restore that failed may have emptied the best sequence.
                best, best_len = self._best_cached(job.tokens)
                keep = self.fit_keep(n, min(best_len, n - 1)) if self.cache_prompt else 0
            if keep > 0 and llama_cpp.llama_memory_seq_rm(self._ctx.memory, best, keep, -1):
                job.n_past = keep
            else:
                llama_cpp.llama_memory_seq_rm(self._ctx.memory, best, -1, -1)
                job.n_past = 0
            self._reused[best] = (min(job.n_past, self.seq_exact.get(best, 0)), job.n_past)
        self.free_seqs.remove(best)
        self.seq_cache.pop(best, None)
        self.seq_exact.pop(best, None)
        job.seq = best

    def _restore(self, job: Job, keep: int, seq: int) -> bool:
        """Load the saved prefix covering most of the job's prompt into ``seq`` (the sequence
        sharing the longest prefix in memory: the one a prefill would take) when it beats
        ``keep`` (that prefix) by ``min_tokens`` and lands where a prefill would put it.

        The saved cells are what a prefill computed, copied byte for byte; placed as a prefill
        places them (see "Restored cells"), a restored prefix gives the outputs a fresh prefill
        would (bitwise where reuse is: see :meth:`assign`)."""
        disk = self.disk
        assert disk is not None
        n = len(job.tokens)
        if n - 1 - keep < disk.min_tokens:
            return False
        # Other sequences' cells (idle or running) could make llama.cpp place the state
        # elsewhere than a prefill would: then the prompt is prefilled.
        if self._active or any(cells for s, cells in self.seq_cache.items() if s != seq):
            return False
        entry, shared = disk.lookup(job.tokens)
        if entry is None:
            return False
        usable = self.fit_keep(n, min(shared, n - 1))
        if usable - keep < disk.min_tokens:
            return False
        # The whole state is loaded, then cut to the shared prefix: it must fit meanwhile.
        if self.free() + len(self.seq_cache.get(seq, [])) < entry.n_cells:
            return False
        self.clear(seq)
        if not disk.restore(self._ctx, seq, entry, pool_empty=True):
            return False
        llama_cpp = init_backend()
        if not llama_cpp.llama_memory_seq_rm(self._ctx.memory, seq, usable, -1):
            llama_cpp.llama_memory_seq_rm(self._ctx.memory, seq, -1, -1)
            return False
        job.n_past = usable
        disk.stats.prompt_cache_restored_tokens += usable
        return True

    def release(self, job: Job, *, keep: bool) -> None:
        """Give the job's sequence back; with ``keep`` its cells stay as a reusable prefix."""
        exact, reused = self._reused.pop(job.seq, (0, 0))
        if job.pos_shift:
            # M-RoPE images: positions are not cell indices, which reuse assumes.
            keep = False
        if keep:
            # The next prompt sharing a prefix skips that much prefill.
            n_prompt = len(job.tokens)
            if job.n_past <= n_prompt:
                self.seq_cache[job.seq] = job.tokens[: job.n_past]
            else:
                self.seq_cache[job.seq] = job.tokens + job.generated[: job.n_past - n_prompt]
            # Cells this job prefilled are exact if all it reused was; its last prompt token
            # may have been a lone row, and generated tokens were.
            if exact >= reused:
                exact = max(reused, min(job.n_past, n_prompt) - 1)
            self.seq_exact[job.seq] = exact
            if self.disk is not None and self.cache_prompt and job.media is None:
                # Long prefixes (system prompts, tool lists) outlive a restart; an image's
                # cells stay in memory only (placeholders are no tokens a file should hold).
                self.disk.save(self._ctx, job.seq, self.seq_cache[job.seq], exact)
        else:
            self.clear(job.seq)
        self.free_seqs.append(job.seq)
        job.seq = -1
