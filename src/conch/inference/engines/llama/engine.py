"""The llama.cpp engine (GGUF models): one model, one context, several sequences decoded together.

:class:`LlamaEngine` implements the :class:`~conch.inference.engines.base.Engine` protocol and
puts together the parts, each in its own module: ``backend`` (start-up), ``scheduler``
(continuous batching on a worker thread), ``kv_pool`` (the shared KV cache and prefix reuse),
``sampling`` (sampler chains, stop strings), ``speculative`` and ``draft_model`` (drafted
tokens), ``templates`` and ``grammar`` (chat prompts and their constraints), ``embeddings``
and ``footprint`` (the memory it takes).

The context is llama-server's at its defaults: the model's training context (``n_ctx`` 0) as
one KV pool shared by every sequence, any one of which may fill it. On the CPU prompts are
decoded in llama-server's micro-batches of 512 rows; decode steps and verified drafts run on
ggml's reference kernels (``backend.ReferenceKernels``), so a token's logits do not depend on
what else its step held. ``batch_invariant`` keeps every micro-batch under 64 rows, and then
every token's logits are bitwise the same however its prompt was split or reused
(docs/inference.md, "Prefill and prefix reuse").
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from conch.inference.engines.base import (
    ChatInputError,
    ChatPrompt,
    ChatSpec,
    ContextLengthExceeded,
    EngineError,
    EngineStats,
    Generation,
    SamplingParams,
    Unsupported,
)
from conch.inference.engines.llama import sampling
from conch.inference.engines.llama.backend import (
    fast_calls,
    init_backend,
    llama_log,
    open_context,
    open_model,
    reference_kernels,
    release_openmp_threads,
)
from conch.inference.engines.llama.device import math_threads
from conch.inference.engines.llama.draft_model import DraftModel, check_same_vocab
from conch.inference.engines.llama.embeddings import Embedder
from conch.inference.engines.llama.footprint import (
    Footprint,
    buffers_from_log,
    default_context,
    resolve_n_ctx,
)
from conch.inference.engines.llama.grammar import plan_constraints
from conch.inference.engines.llama.offload import (
    Placement,
    RuntimeOptions,
    cpu_attention,
    load_placed,
    read_shape,
)
from conch.inference.engines.llama.prompt_cache import PromptCache
from conch.inference.engines.llama.scheduler import Scheduler
from conch.inference.engines.llama.templates import DEFAULT_CHATML, ChatTemplate
from conch.inference.engines.llama.vision import Projector
from conch.inference.engines.tool_calls import render_messages

log = logging.getLogger(__name__)


_FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type
_KV_TYPES = {"f16": 1, "q8_0": 8}  # ggml_type


class LlamaEngine:
    def __init__(
        self,
        model_id: str,
        path: str,
        *,
        n_ctx: int = 0,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        n_parallel: int = 4,
        cache_prompt: bool = True,
        n_batch: int | None = None,
        max_queue: int = 64,
        draft_max: int = 32,
        chat_template: str | None = None,
        runtime: RuntimeOptions | None = None,
        prompt_cache_dir: str | os.PathLike[str] | None = None,
        prompt_cache_max_bytes: int = 0,
        prompt_cache_min_tokens: int = 256,
        mmproj: str | None = None,
    ) -> None:
        self.model_id = model_id
        self.path = path
        self._n_ctx_req = n_ctx
        # One thread per physical core for decoding and for prompts, as llama-server chooses
        # (docs/inference.md, "Defaults"): llama-cpp-python's half of the logical CPUs left one
        # of a 2-core VM's cores idle and decoded at half llama-server's speed.
        self.n_threads = n_threads or math_threads()
        self.n_threads_batch = n_threads_batch or self.n_threads
        # Threads set by hand are kept; the default ones are shared with the other models
        # generating at the same moment (device.CoreShare), on the CPU.
        self._threads_by_hand = bool(n_threads or n_threads_batch)
        self.cache_prompt = cache_prompt
        self.n_parallel = max(1, n_parallel)
        self.max_queue = max_queue
        self.draft_max = draft_max
        self._template_override = chat_template
        # The vision projector's GGUF (llama-server's --mmproj); None: text only.
        self.mmproj = mmproj
        self.projector: Projector | None = None
        # Long prompt prefixes saved across restarts (prompt_cache.py): off without a directory.
        self._prompt_cache_dir = prompt_cache_dir
        self._prompt_cache_max_bytes = prompt_cache_max_bytes
        self._prompt_cache_min_tokens = prompt_cache_min_tokens
        self.prompt_cache: PromptCache | None = None
        # The context: n_ctx (0: the model's training context), known once the model is open.
        self.n_ctx = n_ctx
        # What the loaded model takes (footprint.py): measured at load, None before.
        self.footprint: Footprint | None = None
        self.n_embd = 0
        self.n_vocab = 0
        self.stats = EngineStats()
        # GPU offload, flash attention, KV cache type, micro-batch (conch.inference.engines.llama.offload)
        flash_attn, n_ubatch = cpu_attention("auto", False)
        self.runtime = runtime or RuntimeOptions(0, 0, flash_attn, "f16", n_ubatch, n_ctx, False)
        # Prompt tokens per step: the runtime's (2048 on a GPU, 512 on the CPU) unless given.
        self.n_batch = n_batch or self.runtime.n_batch
        self.n_ubatch = min(self.n_batch, self.runtime.n_ubatch)
        self.placement: Placement | None = None

        self._model: Any = None
        self._ctx: Any = None
        # The draft model (model_overrides.ID.draft_model) and its context, when drafting with one.
        self._draft_model: Any = None
        self._draft_ctx: Any = None
        self.scheduler: Scheduler | None = None
        self._embedder: Embedder | None = None
        self._template: ChatTemplate | None = None
        self._bos_text = ""
        self._add_bos = False

    # -- lifecycle -----------------------------------------------------------------------
    def load(self) -> None:
        opts = self.runtime
        if opts.draft_model:
            self._check_draft_model()
        if opts.kv_cache_type != "f16" and opts.flash_attn == "off":
            raise EngineError(f'kv_cache_type = "{opts.kv_cache_type}" needs flash_attn = "auto" or "on": '
                              "llama.cpp quantizes the V cache only with flash attention")
        kv_tokens = self._n_ctx_req
        if kv_tokens <= 0 and not opts.on_gpu:
            # The training context unless model and KV would not fit the machine's memory, as
            # llama-server's --fit (footprint.default_context); a loader with a memory budget
            # passes its own n_ctx.
            kv_tokens = self._n_ctx_req = default_context(self.path, opts, n_seqs=self.n_parallel,
                                                          draft_max=self.draft_max)
        elif kv_tokens <= 0:  # the training context, for the GPU fit plan
            shape = read_shape(self.path)
            kv_tokens = resolve_n_ctx(0, shape.n_ctx_train if shape is not None else 0)
        try:
            # As many layers on the GPU as fit; fewer (down to none) when llama.cpp cannot allocate.
            _, self.placement = load_placed(self.model_id, self.path, opts, kv_tokens, self._load_with,
                                            with_draft=bool(opts.draft_model and self.draft_max))
        finally:
            # Loading may have computed on this thread; only the decode worker keeps OpenMP threads.
            release_openmp_threads()

    def _load_with(self, n_gpu_layers: int) -> None:
        """Load the model and its contexts with ``n_gpu_layers`` on the GPU; on failure free them."""
        try:
            self._load_at(n_gpu_layers)
        except Exception:
            self.unload()
            raise

    def _load_at(self, n_gpu_layers: int) -> None:
        llama_cpp = init_backend()
        self._model = model = open_model(self.path, n_gpu_layers=n_gpu_layers, main_gpu=self.runtime.main_gpu)
        # As llama-server: the training context unless one is asked for, never more.
        self.n_ctx = resolve_n_ctx(self._n_ctx_req, int(model.n_ctx_train()))
        has_decoder = bool(llama_cpp.llama_model_has_decoder(model.model))
        has_encoder = bool(llama_cpp.llama_model_has_encoder(model.model))
        self.n_embd = model.n_embd()
        self.n_vocab = model.n_vocab()
        self._add_bos = model.add_bos_token()

        meta = model.metadata()
        self._bos_text = self._token_text(model.token_bos())
        self._template = ChatTemplate(
            self._template_override or meta.get("tokenizer.chat_template") or DEFAULT_CHATML,
            bos_token=self._bos_text, eos_token=self._token_text(model.token_eos()),
        )

        from conch.inference.models.gguf_info import EMBEDDING_ARCHITECTURES

        # Encoders (BERT family) attend both ways: embeddings only, and a whole input per micro-batch.
        bidirectional = meta.get("general.architecture") in EMBEDDING_ARCHITECTURES or (has_encoder and not has_decoder)
        self._embedder = Embedder(
            model, n_ctx=self.n_ctx, n_embd=self.n_embd, n_threads=self.n_threads,
            n_threads_batch=self.n_threads_batch, bidirectional=bidirectional,
            encoder_only=has_encoder and not has_decoder,
        )
        weights = int(model.size())
        kv_bytes = compute = 0
        if has_decoder and not has_encoder and not bidirectional:
            # One KV pool shared by all sequences (unified), as llama-server's: n_ctx cells, and
            # any sequence may grow to all of them. Short chats fit many at once; when the pool
            # runs out, the newest sequence is preempted and replayed later.
            kv_total = self.n_ctx
            with llama_log() as lines:
                self._ctx = open_context(model, **self._context_params(kv_total))
            kv_bytes, compute = buffers_from_log(lines)
            draft = self._open_draft(n_gpu_layers, kv_total) if self.runtime.draft_model and self.draft_max else None
            if self._draft_model is not None:
                weights += int(self._draft_model.size())
            # ggml's reference kernels for small steps, where they make a token's logits
            # independent of the rest of its step (backend.ReferenceKernels); None: not found.
            on_cpu = n_gpu_layers == 0 or not self.runtime.gpu_backend
            kernels = reference_kernels(self._ctx.ctx) if on_cpu else None
            if kernels is None and not self.runtime.on_gpu:
                log.info("model %s: ggml's reference kernels not found; decode steps use the fast ones "
                         "(drafting keeps greedy output only up to near-ties)", self.model_id)
            self.scheduler = Scheduler(
                model, self._ctx, name=self.model_id, n_batch=self.n_batch, n_parallel=self.n_parallel,
                kv_total=kv_total, max_queue=self.max_queue, cache_prompt=self.cache_prompt, stats=self.stats,
                draft_max=self.draft_max, draft=draft, n_ubatch=self.n_ubatch,
                prefill_chunk=self.runtime.prefill_chunk,
                overlap_text=self._decode_is_queued(n_gpu_layers),
                kernels=kernels, batch_invariant=self.runtime.batch_invariant,
                threads=None if self._threads_by_hand or not on_cpu else (self.n_threads, self.n_threads_batch),
            )
            self.scheduler.pool.disk = self.prompt_cache = self._open_prompt_cache(n_gpu_layers, kv_total)
            if self.mmproj:
                self.projector = Projector(
                    self.mmproj, model.model, n_threads=self.n_threads_batch,
                    use_gpu=bool(n_gpu_layers and self.runtime.gpu_backend))
                self.scheduler.projector = self.projector
            self.scheduler.start()
        self.footprint = Footprint(weights, kv_bytes, compute, self.n_ctx, measured=True)

    def _decode_is_queued(self, n_gpu_layers: int) -> bool:
        """Whether llama_decode returns before the step is computed: every layer and the output
        on the GPU (llama.cpp offloads the output layer from n_layer + 1 on). Any layer on the
        CPU computes inside the call."""
        if not self.runtime.gpu_backend or n_gpu_layers == 0:
            return False
        return n_gpu_layers < 0 or n_gpu_layers > int(init_backend().llama_model_n_layer(self._model.model))

    def _context_params(self, kv_total: int) -> dict[str, Any]:
        return {
            "n_ctx": kv_total,
            "n_batch": self.n_batch,
            # 512 on a GPU, as llama-server; 63 on the CPU (conch.inference.engines.llama.offload).
            "n_ubatch": self.n_ubatch,
            "flash_attn_type": _FLASH_ATTN[self.runtime.flash_attn],
            "type_k": _KV_TYPES[self.runtime.kv_cache_type],
            "type_v": _KV_TYPES[self.runtime.kv_cache_type],
            "n_seq_max": self.n_parallel,
            "n_threads": self.n_threads,
            "n_threads_batch": self.n_threads_batch,
            "kv_unified": True,
            "no_perf": True,
        }

    def _draft_error(self, why: str) -> EngineError:
        return EngineError(f"model_overrides.{self.model_id}.draft_model = {self.runtime.draft_model!r}: {why}")

    def _check_draft_model(self) -> None:
        """Before anything loads: the draft model exists and shares this model's vocabulary
        (both files opened vocabulary only), so a wrong setting fails once, not per GPU retry."""
        path = self.runtime.draft_path
        if path is None:
            raise self._draft_error("no ready local GGUF model has that id (conch models list shows them)")
        llama_cpp = init_backend()
        from llama_cpp._internals import LlamaModel

        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        target = draft = None
        try:
            target = LlamaModel(path_model=self.path, params=params, verbose=False)
            try:
                draft = LlamaModel(path_model=path, params=params, verbose=False)
            except Exception as exc:
                raise self._draft_error(f"its file {path} could not be opened ({exc})") from exc
            try:
                check_same_vocab(target, draft, name=str(self.runtime.draft_model))
            except EngineError as exc:
                raise self._draft_error(str(exc)) from None
        finally:
            for m in (draft, target):
                if m is not None:
                    m.close()

    def _open_draft(self, n_gpu_layers: int, kv_total: int) -> DraftModel:
        """The draft model with a context shaped as the target's (same cells, sequences,
        micro-batch, threads and GPU layers), for speculative drafts (draft_model.py)."""
        path = self.runtime.draft_path
        assert path is not None  # _check_draft_model
        self._draft_model = open_model(path, n_gpu_layers=n_gpu_layers, main_gpu=self.runtime.main_gpu)
        check_same_vocab(self._model, self._draft_model, name=str(self.runtime.draft_model))
        self._draft_ctx = open_context(self._draft_model, **self._context_params(kv_total))
        vocab = self._model.vocab

        def is_eog(tok: int) -> bool:
            return bool(fast_calls().llama_vocab_is_eog(vocab, tok))

        return DraftModel(self._draft_model, self._draft_ctx, name=str(self.runtime.draft_model),
                          n_batch=self.n_batch, is_eog=is_eog)

    def _open_prompt_cache(self, n_gpu_layers: int, kv_total: int) -> PromptCache | None:
        if self._prompt_cache_dir is None or self._prompt_cache_max_bytes <= 0 or not self.cache_prompt:
            return None
        opts = self.runtime
        # What makes a saved state foreign besides the model file (prompt_cache.py): a state
        # computed with other micro-batches, threads or on another device need not match bit
        # for bit what this context computes (greedy outputs differ between 1 and 2 threads).
        config = {
            "n_ctx": self.n_ctx, "kv_total": kv_total, "kv_cache_type": opts.kv_cache_type,
            "flash_attn": opts.flash_attn, "n_batch": self.n_batch, "n_ubatch": self.n_ubatch,
            "n_gpu_layers": n_gpu_layers,
            "n_threads": self.n_threads, "n_threads_batch": self.n_threads_batch,
        }
        try:
            return PromptCache(
                Path(self._prompt_cache_dir), model_id=self.model_id, model_path=self.path, config=config,
                max_bytes=self._prompt_cache_max_bytes, min_tokens=self._prompt_cache_min_tokens, stats=self.stats,
            )
        except OSError as exc:
            log.warning("prompt cache of %s disabled: %s", self.model_id, exc)
            return None

    def unload(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
            self.scheduler = None
        if self.prompt_cache is not None:
            self.prompt_cache.close()  # the saves under way finish
            self.prompt_cache = None
        if self.projector is not None:
            self.projector.close()
            self.projector = None
        # The contexts before the model they were made from.
        for part in (self._draft_ctx, self._draft_model, self._embedder, self._ctx, self._model):
            if part is not None:
                part.close()
        self._embedder = self._ctx = self._model = self._draft_ctx = self._draft_model = None
        self.placement = None
        self.footprint = None

    @property
    def capabilities(self) -> frozenset[str]:
        if self.scheduler is None:
            return frozenset(("embeddings",))
        return frozenset(("chat", "embeddings", "vision") if self.projector is not None else ("chat", "embeddings"))

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def active_sequences(self) -> int:
        return self.scheduler.active_sequences if self.scheduler is not None else 0

    @property
    def queued(self) -> int:
        return self.scheduler.queued if self.scheduler is not None else 0

    @property
    def busy(self) -> bool:
        return self.scheduler is not None and self.scheduler.busy

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

    def check_grammar(self, grammar: str) -> bool:
        """Whether llama.cpp accepts this GBNF grammar (checked before a request is queued)."""
        return sampling.grammar_accepted(self._model.vocab, grammar)

    # -- generation --------------------------------------------------------------------------
    def text_prompt(self, text: str) -> list[int]:
        """A legacy completion's prompt: special tokens parsed, as llama-server does."""
        return self.prompt_tokens(text)

    def fim_prompt(self, prefix: str, suffix: str) -> list[int]:
        """Prefix-suffix-middle order, as llama-server's /infill builds it."""
        llama_cpp = init_backend()
        vocab = self._model.vocab
        pre, suf, mid = (
            int(f(vocab))
            for f in (llama_cpp.llama_vocab_fim_pre, llama_cpp.llama_vocab_fim_suf, llama_cpp.llama_vocab_fim_mid)
        )
        if min(pre, suf, mid) < 0:
            raise Unsupported(
                f"The model '{self.model_id}' has no fill-in-the-middle tokens, so 'suffix' cannot be used"
            )
        bos = int(self._model.token_bos())
        head = [bos] if self._add_bos and bos >= 0 else []
        return [*head, pre, *self.tokenize(prefix, add_bos=False), suf, *self.tokenize(suffix, add_bos=False), mid]

    def chat_prompt(self, spec: ChatSpec) -> ChatPrompt:
        if self.scheduler is None:
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
        if not spec.images:
            return ChatPrompt(self.prompt_tokens(prompt), spec.sampling)
        if self.projector is None:
            raise ChatInputError(
                f"The model '{self.model_id}' has no vision projector (mmproj), so it cannot read images "
                "(docs/inference.md, \"Images\")", spec.images[0].where)
        add_bos = self._add_bos and not (self._bos_text and prompt.startswith(self._bos_text))
        media = self.projector.prompt(prompt, spec.images, add_special=add_bos)
        return ChatPrompt(media.tokens, spec.sampling, media)

    def generate(self, prompt: str | list[int], params: SamplingParams, *, media: Any = None) -> Generation:
        if self.scheduler is None:
            raise Unsupported(f"The model '{self.model_id}' cannot generate text (it has no decoder)")
        tokens = self.prompt_tokens(prompt) if isinstance(prompt, str) else list(prompt)
        if media is not None and tokens != media.tokens:
            raise EngineError("the prompt's tokens are not its images' prompt")
        if not tokens:
            raise EngineError("the prompt is empty")
        if len(tokens) >= self.n_ctx:
            raise ContextLengthExceeded(len(tokens), self.n_ctx)
        room = self.n_ctx - len(tokens)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        return self.scheduler.submit(tokens, params, max_tokens, media=media)

    # -- embeddings ----------------------------------------------------------------------
    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        if self._embedder is None:
            raise EngineError("model is not loaded")
        return self._embedder.embed(inputs)
