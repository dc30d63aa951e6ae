"""The llama.cpp engine: one model, one context, several sequences decoded together.

Like llama-server's slots, every running request owns a sequence id in a single llama.cpp
context. A worker thread builds one ``llama_batch`` per step holding the next token of every
generating sequence plus prompt chunks of newly admitted ones, calls ``llama_decode`` once,
and samples each sequence with its own sampler chain. Decoding several sequences in one
call costs little more than decoding one, which is where aggregate throughput comes from.

Every micro-batch llama.cpp computes holds fewer than 64 tokens (``n_ubatch``): from 64
query rows on, ggml's CPU flash attention switches to a tiled kernel whose rounding depends on
the batch and on where the sequence sits in the KV pool. Below it, each token's logits are
bitwise the same however its prompt was split and whatever else the pool holds, so a cached
prompt prefix can be reused without changing any output.

Tokens travel to the event loop one at a time (``call_soon_threadsafe`` into an asyncio
queue), so streams are real; a cancelled request is dropped before the next batch is built,
so a disconnect stops generation within one token. Embeddings use a second context
(mean pooling, set explicitly) created on first use.
"""

from __future__ import annotations

import asyncio
import codecs
import ctypes
import logging
import math
import os
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from conch.inference.engines.base import (
    ChatInputError,
    ChatPrompt,
    ContextLengthExceeded,
    EngineError,
    EngineStats,
    Generation,
    QueueFull,
    SamplingParams,
    TokenEvent,
    TokenLogprob,
    Unsupported,
)
from conch.inference.engines.llama.grammar import plan_constraints
from conch.inference.engines.llama.templates import DEFAULT_CHATML, ChatTemplate
from conch.inference.tool_calls import render_messages

if TYPE_CHECKING:
    from conch.inference.chat import ChatSpec

log = logging.getLogger(__name__)

_backend_lock = threading.Lock()
_backend_ready = False
_fast: Any = None


def _fast_calls() -> Any:
    """Short llama.cpp calls bound through ``PyDLL``, which keeps the GIL held.

    ctypes' default ``CDLL`` drops and retakes the GIL around every call; when the event loop
    thread is busy, retaking it can wait a whole switch interval (5 ms). Sampling one token
    takes well under that, so the worker keeps the GIL for it and releases it only in
    ``llama_decode``, where the real work happens.
    """
    global _fast
    if _fast is None:
        from llama_cpp import llama_cpp as raw

        lib = ctypes.PyDLL(raw._lib._name)
        lib.llama_sampler_sample.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]
        lib.llama_sampler_sample.restype = ctypes.c_int32
        lib.llama_vocab_is_eog.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        lib.llama_vocab_is_eog.restype = ctypes.c_bool
        lib.llama_token_to_piece.argtypes = [
            ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_bool,
        ]
        lib.llama_token_to_piece.restype = ctypes.c_int32
        _fast = lib
    return _fast


def _init_backend() -> Any:
    """Import llama_cpp once, quiet its native logging, and initialise the backend."""
    global _backend_ready
    import llama_cpp

    with _backend_lock:
        if not _backend_ready:
            import llama_cpp._logger  # installs the log callback that honours the level below

            logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
            llama_cpp.llama_backend_init()
            _backend_ready = True
    return llama_cpp


@dataclass
class _Job:
    tokens: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[TokenEvent]
    max_tokens: int
    cancelled: bool = False
    seq: int = -1
    sampler: Any = None
    n_past: int = 0  # tokens of this sequence already in the KV cache
    n_gen: int = 0
    generated: list[int] = field(default_factory=list)
    last_token: int = -1
    text: str = ""
    emitted: int = 0
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_hit: str | None = None

    def push(self, ev: TokenEvent) -> None:
        if self.pending_logprobs:
            # The log-probabilities ride on the next event out (text may be held for stop strings).
            ev.logprobs, self.pending_logprobs = self.pending_logprobs, []
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)
        except RuntimeError:  # the loop is gone: nobody is listening any more
            self.cancelled = True


class _LlamaGeneration(Generation):
    def __init__(self, engine: LlamaEngine, job: _Job) -> None:
        self._engine = engine
        self._job = job
        self.prompt_tokens = len(job.tokens)
        self._done = False

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:  # type: ignore[override]
        try:
            while not self._done:
                ev = await self._job.queue.get()
                if ev.finish_reason is not None:
                    self._done = True
                yield ev
        finally:
            if not self._done:
                self.cancel()

    def cancel(self) -> None:
        if not self._done:
            self._job.cancelled = True
            self._engine._wake()


class LlamaEngine:
    def __init__(
        self,
        model_id: str,
        path: str,
        *,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        n_parallel: int = 4,
        cache_prompt: bool = True,
        n_batch: int = 512,
        max_queue: int = 64,
        chat_template: str | None = None,
    ) -> None:
        self.model_id = model_id
        self.path = path
        self._n_ctx_req = n_ctx
        # Half the logical CPUs (physical cores on SMT machines), as llama-cpp-python does:
        # oversubscribed OpenMP threads spin and slow decoding down badly.
        self.n_threads = n_threads or max((os.cpu_count() or 2) // 2, 1)
        # Steps with several tokens (prompts, many sequences) scale with cores, as in
        # llama-cpp-python's defaults.
        self.n_threads_batch = n_threads_batch or max(os.cpu_count() or 1, 1)
        self.cache_prompt = cache_prompt
        self.n_parallel = max(1, n_parallel)
        self.n_batch = n_batch
        self.max_queue = max_queue
        self._template_override = chat_template
        self.n_ctx = n_ctx
        self.stats = EngineStats()

        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        self._emb_ctx: Any = None
        self._emb_lock = threading.Lock()
        self._cond = threading.Condition()
        self._pending: deque[_Job] = deque()
        self._active: list[_Job] = []
        self._free_seqs: list[int] = []
        # Tokens still in the KV cache of each idle sequence, for prompt-prefix reuse.
        self._seq_cache: dict[int, list[int]] = {}
        self._thread: threading.Thread | None = None
        self._stop = False
        self._template: ChatTemplate | None = None
        self._pieces: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)
        self._eog: dict[int, bool] = {}
        self._bos_text = ""
        self._eos_text = ""
        self._add_bos = False

    # -- lifecycle -----------------------------------------------------------------------
    def load(self) -> None:
        llama_cpp = _init_backend()
        from llama_cpp._internals import LlamaModel

        mparams = llama_cpp.llama_model_default_params()
        mparams.use_mmap = True
        self._model = LlamaModel(path_model=self.path, params=mparams, verbose=False)
        n_ctx_train = self._model.n_ctx_train()
        self.n_ctx = min(self._n_ctx_req, n_ctx_train) if n_ctx_train > 0 else self._n_ctx_req
        self.has_decoder = bool(llama_cpp.llama_model_has_decoder(self._model.model))
        self.has_encoder = bool(llama_cpp.llama_model_has_encoder(self._model.model))
        self.n_embd = self._model.n_embd()
        self.n_vocab = self._model.n_vocab()
        self._add_bos = self._model.add_bos_token()

        meta = self._model.metadata()
        self._bos_text = self._token_text(self._model.token_bos())
        self._eos_text = self._token_text(self._model.token_eos())
        self._template = ChatTemplate(
            self._template_override or meta.get("tokenizer.chat_template") or DEFAULT_CHATML,
            bos_token=self._bos_text, eos_token=self._eos_text,
        )

        from conch.inference.gguf_info import EMBEDDING_ARCHITECTURES

        # Encoders (BERT family) attend both ways: embeddings only, and a whole input per micro-batch.
        self.bidirectional = meta.get("general.architecture") in EMBEDDING_ARCHITECTURES or (
            self.has_encoder and not self.has_decoder
        )
        if self.has_decoder and not self.has_encoder and not self.bidirectional:
            cparams = llama_cpp.llama_context_default_params()
            # One KV pool shared by all sequences (unified): any sequence may grow to n_ctx,
            # and the pool holds two full contexts. Short chats fit many at once; when the pool
            # runs out, the newest sequence is preempted and replayed later (see _make_room).
            # A pool of n_parallel full contexts would cost ~24 MB per 1k tokens for nothing.
            self.kv_total = self.n_ctx * (2 if self.n_parallel > 1 else 1)
            cparams.n_ctx = self.kv_total
            cparams.n_batch = self.n_batch
            # Exact prefix reuse (see the module docstring) for prefill 4-8 % slower than in
            # one 512-token micro-batch on this CPU build.
            cparams.n_ubatch = min(self.n_batch, EXACT_UBATCH)
            cparams.n_seq_max = self.n_parallel
            cparams.n_threads = self.n_threads
            cparams.n_threads_batch = self.n_threads_batch
            cparams.kv_unified = True
            cparams.no_perf = True
            from llama_cpp._internals import LlamaContext

            self._ctx = LlamaContext(model=self._model, params=cparams, verbose=False)
            self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
            self._free_seqs = list(range(self.n_parallel))
            self._seq_cache = {}
            self._stop = False
            self._thread = threading.Thread(
                target=self._run, name=f"conch-llama-{self.model_id}", daemon=True
            )
            self._thread.start()

    def unload(self) -> None:
        llama_cpp = _init_backend()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        for job in list(self._pending) + self._active:
            job.push(TokenEvent("", job.n_gen, "error", "the model was unloaded"))
        self._pending.clear()
        self._active.clear()
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        with self._emb_lock:
            if self._emb_ctx is not None:
                self._emb_ctx.close()
                self._emb_ctx = None
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        if self._model is not None:
            self._model.close()
            self._model = None

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset(("chat", "embeddings") if self._ctx is not None else ("embeddings",))

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def active_sequences(self) -> int:
        return len(self._active)

    @property
    def queued(self) -> int:
        return len(self._pending)

    @property
    def busy(self) -> bool:
        return bool(self._active or self._pending)

    # -- text ------------------------------------------------------------------------------
    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        try:
            return self._model.token_get_text(token) or ""
        except UnicodeDecodeError:
            # A byte-level BOS/EOS whose text is not UTF-8 cannot be written into a template;
            # templates then render without it, as llama.cpp's own server does.
            return ""

    def tokenize(self, text: str, *, special: bool = False, add_bos: bool | None = None) -> list[int]:
        if self._model is None:
            raise EngineError("model is not loaded")
        if add_bos is None:
            add_bos = self._add_bos
        return list(self._model.tokenize(text.encode("utf-8"), add_bos, special))

    def detokenize(self, tokens: list[int]) -> str:
        return bytes(self._model.detokenize(tokens)).decode("utf-8", errors="replace")

    def format_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        if self._template is None:
            raise EngineError("model is not loaded")
        return self._template.render(messages, tools)

    def prompt_tokens(self, prompt: str) -> list[int]:
        """Tokens of a rendered chat prompt (special tokens parsed, BOS not doubled)."""
        add_bos = self._add_bos and not (self._bos_text and prompt.startswith(self._bos_text))
        return self.tokenize(prompt, special=True, add_bos=add_bos)

    def text_prompt(self, text: str) -> list[int]:
        """A legacy completion's prompt: special tokens parsed, as llama-server does."""
        return self.prompt_tokens(text)

    def fim_prompt(self, prefix: str, suffix: str) -> list[int]:
        """Prefix-suffix-middle order, as llama-server's /infill builds it."""
        llama_cpp = _init_backend()
        vocab = self._model.vocab
        pre, suf, mid = (int(f(vocab)) for f in (llama_cpp.llama_vocab_fim_pre, llama_cpp.llama_vocab_fim_suf,
                                                    llama_cpp.llama_vocab_fim_mid))
        if min(pre, suf, mid) < 0:
            raise Unsupported(f"The model '{self.model_id}' has no fill-in-the-middle tokens, so 'suffix' cannot be used")
        bos = int(self._model.token_bos())
        head = [bos] if self._add_bos and bos >= 0 else []
        return [*head, pre, *self.tokenize(prefix, add_bos=False), suf, *self.tokenize(suffix, add_bos=False), mid]

    def chat_prompt(self, spec: ChatSpec) -> ChatPrompt:
        if self._ctx is None:
            raise Unsupported(f"The model '{self.model_id}' does not support chat")
        plan_constraints(spec)
        if spec.sampling.grammar and not self.check_grammar(spec.sampling.grammar):
            param = "tools" if spec.tools_active else "response_format"
            raise ChatInputError("The schema could not be turned into a grammar llama.cpp accepts", param)
        messages = render_messages(spec.messages, spec.tools if spec.tools_active else [], inject_tools=True)
        try:
            prompt = self.format_chat(messages)
        except EngineError as exc:
            raise ChatInputError(str(exc), "messages") from exc
        return ChatPrompt(self.prompt_tokens(prompt), spec.sampling)

    # -- generation --------------------------------------------------------------------------
    def generate(self, prompt: str | list[int], params: SamplingParams) -> Generation:
        if self._ctx is None:
            raise Unsupported(f"The model '{self.model_id}' cannot generate text (it has no decoder)")
        tokens = self.prompt_tokens(prompt) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            raise EngineError("the prompt is empty")
        if len(tokens) >= self.n_ctx:
            raise ContextLengthExceeded(len(tokens), self.n_ctx)
        room = self.n_ctx - len(tokens)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        loop = asyncio.get_running_loop()
        job = _Job(tokens=tokens, params=params, loop=loop, queue=asyncio.Queue(), max_tokens=max_tokens)
        with self._cond:
            if len(self._pending) - len(self._free_seqs) >= self.max_queue:
                raise QueueFull(self.max_queue)
            self._pending.append(job)
            self._cond.notify()
        return _LlamaGeneration(self, job)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def check_grammar(self, grammar: str) -> bool:
        """Whether llama.cpp accepts this GBNF grammar (checked before a request is queued)."""
        llama_cpp = _init_backend()
        smpl = llama_cpp.llama_sampler_init_grammar(self._model.vocab, grammar.encode("utf-8"), b"root")
        if not smpl:
            return False
        llama_cpp.llama_sampler_free(smpl)
        return True

    def _make_sampler(self, params: SamplingParams) -> Any:
        llama_cpp = _init_backend()
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        add = llama_cpp.llama_sampler_chain_add
        vocab = self._model.vocab
        if params.grammar:
            g = params.grammar.encode("utf-8")
            if params.grammar_triggers:
                pats = (ctypes.c_char_p * len(params.grammar_triggers))(
                    *[p.encode("utf-8") for p in params.grammar_triggers]
                )
                smpl = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                    vocab, g, b"root", pats, len(params.grammar_triggers), None, 0
                )
            else:
                smpl = llama_cpp.llama_sampler_init_grammar(vocab, g, b"root")
            if not smpl:
                llama_cpp.llama_sampler_free(chain)
                raise EngineError("the grammar for this request could not be parsed")
            add(chain, smpl)
        if params.logit_bias:
            # First in the chain, as llama-server does: the bias shifts the logits every later
            # stage sees, so -100 removes a token even from a greedy answer.
            biases = (llama_cpp.llama_logit_bias * len(params.logit_bias))(
                *[llama_cpp.llama_logit_bias(tok, bias) for tok, bias in params.logit_bias.items()]
            )
            add(chain, llama_cpp.llama_sampler_init_logit_bias(self.n_vocab, len(params.logit_bias), biases))
        if params.presence_penalty or params.frequency_penalty or params.repeat_penalty != 1.0:
            last_n = self.n_ctx if params.repeat_last_n < 0 else params.repeat_last_n
            add(chain, llama_cpp.llama_sampler_init_penalties(
                self.n_vocab, last_n, params.repeat_penalty, params.frequency_penalty, params.presence_penalty))
        if params.temperature <= 0:
            add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                add(chain, llama_cpp.llama_sampler_init_top_k(params.top_k))
            if params.typical_p < 1.0:
                add(chain, llama_cpp.llama_sampler_init_typical(params.typical_p, 1))
            if params.top_p < 1.0:
                add(chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                add(chain, llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
            add(chain, llama_cpp.llama_sampler_init_temp(params.temperature))
            seed = params.seed if params.seed is not None else random.getrandbits(32)
            add(chain, llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return chain

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # a native failure must not leave requests hanging
            log.exception("llama.cpp worker for %s failed", self.model_id)
            with self._cond:
                jobs = list(self._pending) + self._active
                self._pending.clear()
                self._active.clear()
            for job in jobs:
                job.push(TokenEvent("", job.n_gen, "error", f"inference failed: {exc}"))

    def _finish(self, job: _Job, reason: str, error: str | None = None) -> None:
        llama_cpp = _init_backend()
        if job in self._active:
            self._active.remove(job)
        if job.seq >= 0:
            if reason == "error":
                llama_cpp.llama_memory_seq_rm(self._ctx.memory, job.seq, -1, -1)
                self._seq_cache[job.seq] = []
            else:
                # Keep the KV cache: the next prompt sharing a prefix skips that much prefill.
                n_prompt = len(job.tokens)
                if job.n_past <= n_prompt:
                    self._seq_cache[job.seq] = job.tokens[: job.n_past]
                else:
                    self._seq_cache[job.seq] = job.tokens + job.generated[: job.n_past - n_prompt]
            self._free_seqs.append(job.seq)
            job.seq = -1
        if job.sampler is not None:
            llama_cpp.llama_sampler_free(job.sampler)
            job.sampler = None
        if reason != "cancelled":
            tail = job.text[job.emitted :] if reason != "error" else ""
            job.push(TokenEvent(tail, job.n_gen, reason, error, stop_sequence=job.stop_hit if reason == "stop" else None))
        self.stats.requests += 1

    def _loop(self) -> None:
        llama_cpp = _init_backend()
        fast = _fast_calls()
        ctx = self._ctx.ctx
        vocab = self._model.vocab
        batch = self._batch
        while True:
            with self._cond:
                while not self._stop and not self._active and not self._pending:
                    self._cond.wait()
                if self._stop:
                    return
                # Admit waiting requests into free sequences, oldest first, while the KV pool
                # has room for their prompts.
                while self._pending and self._free_seqs:
                    job = self._pending[0]
                    if job.cancelled:
                        self._pending.popleft()
                        if job.sampler is not None:
                            llama_cpp.llama_sampler_free(job.sampler)
                            job.sampler = None
                        continue
                    if not self._room_for(len(job.tokens) + 1):
                        break
                    self._pending.popleft()
                    if job.sampler is None:
                        try:
                            job.sampler = self._make_sampler(job.params)
                        except EngineError as exc:
                            job.push(TokenEvent("", 0, "error", str(exc)))
                            continue
                    self._assign_seq(job)
                    self._active.append(job)
                # Dropped between two tokens: this is the "stops within one token" guarantee.
                for job in [j for j in self._active if j.cancelled]:
                    self._finish(job, "cancelled")
                active = list(self._active)
            if not active:
                continue

            active = self._make_room(active)

            # Generating sequences first (one token each), then prompt chunks with what is left.
            n = 0
            sample_at: list[tuple[_Job, int]] = []
            generating: list[_Job] = []
            for job in active:
                if job.n_past >= len(job.tokens):
                    generating.append(job)
                    batch.token[n] = job.last_token
                    batch.pos[n] = job.n_past
                    batch.n_seq_id[n] = 1
                    batch.seq_id[n][0] = job.seq
                    batch.logits[n] = 1
                    sample_at.append((job, n))
                    n += 1
            prefilled: list[tuple[_Job, int]] = []
            budget = self._prefill_budget(len(generating))
            for job in active:
                remaining = len(job.tokens) - job.n_past
                if remaining <= 0 or budget <= 0:
                    continue
                take = min(remaining, budget)
                budget -= take
                for k in range(take):
                    batch.token[n] = job.tokens[job.n_past + k]
                    batch.pos[n] = job.n_past + k
                    batch.n_seq_id[n] = 1
                    batch.seq_id[n][0] = job.seq
                    batch.logits[n] = 0
                    n += 1
                prefilled.append((job, take))
                if take == remaining:
                    batch.logits[n - 1] = 1
                    sample_at.append((job, n - 1))
            batch.n_tokens = n

            t0 = time.perf_counter()
            rc = llama_cpp.llama_decode(ctx, batch)
            self.stats.decode_time_s += time.perf_counter() - t0
            if rc != 0:
                with self._cond:
                    for job in active:
                        self._finish(job, "error", f"llama_decode failed with status {rc}")
                continue
            for job, take in prefilled:
                job.n_past += take
                self.stats.prompt_tokens += take
            for job in generating:
                job.n_past += 1

            finished: list[tuple[_Job, str]] = []
            for job, idx in sample_at:
                tok = fast.llama_sampler_sample(job.sampler, ctx, idx)
                if job.params.logprobs is not None and not self._is_eog(tok):
                    job.pending_logprobs.append(self._logprob(ctx, idx, tok, job.params.logprobs))
                now = time.perf_counter()
                if job.first_token_at is None:
                    job.first_token_at = now
                    self.stats.ttft_sum_s += now - job.submitted_at
                    self.stats.ttft_count += 1
                eog = self._eog.get(tok)
                if eog is None:
                    eog = self._eog[tok] = bool(fast.llama_vocab_is_eog(vocab, tok))
                if eog:
                    finished.append((job, "stop"))
                    continue
                job.n_gen += 1
                self.stats.completion_tokens += 1
                job.last_token = tok
                job.generated.append(tok)
                piece = self._piece(tok)
                reason = self._append_text(job, job.decoder.decode(piece))
                if reason is None and job.n_gen >= job.max_tokens:
                    reason = "length"
                if reason is not None:
                    finished.append((job, reason))
            if finished:
                with self._cond:
                    for job, reason in finished:
                        self._finish(job, reason)

    def _prefill_budget(self, generating: int) -> int:
        """Prompt tokens to decode this step: all that fit when nobody is waiting for tokens,
        a bounded chunk when other streams are generating, so their tokens keep flowing."""
        if generating == 0:
            return self.n_batch
        return max(0, min(self.n_batch - generating, PREFILL_CHUNK_BUSY))

    def _kv_used(self) -> int:
        return sum(j.n_past for j in self._active) + sum(len(c) for c in self._seq_cache.values())

    def _evict_idle(self, need: int) -> None:
        """Drop cached prefixes of idle sequences, largest first, until ``need`` cells are free."""
        llama_cpp = _init_backend()
        for seq, cached in sorted(self._seq_cache.items(), key=lambda kv: -len(kv[1])):
            if self.kv_total - self._kv_used() >= need:
                return
            if cached:
                llama_cpp.llama_memory_seq_rm(self._ctx.memory, seq, -1, -1)
                self._seq_cache[seq] = []

    def _room_for(self, need: int) -> bool:
        if self.kv_total - self._kv_used() < need:
            self._evict_idle(need)
        # With nothing running, the oldest request always gets in (a prompt is < n_ctx).
        return not self._active or self.kv_total - self._kv_used() >= need

    def _make_room(self, active: list[_Job]) -> list[_Job]:
        """Ensure the next step fits the KV pool, preempting the newest sequences if needed.

        A preempted request keeps its sampler and text; its generated tokens join its prompt
        and it waits at the head of the queue, so its stream pauses and later resumes.
        """
        llama_cpp = _init_backend()

        def step_need(jobs: list[_Job]) -> int:
            generating = sum(1 for j in jobs if j.n_past >= len(j.tokens))
            budget, need = self._prefill_budget(generating), generating
            for j in jobs:
                remaining = len(j.tokens) - j.n_past
                if remaining > 0 and budget > 0:
                    take = min(remaining, budget)
                    need += take
                    budget -= take
            return need

        need = step_need(active)
        if self.kv_total - self._kv_used() >= need:
            return active
        with self._cond:
            self._evict_idle(need)
            while len(self._active) > 1 and self.kv_total - self._kv_used() < step_need(self._active):
                job = self._active.pop()
                llama_cpp.llama_memory_seq_rm(self._ctx.memory, job.seq, -1, -1)
                self._seq_cache[job.seq] = []
                self._free_seqs.append(job.seq)
                job.seq = -1
                job.tokens = job.tokens + job.generated
                job.generated = []
                job.n_past = 0
                self._pending.appendleft(job)
            return list(self._active)

    def _assign_seq(self, job: _Job) -> None:
        """Give the job the idle sequence whose cached tokens share the longest prefix with its prompt."""
        llama_cpp = _init_backend()
        best, best_len = self._free_seqs[-1], -1
        for seq in self._free_seqs:
            cached = self._seq_cache.get(seq, [])
            n = 0
            for a, b in zip(cached, job.tokens, strict=False):
                if a != b:
                    break
                n += 1
            if n > best_len:
                best, best_len = seq, n
        self._free_seqs.remove(best)
        # At least one prompt token is decoded again: its logits give the first sample. With
        # micro-batches under EXACT_UBATCH the reused prefix holds exactly the KV a fresh
        # prefill would compute, so reuse never changes an output.
        keep = min(best_len, len(job.tokens) - 1) if self.cache_prompt else 0
        if keep > 0 and llama_cpp.llama_memory_seq_rm(self._ctx.memory, best, keep, -1):
            job.n_past = keep
        else:
            llama_cpp.llama_memory_seq_rm(self._ctx.memory, best, -1, -1)
            job.n_past = 0
        self._seq_cache.pop(best, None)
        job.seq = best

    def _is_eog(self, tok: int) -> bool:
        eog = self._eog.get(tok)
        if eog is None:
            eog = self._eog[tok] = bool(_fast_calls().llama_vocab_is_eog(self._model.vocab, tok))
        return eog

    def _logprob(self, ctx: Any, idx: int, tok: int, top: int) -> TokenLogprob:
        """log-softmax of the raw logits at batch row ``idx`` (before bias, penalties, grammar
        and temperature: the model's own distribution), for ``tok`` and the ``top`` likeliest."""
        llama_cpp = _init_backend()
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, idx), shape=(self.n_vocab,))
        peak = float(logits.max())
        lse = peak + math.log(float(np.exp(logits - peak).sum()))
        alternatives: list[tuple[int, bytes, float]] = []
        if top > 0:
            best = np.argpartition(logits, -top)[-top:]
            best = best[np.argsort(-logits[best], kind="stable")]
            alternatives = [(int(t), self._piece(int(t)), float(logits[t]) - lse) for t in best]
        return TokenLogprob(tok, self._piece(tok), float(logits[tok]) - lse, alternatives)

    def _piece(self, tok: int) -> bytes:
        piece = self._pieces.get(tok)
        if piece is not None:
            return piece
        fast = _fast_calls()
        n = fast.llama_token_to_piece(self._model.vocab, tok, self._piece_buf, 256, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = fast.llama_token_to_piece(self._model.vocab, tok, buf, -n, 0, False)
            piece = bytes(buf.raw[:n])
        else:
            piece = bytes(self._piece_buf.raw[:n])
        self._pieces[tok] = piece
        return piece

    @staticmethod
    def _append_text(job: _Job, delta: str) -> str | None:
        """Add decoded text; emit what can no longer become a stop string. Returns "stop" on a match."""
        stops = job.params.stop
        if not delta:
            return None
        start = max(0, len(job.text) - max((len(s) for s in stops), default=0))
        job.text += delta
        if stops:
            found = [(i, s) for s in stops if s and (i := job.text.find(s, start)) >= 0]
            hit = min(found)[0] if found else -1
            if hit >= 0:
                job.stop_hit = min(found)[1]
                job.text = job.text[:hit]
                out = job.text[job.emitted :]
                job.emitted = len(job.text)
                if out:
                    job.push(TokenEvent(out, job.n_gen))
                return "stop"
            hold = 0
            for s in stops:
                for k in range(min(len(s) - 1, len(job.text)), 0, -1):
                    if job.text.endswith(s[:k]):
                        hold = max(hold, k)
                        break
            end = len(job.text) - hold
        else:
            end = len(job.text)
        if end > job.emitted:
            out = job.text[job.emitted : end]
            job.emitted = end
            job.push(TokenEvent(out, job.n_gen))
        return None

    # -- embeddings ----------------------------------------------------------------------
    def _embedding_context(self) -> Any:
        if self._emb_ctx is None:
            llama_cpp = _init_backend()
            from llama_cpp._internals import LlamaContext

            cparams = llama_cpp.llama_context_default_params()
            cparams.n_ctx = self.n_ctx
            cparams.n_batch = self.n_ctx
            # Decoders can be fed in micro-batches smaller than an input, which keeps the
            # compute buffers (and RSS) small; encoders need a whole input in one.
            cparams.n_ubatch = self.n_ctx if self.bidirectional else min(self.n_ctx, 512)
            cparams.n_seq_max = _EMBED_SEQS
            cparams.kv_unified = True
            cparams.n_threads = self.n_threads
            cparams.n_threads_batch = self.n_threads_batch
            cparams.embeddings = True
            cparams.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_MEAN
            cparams.no_perf = True
            self._emb_ctx = LlamaContext(model=self._model, params=cparams, verbose=False)
            self._emb_batch = llama_cpp.llama_batch_init(self.n_ctx, 0, 1)
        return self._emb_ctx

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        llama_cpp = _init_backend()
        for toks in inputs:
            if len(toks) > self.n_ctx:
                raise ContextLengthExceeded(len(toks), self.n_ctx)
        out: list[list[float]] = [[] for _ in inputs]
        with self._emb_lock:
            ectx = self._embedding_context()
            batch = self._emb_batch
            i = 0
            while i < len(inputs):
                # Pack as many inputs as fit into one decode: one sequence id each.
                group: list[int] = []
                n = 0
                while i < len(inputs) and len(group) < _EMBED_SEQS and (
                    not group or n + max(1, len(inputs[i])) <= _EMBED_BATCH_TOKENS
                ):
                    toks = inputs[i] or [self._model.token_bos()]
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
                if self.has_encoder and not self.has_decoder:
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


_EMBED_SEQS = 32
# Tokens packed into one embedding decode (a longer input goes alone). llama.cpp keeps a logits
# row per token even when only embeddings are read, so this bounds that buffer's resident size.
_EMBED_BATCH_TOKENS = 256

# Largest micro-batch: ggml's CPU flash attention takes its tiled path from 64 query rows
# (GGML_FA_TILE_Q), and that path's results depend on the batch split and the KV cell layout.
EXACT_UBATCH = 63

# Prompt tokens decoded per step while other sequences are generating (chunked prefill): a long
# prompt then delays the running streams by one chunk at a time instead of all at once.
PREFILL_CHUNK_BUSY = 128
