"""safetensors -> ONNX export of encoder (embedding) models, for the onnxruntime engine.

Needs the optional ``onnx`` extra (torch, onnx, onnxruntime) plus transformers to build the
torch module; :func:`missing_dependencies` says what is absent so the route can answer 400.
The exported graph takes ``input_ids``, ``attention_mask`` and ``token_type_ids`` and returns
``last_hidden_state``; pooling and normalisation are done by the engine, as configured by the
checkpoint's ``modules.json``/``1_Pooling`` files, which are copied alongside.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("BertModel", "BertForMaskedLM")
REQUIRED = ("torch", "onnx", "onnxruntime", "transformers")
SIDE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "vocab.txt", "modules.json", "sentence_bert_config.json")


def missing_dependencies() -> list[str]:
    return [m for m in REQUIRED if importlib.util.find_spec(m) is None]


def export(model_dir: Path, out_dir: Path, *, opset: int = 17,
           progress: Callable[[dict[str, Any]], None] | None = None) -> Path:
    missing = missing_dependencies()
    if missing:
        raise RuntimeError(f"onnx export needs: {', '.join(missing)} (pip install 'conch[onnx]')")
    import torch
    from transformers import AutoModel

    if progress is not None:
        progress({"status": "exporting to onnx", "completed": 0, "total": 2})
    encoder = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32)
    encoder.eval()

    class Wrapped(torch.nn.Module):
        """Keyword arguments only: the encoder's positional order is not stable across releases."""

        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                token_type_ids=token_type_ids).last_hidden_state

    model = Wrapped().eval()
    seq = 8
    ids = torch.ones((1, seq), dtype=torch.long)
    mask = torch.ones((1, seq), dtype=torch.long)
    types = torch.zeros((1, seq), dtype=torch.long)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "model.onnx"
    dyn = {0: "batch", 1: "sequence"}
    with torch.no_grad():
        torch.onnx.export(
            model,
            (ids, mask, types),
            str(target),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={"input_ids": dyn, "attention_mask": dyn, "token_type_ids": dyn,
                          "last_hidden_state": dyn},
            opset_version=opset,
            dynamo=False,
        )
    for name in SIDE_FILES:
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, out_dir / name)
    if (model_dir / "1_Pooling").is_dir():
        shutil.copytree(model_dir / "1_Pooling", out_dir / "1_Pooling", dirs_exist_ok=True)
    if progress is not None:
        progress({"status": "exporting to onnx", "completed": 2, "total": 2})
    return target
