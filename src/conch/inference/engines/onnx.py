"""Embeddings from an ONNX encoder export (``convert --to onnx``), run by onnxruntime.

The model directory holds ``model.onnx`` (inputs ``input_ids``, ``attention_mask``,
``token_type_ids``; output ``last_hidden_state``), ``tokenizer.json`` and, for
sentence-transformers checkpoints, ``modules.json`` and ``1_Pooling/config.json``, which say
how token vectors become one sentence vector (mean or CLS) and whether it is normalised.

It implements the :class:`~conch.inference.engines.base.Engine` protocol; it cannot generate
text, so ``chat_prompt`` and ``generate`` raise ``Unsupported``.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from conch.inference.engines.base import (
    ChatPrompt,
    ChatSpec,
    ContextLengthExceeded,
    EngineError,
    EngineStats,
    Generation,
    RuntimeMissing,
    SamplingParams,
    Unsupported,
)


class OnnxRuntimeMissing(RuntimeMissing):
    """The model is ONNX but onnxruntime (the ``onnx`` extra) is not installed."""


class OnnxEmbeddingEngine:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        model_id: str | None = None,
        n_threads: int | None = None,
        max_length: int = 512,
    ) -> None:
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise OnnxRuntimeMissing(
                f"serving ONNX models needs onnxruntime and tokenizers ({exc}); "
                "install the `onnx` extra: pip install 'conch[onnx]'"
            ) from exc

        path = Path(model_dir)
        # A downloaded ONNX model may name its graph file; a conversion writes a directory.
        onnx_file = path if path.is_file() else path / "model.onnx"
        self.model_dir = onnx_file.parent
        self.model_id = model_id or self.model_dir.name
        self.stats = EngineStats()
        options = ort.SessionOptions()
        options.intra_op_num_threads = n_threads or (os.cpu_count() or 1)
        self.session: Any = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        self.input_names = {i.name for i in self.session.get_inputs()}
        # No truncation: an over-long input is refused (ContextLengthExceeded), as llama.cpp
        # engines do, rather than embedded from its first n_ctx tokens without a word.
        self.tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        config = _load(self.model_dir / "config.json")
        limit = int(config.get("max_position_embeddings") or max_length)
        self.n_ctx = min(max_length, limit)
        self.pad_id = int(config.get("pad_token_id") or 0)
        # The embedding table's size, not the tokenizer's: ids past it crash the Gather op.
        self.n_vocab = int(config.get("vocab_size") or self.tokenizer.get_vocab_size(with_added_tokens=True))
        self.n_embd = _hidden_size(config, self.session)
        self.pooling, self.normalize = _pooling(self.model_dir)
        self._running = 0
        self._lock = threading.Lock()

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset(("embeddings",))

    def chat_prompt(self, spec: ChatSpec) -> ChatPrompt:
        raise Unsupported(f"The model '{self.model_id}' does not support chat")

    def generate(self, prompt: str | list[int], params: SamplingParams, *, media: Any = None) -> Generation:
        raise Unsupported(f"The model '{self.model_id}' cannot generate text (it is an ONNX embedding model)")

    def text_prompt(self, text: str) -> list[int]:
        raise Unsupported(f"The model '{self.model_id}' cannot generate text (it is an ONNX embedding model)")

    def detokenize(self, tokens: list[int]) -> str:
        raise Unsupported(f"The model '{self.model_id}' cannot generate text (it is an ONNX embedding model)")

    def fim_prompt(self, prefix: str, suffix: str) -> list[int]:
        raise Unsupported(f"The model '{self.model_id}' cannot generate text (it is an ONNX embedding model)")

    def unload(self) -> None:
        self.session = None

    @property
    def busy(self) -> bool:
        return self._running > 0

    @property
    def active_sequences(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        return 0

    # -- embeddings ------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Token ids with the model's special tokens ([CLS] ... [SEP]), as sentence-transformers feeds it."""
        return list(self.tokenizer.encode(text).ids)

    def embed(self, inputs: list[list[int]], batch_size: int = 32) -> list[list[float]]:
        """Pooled (and, if the model says so, normalised) vectors of tokenized inputs (blocking)."""
        for toks in inputs:
            if len(toks) > self.n_ctx:
                raise ContextLengthExceeded(len(toks), self.n_ctx)
        session = self.session
        if session is None:
            raise EngineError(f"model {self.model_id} is not loaded")
        with self._lock:
            self._running += 1
        try:
            out: list[list[float]] = []
            for i in range(0, len(inputs), batch_size):
                out.extend(self._embed_batch(session, inputs[i : i + batch_size]))
            return out
        finally:
            with self._lock:
                self._running -= 1

    def embed_texts(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """Vectors for ``texts`` and the number of tokens they used."""
        tokens = [self.tokenize(t) for t in texts]
        return self.embed(tokens), sum(len(t) for t in tokens)

    def _embed_batch(self, session: Any, batch: list[list[int]]) -> list[list[float]]:
        width = max(len(t) for t in batch)
        ids = np.full((len(batch), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, toks in enumerate(batch):
            ids[row, : len(toks)] = toks
            mask[row, : len(toks)] = 1
        feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        (hidden,) = session.run(["last_hidden_state"], feeds)
        if self.pooling == "cls":
            vecs = hidden[:, 0]
        else:
            m = mask[..., None].astype(hidden.dtype)
            vecs = (hidden * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
        if self.normalize:
            vecs = vecs / np.clip(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12, None)
        return [v.astype(float).tolist() for v in vecs]


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def _hidden_size(config: dict[str, Any], session: Any) -> int:
    if isinstance(config.get("hidden_size"), int):
        return int(config["hidden_size"])
    for out in session.get_outputs():
        if out.name == "last_hidden_state" and isinstance(out.shape[-1], int):
            return int(out.shape[-1])
    raise EngineError("cannot tell the embedding size: no hidden_size in config.json")


def _pooling(model_dir: Path) -> tuple[str, bool]:
    modules_path = model_dir / "modules.json"
    if not modules_path.is_file():
        return "mean", False
    modules = json.loads(modules_path.read_text())
    pooling, normalize = "mean", False
    for mod in modules:
        kind = str(mod.get("type", ""))
        if kind.endswith("Pooling"):
            cfg = _load(model_dir / str(mod.get("path", "")) / "config.json")
            if cfg.get("pooling_mode_cls_token") or cfg.get("pooling_mode") == "cls":
                pooling = "cls"
        elif kind.endswith("Normalize"):
            normalize = True
    return pooling, normalize
