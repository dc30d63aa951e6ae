"""The same 128-token greedy generation through every API conch serves, side by side.

``/v1/chat/completions`` is the reference; ``/v1/completions`` (the chat template applied by
hand, so the model sees the same tokens), ``/v1/responses``, ``/v1/messages`` and ``/api/chat``
must each stay within 3 % of its tokens/s (they are translations over the same serving path),
and ``logprobs: true, top_logprobs: 5`` must cost at most 10 % of it. Requests are interleaved
in a new random order every round, so that drift and what the previous request left in the
KV cache hit every API alike; the median of the runs is reported.

Run alone with ``python benchmarks/inference_apis.py``; ``benchmarks/inference.py`` runs it too.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
TOKENS = 128
RUNS = 9
QUESTION = "Write a long story about a lighthouse keeper."
# The prompt SmolLM2's chat template renders for QUESTION (its default system prompt
# included), written out for the legacy completions route: every API then feeds the engine
# the same tokens and leaves the same cached prefix for the next request.
CHATML = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _requests() -> dict[str, tuple[str, dict[str, Any], Callable[[dict[str, Any]], int]]]:
    msgs = [{"role": "user", "content": QUESTION}]
    return {
        "/v1/chat/completions": ("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": TOKENS, "temperature": 0},
                                 lambda r: r["usage"]["completion_tokens"]),
        "/v1/completions": ("/v1/completions", {"model": MODEL, "prompt": CHATML, "max_tokens": TOKENS, "temperature": 0},
                            lambda r: r["usage"]["completion_tokens"]),
        "/v1/responses": ("/v1/responses", {"model": MODEL, "input": QUESTION, "max_output_tokens": TOKENS, "temperature": 0},
                          lambda r: r["usage"]["output_tokens"]),
        "/v1/messages": ("/v1/messages", {"model": MODEL, "messages": msgs, "max_tokens": TOKENS, "temperature": 0},
                         lambda r: r["usage"]["output_tokens"]),
        "/api/chat": ("/api/chat", {"model": MODEL, "messages": msgs, "stream": False,
                                    "options": {"num_predict": TOKENS, "temperature": 0}},
                      lambda r: r["eval_count"]),
        "chat, logprobs top 5": ("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": TOKENS, "temperature": 0,
                                                          "logprobs": True, "top_logprobs": 5},
                                 lambda r: r["usage"]["completion_tokens"]),
    }


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of the server process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(base: str, pid: int) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Per API: median tokens/s (wall), the median over rounds of its ratio to chat in the same
    round, and tokens per CPU-second of the server (what the API itself costs, unmoved by other
    load on a shared machine)."""
    reqs = _requests()
    rates: dict[str, list[float]] = {name: [] for name in reqs}
    per_cpu: dict[str, list[float]] = {name: [] for name in reqs}
    with httpx.Client(base_url=base, timeout=300) as c:
        for path, body, _count in reqs.values():  # warm up: model load, prefix cache
            c.post(path, json=body).raise_for_status()
        names = list(reqs)
        order = random.Random(7)
        for _ in range(RUNS):
            # A new order every round: a request right after one with another prompt decodes
            # ~10 % slower, whatever its API (its KV cells land further along the shared
            # cache, and every step attends over the longer span). A fixed cycle would always
            # charge whatever one request leaves behind to the same neighbour.
            order.shuffle(names)
            for name in names:
                path, body, count = reqs[name]
                cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
                resp = c.post(path, json=body)
                elapsed, cpu = time.perf_counter() - t0, _cpu_seconds(pid) - cpu0
                resp.raise_for_status()
                rates[name].append(count(resp.json()) / elapsed)
                per_cpu[name].append(count(resp.json()) / max(cpu, 1e-3))
    ref = rates["/v1/chat/completions"]
    ratios = {name: statistics.median(r / c for r, c in zip(v, ref, strict=True)) for name, v in rates.items()}
    return ({name: statistics.median(v) for name, v in rates.items()}, ratios,
            {name: statistics.median(v) for name, v in per_cpu.items()})


def start_conch() -> tuple[str, subprocess.Popen[bytes], tempfile.TemporaryDirectory[str]]:
    port = _free_port()
    data = tempfile.TemporaryDirectory()
    env = {"CONCH_CACHE_PROMPT": "true", **os.environ, "CONCH_DATA_DIR": data.name, "CONCH_N_CTX": "2048", "CONCH_MODELS_PORT": str(port),
           "PYTHONPATH": str(ROOT / "src")}
    code = ("import uvicorn; from conch.config import load_settings; from conch.web.inference.app import create_app; "
            "s = load_settings(); uvicorn.run(create_app(s), host='127.0.0.1', port=s.models_port, log_level='warning')")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"conch exited with {proc.returncode}")
        try:
            if httpx.get(base + "/v1/health", timeout=2).status_code == 200:
                return base, proc, data
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("conch did not start")


def main() -> None:
    print(f"\n{TOKENS}-token greedy generation through each API (median of {RUNS}, interleaved)")
    base, proc, data = start_conch()
    try:
        rates, ratios, per_cpu = bench(base, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        data.cleanup()
    cpu_ref = per_cpu["/v1/chat/completions"]
    print(f"  {'API':28}{'tokens/s':>10}{'vs chat':>10}{'tok/CPU-s':>11}{'vs chat':>10}  target")
    for name, tps in rates.items():
        target = "(reference)" if name == "/v1/chat/completions" else (">= 0.90x" if "logprobs" in name else ">= 0.97x")
        print(f"  {name:28}{tps:>10.1f}{ratios[name]:>9.3f}x{per_cpu[name]:>11.1f}{per_cpu[name] / cpu_ref:>9.3f}x  {target}")


if __name__ == "__main__":
    main()
