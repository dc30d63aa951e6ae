"""A vision request's time to first token: conch against llama-server, same model, projector, image.

The model is the bundled SmolLM2 with the tiny random CLIP projector the tests build
(testsupport/tiny_mmproj.py: LLaVA's MLP projector, 16 image tokens); llama-server gets it
with ``--mmproj``. Each round sends a different image (so neither server reuses an image's
cells), streamed, greedy, 1 token; the median of the rounds is reported. Run on a quiet machine
for figures worth recording (docs/benchmarks.md).
"""

from __future__ import annotations

import base64
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 7


def _ttft(base: str, model: str, image: bytes) -> float:
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    body = {"model": model, "stream": True, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"}, {"type": "image_url", "image_url": {"url": url}}]}]}
    t0 = time.perf_counter()
    with httpx.Client(timeout=120) as c, c.stream("POST", base + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line and '"content":""' not in line:
                return time.perf_counter() - t0
    return time.perf_counter() - t0


def _rounds(base: str, model: str) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    from testsupport.tiny_mmproj import png_bytes

    _ttft(base, model, png_bytes(seed=999))  # warm-up
    times = [_ttft(base, model, png_bytes(64, 64, seed=i)) for i in range(ROUNDS)]
    return {"ttft_p50_ms": statistics.median(times) * 1000, "ttft_min_ms": min(times) * 1000}


def bench_conch(model_path: str, mmproj: Path, data: Path) -> dict[str, float]:
    import uvicorn

    sys.path.insert(0, str(ROOT / "src"))
    from serving import free_port

    from conch.config import Settings
    from conch.inference.models.bundled import ensure_bundled_model
    from conch.inference.models.store import ModelStore
    from conch.web.inference.app import create_app

    port = free_port()
    settings = Settings(data_dir=data, models_port=port)
    app = create_app(settings)
    store = ModelStore(settings)
    # The server registers the bundled model as it starts; the vision copy is made before.
    bundled = ensure_bundled_model(store)
    assert bundled is not None
    store.register(bundled.model_copy(update={"id": "smol-vision", "mmproj": str(mmproj)}))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        return _rounds(f"http://127.0.0.1:{port}", "smol-vision")
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def bench_llama_server(model_path: str, mmproj: Path, logs: Path) -> dict[str, float]:
    import serving

    binary = serving.build_llama_server()
    port = serving.free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [str(binary), "-m", model_path, "--mmproj", str(mmproj), "--port", str(port), "-a", "smol-vision"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    with serving.server(cmd, env, base + "/health", logs / "llama-server-vision.log"):
        return _rounds(base, "smol-vision")


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from conch.inference.models.bundled import find_bundled_gguf
    from testsupport.tiny_mmproj import write_random_mmproj

    model_path = str(find_bundled_gguf())
    with tempfile.TemporaryDirectory() as tmp:
        mmproj = write_random_mmproj(Path(tmp) / "mmproj-tiny-f32.gguf", text_embd=576)
        results: dict[str, Any] = {"conch": bench_conch(model_path, mmproj, Path(tmp) / "data")}
        try:
            results["llama-server"] = bench_llama_server(model_path, mmproj, Path(tmp))
        except Exception as exc:  # no llama-server built: conch's figure alone
            results["llama-server"] = {"error": str(exc)}
    print("vision TTFT (1 image, 16 image tokens; median of", ROUNDS, "rounds)")
    for name, r in results.items():
        print(f"  {name:13s} {r}")
    c, s = results["conch"], results["llama-server"]
    if "ttft_p50_ms" in s:
        print(f"  conch / llama-server p50: {c['ttft_p50_ms'] / s['ttft_p50_ms']:.2f}x (target <= 1.1x)")


if __name__ == "__main__":
    main()
