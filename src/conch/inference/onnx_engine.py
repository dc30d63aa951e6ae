"""Embeddings from an ONNX encoder export (``convert --to onnx``), run by onnxruntime.

The model directory holds ``model.onnx`` (inputs ``input_ids``, ``attention_mask``,
``token_type_ids``; output ``last_hidden_state``), ``tokenizer.json`` and, for
sentence-transformers checkpoints, ``modules.json`` and ``1_Pooling/config.json``, which say
how token vectors become one sentence vector (mean or CLS) and whether it is normalised.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np


class OnnxEmbeddingEngine:
    def __init__(self, model_dir: str | Path, *, n_threads: int | None = None, max_length: int = 512) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.model_dir = Path(model_dir)
        options = ort.SessionOptions()
        options.intra_op_num_threads = n_threads or (os.cpu_count() or 1)
        self.session = ort.InferenceSession(
            str(self.model_dir / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        config = _load(self.model_dir / "config.json")
        limit = int(config.get("max_position_embeddings") or max_length)
        self.tokenizer.enable_truncation(max_length=min(max_length, limit))
        self.tokenizer.enable_padding(pad_id=int(config.get("pad_token_id") or 0))
        self.pooling, self.normalize = _pooling(self.model_dir)

    def embed(self, texts: list[str], batch_size: int = 32) -> tuple[list[list[float]], int]:
        """Vectors for ``texts`` and the number of tokens they used."""
        out: list[list[float]] = []
        n_tokens = 0
        for i in range(0, len(texts), batch_size):
            encs = self.tokenizer.encode_batch(texts[i : i + batch_size])
            ids = np.array([e.ids for e in encs], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
            n_tokens += int(mask.sum())
            feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self.input_names:
                feeds["token_type_ids"] = np.array([e.type_ids for e in encs], dtype=np.int64)
            (hidden,) = self.session.run(["last_hidden_state"], feeds)
            if self.pooling == "cls":
                vecs = hidden[:, 0]
            else:
                m = mask[..., None].astype(hidden.dtype)
                vecs = (hidden * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
            if self.normalize:
                vecs = vecs / np.clip(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12, None)
            out.extend(v.astype(float).tolist() for v in vecs)
        return out, n_tokens


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


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
