"""The scheduler: one worker thread decoding every running sequence together (continuous batching).

Like llama-server's slots, every running request owns a sequence id in a single llama.cpp
context. The worker builds one ``llama_batch`` per step holding the next token of every
generating sequence plus prompt chunks of newly admitted ones, calls ``llama_decode`` once,
and samples each sequence with its own sampler chain. Decoding several sequences in one call
costs little more than decoding one, which is where aggregate throughput comes from.

Tokens travel to the event loop after every step: one ``call_soon_threadsafe`` carries the
step's events for every stream into their asyncio queues, so streams are real without a
cross-thread wake-up per token; a stream whose reader fell behind takes what has queued up as
one event (:meth:`LlamaGeneration.__aiter__`). A cancelled request is dropped before the next batch is built,
so a disconnect stops generation within one token. When the KV pool runs out, the newest
sequence is preempted and replayed later (:meth:`Scheduler._make_room`).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from conch.inference.engines.base import (
    EngineError,
    EngineStats,
    Generation,
    QueueFull,
    SamplingParams,
    TokenEvent,
)
from conch.inference.engines.llama import sampling
from conch.inference.engines.llama.backend import (
    FA_TILE_ROWS,
    ReferenceKernels,
    fast_calls,
    init_backend,
    release_openmp_threads,
)
from conch.inference.engines.llama.device import CPU_CORES
from conch.inference.engines.llama.draft_model import DraftModel, DraftRequest
from conch.inference.engines.llama.job import Job
from conch.inference.engines.llama.kv_pool import KVPool
from conch.inference.engines.llama.speculative import (
    MODEL_DRAFT_MAX,
    NGRAM_OVER_MODEL,
    ROW_COST_CPU,
    ROW_COST_GPU,
    NgramDrafter,
)

log = logging.getLogger(__name__)

# Speculative drafts (speculative.py) are decoded only while few sequences generate: a drafted
# position costs nearly a whole token of compute once a step is large, and is thrown away when
# the draft is wrong. At most max(draft_max, this) drafted tokens go into one step.
SPEC_MAX_STREAMS = 4
SPEC_STEP_TOKENS = 64


def _deliver(events: list[tuple[Job, TokenEvent]]) -> None:
    for job, ev in events:
        job.queue.put_nowait(ev)


def _merge(ev: TokenEvent, later: TokenEvent) -> TokenEvent:
    """Two consecutive events of one stream as one (a reader that fell behind)."""
    logprobs = (ev.logprobs or []) + (later.logprobs or [])
    return TokenEvent(ev.text + later.text, later.n_tokens, later.finish_reason, later.error,
                      logprobs or None, later.stop_sequence)


class LlamaGeneration(Generation):
    def __init__(self, scheduler: Scheduler, job: Job) -> None:
        self._scheduler = scheduler
        self._job = job
        self.prompt_tokens = len(job.tokens)
        self._done = False

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:  # type: ignore[override]
        queue = self._job.queue
        try:
            while not self._done:
                ev = await queue.get()
                # Whatever queued up while this reader was busy goes out as one event: under
                # load the response side then costs per step, not per token.
                while ev.finish_reason is None and not queue.empty():
                    ev = _merge(ev, queue.get_nowait())
                if ev.finish_reason is not None:
                    self._done = True
                yield ev
        finally:
            if not self._done:
                self.cancel()

    @property
    def generated(self) -> int:
        return self._job.n_gen

    @property
    def finished(self) -> bool:
        return self._done

    def cancel(self) -> None:
        if not self._done:
            self._job.cancelled = True
            self._scheduler.drop(self._job)


class Scheduler:
    def __init__(
        self,
        model: Any,
        ctx: Any,
        *,
        name: str,
        n_batch: int,
        n_ubatch: int,
        n_parallel: int,
        kv_total: int,
        max_queue: int,
        cache_prompt: bool,
        stats: EngineStats,
        prefill_chunk: int,
        draft_max: int = 0,
        draft: DraftModel | None = None,
        overlap_text: bool = False,
        kernels: ReferenceKernels | None = None,
        batch_invariant: bool = False,
        threads: tuple[int, int] | None = None,
    ) -> None:
        # The model is only read through its vocabulary (token pieces, end-of-generation).
        self._vocab = model.vocab
        self._ctx = ctx
        self.name = name
        self.n_batch = n_batch
        # Prompt tokens decoded per step while other sequences are generating (chunked
        # prefill): a long prompt then delays the running streams by one chunk at a time
        # instead of all at once (conch.inference.engines.llama.offload: 128 on the CPU, n_ubatch on a GPU).
        self.prefill_chunk = max(1, prefill_chunk)
        self.max_queue = max_queue
        self.stats = stats
        self.draft_max = max(0, draft_max)  # tokens drafted per sequence and step; 0: no drafting
        # A second model proposing drafts (draft_model.py); None: prompt lookup only.
        self.draft = draft if self.draft_max else None
        # When llama_decode returns before the step is computed (every layer on a GPU), the
        # sampled tokens' text (detokenizing, stop strings, events for the event loop) is made
        # while the GPU computes the next step rather than between steps. On the CPU
        # llama_decode computes the step itself, and this would only hold every token back a step.
        self.overlap_text = overlap_text
        # ggml's reference kernels (backend.ReferenceKernels) for every step without a long
        # prompt chunk, so that a token's logits do not depend on what else its step held (one
        # row or several: a verified draft is what a one-row step gives); for every step with
        # batch_invariant. None: the fast kernels throughout (a GPU; not found).
        self.kernels = kernels
        self.batch_invariant = batch_invariant
        # The threads this model decodes and reads prompts with, shared with the other models
        # generating at the same moment (device.CPU_CORES); None: as the context has them.
        self.threads = threads
        # What its steps run with now (decode, prompt); None: as the context has them
        self.threads_now = threads
        # What a drafted row costs relative to a one-row step (speculative.DraftPolicy).
        self.row_cost = ROW_COST_GPU if overlap_text else ROW_COST_CPU
        self._cond = threading.Condition()
        self._pending: deque[Job] = deque()
        self._active: list[Job] = []
        self._outbox: list[tuple[Job, TokenEvent]] = []
        self.pool = KVPool(ctx, kv_total=kv_total, n_seqs=n_parallel, cache_prompt=cache_prompt, active=self._active,
                           n_batch=n_batch, n_ubatch=n_ubatch, lone_rows=batch_invariant and kernels is None)
        self.n_vocab = int(model.n_vocab())
        self._row_type = ctypes.c_float * self.n_vocab  # a logits row, read in place
        # Greedy requests are sampled by numpy on the logits row (sampling.Greedy); False: by
        # llama.cpp's sampler chain, as every other request (tests that watch the chain's calls).
        self.greedy_by_numpy = True
        self.make_sampler: Callable[[SamplingParams], Any] = lambda params: sampling.make_sampler(
            self._vocab, params, self.n_vocab, kv_total)
        self._batch: Any = None
        self._thread: threading.Thread | None = None
        self._stop = False
        self._pieces: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)
        self._eog: dict[int, bool] = {}
        # The model's vision projector (vision.Projector), when it has one.
        self.projector: Any = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._batch = init_backend().llama_batch_init(self.n_batch, 0, 1)
        if self.draft is not None:
            self.draft.start()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=f"conch-llama-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        CPU_CORES.leave(self, gone=True)
        for job in list(self._pending) + self._active:
            job.push(TokenEvent("", job.n_gen, "error", "the model was unloaded"))
        self._flush()
        self._pending.clear()
        self._active.clear()
        if self._batch is not None:
            init_backend().llama_batch_free(self._batch)
            self._batch = None
        if self.draft is not None:
            self.draft.close()

    @property
    def active_sequences(self) -> int:
        return len(self._active)

    @property
    def queued(self) -> int:
        return len(self._pending)

    @property
    def busy(self) -> bool:
        return bool(self._active or self._pending)

    # -- requests ----------------------------------------------------------------------------
    def submit(self, tokens: list[int], params: SamplingParams, max_tokens: int, *, media: Any = None) -> Generation:
        loop = asyncio.get_running_loop()
        job = Job(tokens=tokens, params=params, loop=loop, queue=asyncio.Queue(), max_tokens=max_tokens,
                  outbox=self._outbox, media=media)
        with self._cond:
            if len(self._pending) - len(self.pool.free_seqs) >= self.max_queue:
                raise QueueFull(self.max_queue)
            self._pending.append(job)
            self._cond.notify()
        return LlamaGeneration(self, job)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def drop(self, job: Job) -> None:
        """A cancelled job leaves the queue at once: while the worker is inside a step, clients
        that give up (a burst of disconnects) would otherwise count against ``max_queue`` until
        its next admission, and turn new requests away with 429. A running job ends at the
        next step (the worker checks ``cancelled`` between two tokens)."""
        with self._cond:
            if job.seq < 0 and job in self._pending:
                self._pending.remove(job)
                job.finished = True
                if job.sampler is not None:  # a preempted job keeps its sampler while it waits
                    sampling.free_sampler(job.sampler)
                    job.sampler = None
            self._cond.notify()

    # -- the worker thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # a native failure must not leave requests hanging
            log.exception("llama.cpp worker for %s failed", self.name)
            with self._cond:
                jobs = list(self._pending) + self._active
                self._pending.clear()
                self._active.clear()
            for job in jobs:
                job.push(TokenEvent("", job.n_gen, "error", f"inference failed: {exc}"))
            self._flush()

    def _flush(self) -> None:
        """Send the events pushed since the last flush, one call per event loop."""
        outbox = self._outbox
        if not outbox:
            return
        events = outbox[:]
        outbox.clear()
        loop = events[0][0].loop
        if all(job.loop is loop for job, _ in events):
            batches = {loop: events}
        else:
            batches = {}
            for item in events:
                batches.setdefault(item[0].loop, []).append(item)
        for target, batch in batches.items():
            try:
                target.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                for job, _ in batch:
                    job.cancelled = True

    def _finish(self, job: Job, reason: str, error: str | None = None) -> None:
        if job.finished:
            return
        job.finished = True
        if job in self._active:
            self._active.remove(job)
        elif job in self._pending:  # preempted (_make_room) before its last text showed a stop string
            self._pending.remove(job)
        if job.seq >= 0:
            seq = job.seq
            self.pool.release(job, keep=reason != "error")
            if self.draft is not None:
                self.draft.forget(seq)
        if job.sampler is not None:
            sampling.free_sampler(job.sampler)
            job.sampler = None
        if reason != "cancelled":
            tail = job.text[job.emitted :] if reason != "error" else ""
            job.push(TokenEvent(tail, job.n_gen, reason, error, stop_sequence=job.stop_hit if reason == "stop" else None))

    def _loop(self) -> None:
        llama_cpp = init_backend()
        fast = fast_calls()
        ctx = self._ctx.ctx
        batch = self._batch
        pool = self.pool
        # Jobs whose last tokens await their text (overlap_text), made after the next llama_decode.
        untexted: list[Job] = []
        while True:
            # The previous step's tokens (and any errors) go out before the next step or a wait.
            self._flush()
            if not self._active and not self._pending:
                # Going idle: give the OpenMP threads back, so that a busy model elsewhere in
                # the process keeps its barriers spinning (backend.release_openmp_threads).
                # Unlocked: a request arriving meanwhile only finds the pool made anew.
                release_openmp_threads()
                if self.threads is not None:
                    CPU_CORES.leave(self)
            with self._cond:
                while not self._stop and not self._active and not self._pending:
                    self._cond.wait()
                if self._stop:
                    return
                # Admit waiting requests into free sequences, oldest first, while the KV pool
                # has room for their prompts.
                while self._pending and pool.free_seqs:
                    job = self._pending[0]
                    if job.cancelled:
                        self._pending.popleft()
                        if job.sampler is not None:
                            sampling.free_sampler(job.sampler)
                            job.sampler = None
                        continue
                    if not pool.room_for(job.tokens):
                        break
                    self._pending.popleft()
                    if job.sampler is None:
                        try:
                            job.sampler = self.make_sampler(job.params)
                        except EngineError as exc:
                            job.push(TokenEvent("", 0, "error", str(exc)))
                            continue
                        if self.greedy_by_numpy:
                            job.greedy = sampling.greedy(job.params, self.n_vocab)
                    pool.assign(job)
                    self._active.append(job)
                # Dropped between two tokens: this is the "stops within one token" guarantee.
                for job in [j for j in self._active if j.cancelled]:
                    self._finish(job, "cancelled")
                active = list(self._active)
            if not active:
                continue
            if self.threads is not None:
                self._share_cores(llama_cpp, ctx)

            active = self._make_room(active)
            # Images first: a request's images go into its sequence whole, before its text.
            if any(j.media is not None and j.n_past < j.media.end for j in active):
                active = self._eval_media(active)
                if not active:
                    continue

            # Generating sequences first (one token each, and a draft of the next few when
            # drafting pays), then prompt chunks with what is left.
            n = 0
            sample_at: list[tuple[Job, int, list[int], bool]] = []
            generating: list[Job] = []
            drafts = self._drafts(active, self._draft_room(active))
            for job in active:
                if job.n_past >= len(job.tokens):
                    generating.append(job)
                    batch.token[n] = job.last_token
                    batch.pos[n] = job.n_past + job.pos_shift
                    batch.n_seq_id[n] = 1
                    batch.seq_id[n][0] = job.seq
                    batch.logits[n] = 1
                    draft, from_model = drafts.get(job.seq, ([], False))
                    sample_at.append((job, n, draft, from_model))
                    n += 1
                    for k, tok in enumerate(draft):
                        batch.token[n] = tok
                        batch.pos[n] = job.n_past + job.pos_shift + 1 + k
                        batch.n_seq_id[n] = 1
                        batch.seq_id[n][0] = job.seq
                        batch.logits[n] = 1
                        n += 1
            takes: list[tuple[Job, int]] = []
            budget = min(self._prefill_budget(len(generating)), self.n_batch - n)
            for job in active:
                remaining = len(job.tokens) - job.n_past
                if remaining <= 0 or budget <= 0:
                    continue
                take = min(remaining, budget)
                budget -= take
                takes.append((job, take))
            # With the reference kernels, a prompt chunk under 64 rows goes with the generating
            # rows (reference kernels), a longer one apart (the fast, tiled kernels): each row's
            # kernel then follows from its own sequence's chunk, never from what else the step
            # holds, so a request's logits do not depend on which others arrived with it.
            kernels = self.kernels
            apart = kernels is not None and not self.batch_invariant
            small = [t for t in takes if not apart or t[1] < FA_TILE_ROWS]
            big = [t for t in takes if apart and t[1] >= FA_TILE_ROWS]
            n_ref = 0
            for group in (small, big):
                for job, take in group:
                    for k in range(take):
                        batch.token[n] = job.tokens[job.n_past + k]
                        batch.pos[n] = job.n_past + job.pos_shift + k
                        batch.n_seq_id[n] = 1
                        batch.seq_id[n][0] = job.seq
                        batch.logits[n] = 0
                        n += 1
                    if take == len(job.tokens) - job.n_past:
                        batch.logits[n - 1] = 1
                        sample_at.append((job, n - 1, [], False))
                if group is small:
                    n_ref, sample_ref = n, len(sample_at)
            prefilled = small + big
            batch.n_tokens = n

            # One llama_decode for the step, or two: the rows on the reference kernels, then the
            # long prompt chunks on the fast ones (the second pass over the weights costs about
            # a one-row step, next to a chunk of 128 rows or more).
            if big and n_ref:
                parts = [(0, n_ref, sample_at[:sample_ref], generating, small),
                         (n_ref, n - n_ref, sample_at[sample_ref:], [], big)]
            else:
                parts = [(0, n, sample_at, generating, prefilled)]
            finished: list[tuple[Job, str]] = []
            failed = False
            for lo, count, entries, stepped, chunks in parts:
                if kernels is not None:
                    kernels.set(self.batch_invariant or not any(take >= FA_TILE_ROWS for _, take in chunks))
                rc = llama_cpp.llama_decode(ctx, batch if count == n else self._batch_view(lo, count))
                if rc != 0:
                    with self._cond:
                        for job in active + untexted:
                            self._finish(job, "error", f"llama_decode failed with status {rc}")
                    untexted = []
                    failed = True
                    break
                for job, take in chunks:
                    job.n_past += take
                    self.stats.prefill_tokens += take
                for job in stepped:
                    job.n_past += 1
                if untexted:
                    # The GPU computes this step meanwhile. A stop string found now ends its job
                    # with this step's token of it computed for nothing (its cell is a valid prefix).
                    for job in untexted:
                        if not job.finished and (reason := self._text(job)) is not None:
                            finished.append((job, reason))
                    untexted = []
                    self._flush()
                # On a GPU llama_decode only queues the step; the first sampler call would wait
                # for it holding the GIL (fast_calls), so the event loop could not stream tokens
                # meanwhile. Waiting here, with the GIL released, overlaps the two.
                llama_cpp.llama_synchronize(ctx)
                self._sample_part(fast, ctx, entries, lo, finished, untexted)
            if failed:
                continue
            if finished:
                with self._cond:
                    for job, reason in finished:
                        self._finish(job, reason)

    def _eval_media(self, active: list[Job]) -> list[Job]:
        """Bring each job with images up to the end of its last image: text chunks decoded
        here (no logits), image chunks encoded and decoded by the projector (libmtmd's
        ``mtmd_helper_eval_chunk_single``), each on the job's own sequence. The other streams
        wait meanwhile (docs/inference.md, "Images"). Returns the jobs still running."""
        llama_cpp = init_backend()
        projector = self.projector
        failed: list[tuple[Job, str]] = []
        if self.kernels is not None:
            self.kernels.set(self.batch_invariant)  # prompt rows: the fast kernels, as a long chunk
        for job in active:
            media = job.media
            if media is None or job.n_past >= media.end:
                continue
            try:
                if projector is None:
                    raise EngineError("the model's projector is not loaded")
                chunk = media.chunk_at(job.n_past)
                if chunk.image and job.n_past > chunk.start:
                    # A reused prefix that ends inside an image: the image is evaluated whole.
                    llama_cpp.llama_memory_seq_rm(self._ctx.memory, job.seq, chunk.start + job.pos_shift, -1)
                    job.n_past = chunk.start
                for chunk in media.chunks:
                    if chunk.end <= job.n_past or chunk.start >= media.end:
                        continue
                    if chunk.image:
                        after = projector.eval_chunk(self._ctx.ctx, chunk, job.n_past + job.pos_shift, job.seq,
                                                     self.n_batch)
                        job.n_past = chunk.end
                        job.pos_shift = after - job.n_past
                    else:
                        self._decode_text(job, chunk.end)
                    self.stats.prefill_tokens += chunk.end - chunk.start
            except EngineError as exc:
                failed.append((job, str(exc)))
        if failed:
            with self._cond:
                for job, why in failed:
                    self._finish(job, "error", why)
            self._flush()
        return [j for j in active if not j.finished]

    def _share_cores(self, llama_cpp: Any, ctx: Any) -> None:
        """Take this step's share of the CPU cores (device.CoreShare)."""
        assert self.threads is not None
        CPU_CORES.enter(self)
        n, n_batch = self.threads
        now = (CPU_CORES.threads(n), CPU_CORES.threads(n_batch))
        if now != self.threads_now:
            llama_cpp.llama_set_n_threads(ctx, now[0], now[1])
            self.threads_now = now

    def _decode_text(self, job: Job, end: int) -> None:
        """Decode the job's prompt tokens up to ``end`` (no logits), in steps of ``n_batch``."""
        llama_cpp = init_backend()
        batch = self._batch
        while job.n_past < end:
            take = min(end - job.n_past, self.n_batch)
            for k in range(take):
                batch.token[k] = job.tokens[job.n_past + k]
                batch.pos[k] = job.n_past + job.pos_shift + k
                batch.n_seq_id[k] = 1
                batch.seq_id[k][0] = job.seq
                batch.logits[k] = 0
            batch.n_tokens = take
            rc = llama_cpp.llama_decode(self._ctx.ctx, batch)
            if rc != 0:
                raise EngineError(f"llama_decode failed with status {rc}")
            job.n_past += take

    def _batch_view(self, lo: int, count: int) -> Any:
        """Rows ``lo .. lo + count`` of the step's batch as a batch of their own (no copy)."""
        llama_cpp = init_backend()
        batch = self._batch
        view = llama_cpp.llama_batch()
        view.n_tokens = count
        for name, size in (("token", 4), ("pos", 4), ("n_seq_id", 4), ("seq_id", ctypes.sizeof(ctypes.c_void_p)),
                           ("logits", 1)):
            field = getattr(batch, name)
            address = ctypes.cast(field, ctypes.c_void_p).value or 0
            setattr(view, name, ctypes.cast(address + lo * size, type(field)))
        return view

    def _sample_part(self, fast: Any, ctx: Any, entries: list[tuple[Job, int, list[int], bool]], lo: int,
                     finished: list[tuple[Job, str]], untexted: list[Job]) -> None:
        """Sample the jobs whose rows the last llama_decode computed (``lo``: its first row in
        the step's batch), accepting drafted tokens while they are what is drawn."""
        llama_cpp = init_backend()
        overlap = self.overlap_text
        stopped = {job for job, _ in finished}
        for job, row, draft, from_model in entries:
            if job in stopped:
                continue
            idx = row - lo
            # One sampler draw per emitted token, in order; a drafted token is kept while it
            # is the token just drawn, and then the logits after it give the next draw.
            kept = 0
            while True:
                reason = self._take(job, self._sample(fast, ctx, job, idx + kept), idx + kept)
                # Text now unless overlapped: a job that ends (its last event carries it; a
                # stop string wins over the budget) and a stream's first text (all of its TTFT).
                if reason is not None or not overlap or not job.text:
                    reason = self._text(job) or reason
                if reason is not None:
                    finished.append((job, reason))
                    break
                if kept < len(draft) and job.last_token == draft[kept]:
                    kept += 1
                    continue
                break
            if draft:
                job.n_past += kept
                if kept < len(draft):  # the cells of the drafted tokens not kept
                    llama_cpp.llama_memory_seq_rm(self._ctx.memory, job.seq, job.n_past + job.pos_shift, -1)
                self.stats.draft_tokens += len(draft)
                self.stats.draft_accepted_tokens += kept
                if from_model:
                    job.model_drafts.judge(len(draft), kept)
                elif job.drafter is not None:
                    job.drafter.judge(len(draft), kept)
            if self.draft is not None and job.seq >= 0:
                # The draft model's cells past what the target kept (its rejected drafts).
                self.draft.trim(job.seq, job.n_past)
            if overlap and job.unsent and reason is None:
                untexted.append(job)

    def _sample(self, fast: Any, ctx: Any, job: Job, idx: int) -> int:
        if job.greedy is not None:
            row = np.ctypeslib.as_array(self._row_type.from_address(fast.llama_get_logits_ith(ctx, idx)))
            tok = job.greedy.pick(row)
            if tok >= 0:
                return tok
        return int(fast.llama_sampler_sample(job.sampler, ctx, idx))

    def _take(self, job: Job, tok: int, idx: int) -> str | None:
        """Take a sampled token into the job (its text comes in :meth:`_text`); "stop" at the
        end of generation, "length" at the job's token budget."""
        if self._is_eog(tok):
            return "stop"
        if job.params.logprobs is not None:  # the logits row is only there until the next step
            job.pending_logprobs.append(sampling.token_logprob(
                init_backend().llama_get_logits_ith(self._ctx.ctx, idx), self.n_vocab, tok, job.params.logprobs,
                self._piece))
        job.n_gen += 1
        self.stats.completion_tokens += 1
        job.last_token = tok
        job.generated.append(tok)
        job.unsent.append(tok)
        if job.drafter is not None:
            job.drafter.extend((tok,))
        return "length" if job.n_gen >= job.max_tokens else None

    def _text(self, job: Job) -> str | None:
        """The text of the job's unsent tokens, out to its stream; "stop" on a stop string."""
        piece = self._piece
        for k, tok in enumerate(job.unsent):
            if job.append_text(job.decoder.decode(piece(tok))) == "stop":
                # Drafted tokens after the stop were taken in the same step; they do not count.
                job.n_gen -= len(job.unsent) - k - 1
                job.unsent.clear()
                return "stop"
        job.unsent.clear()
        return None

    def _draft_room(self, active: list[Job]) -> int:
        """Drafted tokens this step may hold: none when many sequences generate, else what the
        batch and the KV pool have left after the step's own tokens."""
        if not self.draft_max:
            return 0
        generating = sum(1 for j in active if j.n_past >= len(j.tokens))
        if not generating or generating > SPEC_MAX_STREAMS:
            return 0
        need = self._step_need(active)
        return max(0, min(max(self.draft_max, SPEC_STEP_TOKENS), self.n_batch - need, self.pool.free() - need))

    def _drafts(self, active: list[Job], room: int) -> dict[int, tuple[list[int], bool]]:
        """This step's drafts: sequence -> (tokens, whether the draft model proposed them).

        n-gram drafts first, as long as each request's policy finds they pay (speculative.py);
        with a draft model, a request whose n-gram match is shorter than NGRAM_OVER_MODEL tokens
        asks the draft model instead. While drafting may happen (few sequences generate), the
        draft model's context follows every running sequence: prompt chunks one step behind
        the target's, generated tokens as they come."""
        out: dict[int, tuple[list[int], bool]] = {}
        draft = self.draft
        generating = [j for j in active if j.n_past >= len(j.tokens)]
        if draft is None and room <= 0:
            return out
        if draft is not None and len(generating) > SPEC_MAX_STREAMS:
            return out
        requests: list[DraftRequest] = []
        row_cost = self.row_cost
        for job in generating:
            # Never draft past the job's token budget: what cannot be emitted need not be checked.
            limit = min(self.draft_max, room, job.max_tokens - job.n_gen - 1)
            if limit > 0:
                if job.drafter is None:
                    job.drafter = NgramDrafter(job.tokens + job.generated)
                matched, tokens = job.drafter.propose(limit, row_cost)
                if job.media is not None:
                    # Never an image's placeholder; the draft model never sees a prompt with images.
                    tokens = tokens[: next((k for k, t in enumerate(tokens) if t < 0), len(tokens))]
                if draft is not None and job.media is None and job.model_drafts.enabled and matched < NGRAM_OVER_MODEL:
                    limit = min(limit, MODEL_DRAFT_MAX)
                    room -= limit
                else:
                    if tokens:
                        out[job.seq] = (tokens, False)
                        room -= len(tokens)
                    limit = 0
            if draft is not None and job.media is None:
                requests.append(DraftRequest(job.seq, job.tokens + job.generated, max(0, limit)))
        if draft is not None:
            requests += [DraftRequest(j.seq, j.tokens[: j.n_past]) for j in active
                         if 0 < j.n_past < len(j.tokens) and j.media is None]
            for seq, tokens in draft.run(requests, self._prefill_budget(len(generating))).items():
                out[seq] = (tokens, True)
        return out

    def _prefill_budget(self, generating: int) -> int:
        """Prompt tokens to decode this step: all that fit when nobody is waiting for tokens,
        a bounded chunk when other streams are generating, so their tokens keep flowing."""
        if generating == 0:
            return self.n_batch
        return max(0, min(self.n_batch - generating, self.prefill_chunk))

    def _step_need(self, jobs: list[Job]) -> int:
        """KV cells the next step writes, drafts aside: a token per generating sequence and
        the prompt chunks that fit the prefill budget."""
        generating = sum(1 for j in jobs if j.n_past >= len(j.tokens))
        budget, need = self._prefill_budget(generating), generating
        for j in jobs:
            remaining = len(j.tokens) - j.n_past
            if remaining > 0 and budget > 0:
                take = min(remaining, budget)
                need += take
                budget -= take
        return need

    def _make_room(self, active: list[Job]) -> list[Job]:
        """Ensure the next step fits the KV pool, preempting the newest sequences if needed.

        A preempted request keeps its sampler and text; its generated tokens join its prompt
        and it waits at the head of the queue, so its stream pauses and later resumes.
        """

        step_need = self._step_need
        pool = self.pool
        need = step_need(active)
        if pool.free() >= need:
            return active
        with self._cond:
            pool.evict_idle(need)
            while len(self._active) > 1 and pool.free() < step_need(self._active):
                job = self._active.pop()
                seq = job.seq
                pool.release(job, keep=False)
                if self.draft is not None:
                    self.draft.forget(seq)
                job.tokens = job.tokens + job.generated
                job.generated = []
                job.n_past = 0
                job.pos_shift = 0
                self._pending.appendleft(job)
            return list(self._active)

    def _is_eog(self, tok: int) -> bool:
        eog = self._eog.get(tok)
        if eog is None:
            eog = self._eog[tok] = bool(fast_calls().llama_vocab_is_eog(self._vocab, tok))
        return eog

    def _piece(self, tok: int) -> bytes:
        piece = self._pieces.get(tok)
        if piece is not None:
            return piece
        fast = fast_calls()
        n = fast.llama_token_to_piece(self._vocab, tok, self._piece_buf, 256, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = fast.llama_token_to_piece(self._vocab, tok, buf, -n, 0, False)
            piece = bytes(buf.raw[:n])
        else:
            piece = bytes(self._piece_buf.raw[:n])
        self._pieces[tok] = piece
        return piece
