"""The prompt cache across restarts: time to first token of a long-system-prompt request on a
freshly started server, cold against restored from ``<data_dir>/kv-cache``.

Per round: a server on a new data directory (cold: the ~1,500-token system prompt is prefilled,
then saved when the request ends), stopped; a server on the same directory (restarted: the
prefix is loaded from disk). Each server first answers a short request, so the model is loaded
before the timed one. Greedy, the bundled SmolLM2-135M, 16 tokens. Reported: median TTFT of
each, the restored one over the cold one (target ≤ 0.25x), the restored tokens (/metrics), and
whether both outputs are the same text.

    python benchmarks/prompt_cache.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serving

WORDS = ["the", "a", "lighthouse", "keeper", "sea", "storm", "ship", "night", "lamp", "old", "boat", "rope",
         "cliff", "gull", "wave", "fog", "harbour", "signal", "tide", "north"]
_rng = random.Random(1)
# A system prompt of ~1,500 tokens: an assistant's brief followed by notes (sentences of random
# words); the question asks for an answer, so the first token is text, not the end.
SYSTEM = "You are a helpful assistant for a lighthouse keeper. Notes from the log book:\n" + "\n".join(
    " ".join(_rng.choice(WORDS) for _ in range(11)).capitalize() + "." for _ in range(120))
QUESTION = "Write one sentence about the sea."


async def _chat(url: str, model: str, system: str | None, prompt: str) -> tuple[dict[str, Any], str]:
    """The request streamed and timed, then its text (the same request again, not streamed:
    greedy, so the same tokens, its prefix from memory this time)."""
    payload = serving.body(model, prompt, 16, system=system)
    async with httpx.AsyncClient(timeout=900) as client:
        rec = await serving.one(client, url, payload)
        plain = {k: v for k, v in payload.items() if k != "stream_options"} | {"stream": False}
        r = await client.post(url + "/v1/chat/completions", json=plain)
    return rec, r.json()["choices"][0]["message"]["content"]


def _serve_once(data: Path, work: Path, label: str) -> dict[str, Any]:
    port = serving.free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "CONCH_DATA_DIR": str(data), "CONCH_CONFIG": str(data / "none.toml")}
    cmd = [sys.executable, "-m", "conch.cli.main", "models", "serve", "--port", str(port)]
    with serving.server(cmd, env, f"{url}/v1/models", work / f"conch-{label}.log"):
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        asyncio.run(_chat(url, model, None, "Hello"))  # loads the model
        rec, text = asyncio.run(_chat(url, model, SYSTEM, QUESTION))
        metrics = httpx.get(f"{url}/metrics").text
    m = re.search(r"^conch_inference_prompt_cache_restored_tokens_total (\S+)$", metrics, re.M)
    return {"ttft_s": rec["ttft_s"], "prompt_tokens": rec["prompt_tokens"], "error": rec["error"], "text": text,
            "restored": float(m.group(1)) if m else None}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv or [])  # from run.py: sys.argv holds suite names
    work = serving.CACHE / "prompt-cache-logs"
    work.mkdir(parents=True, exist_ok=True)
    cold, restored, same, tokens = [], [], [], []
    for i in range(a.rounds):
        data = Path(tempfile.mkdtemp(dir=work))
        c = _serve_once(data, work, f"cold{i}")
        r = _serve_once(data, work, f"restart{i}")
        for rec in (c, r):
            if rec["error"]:
                raise SystemExit(f"request failed: {rec['error']}")
        size = sum(f.stat().st_size for f in (data / "kv-cache").rglob("*.kv"))
        print(f"  round {i + 1}: cold {c['ttft_s'] * 1000:.1f} ms, after restart {r['ttft_s'] * 1000:.1f} ms "
              f"({r['restored']:.0f} of {r['prompt_tokens']} prompt tokens restored, {size / 1e6:.1f} MB on disk), "
              f"same text: {c['text'] == r['text']}", flush=True)
        if c["text"] != r["text"]:
            print(f"    cold: {c['text']!r}\n    after restart: {r['text']!r}", flush=True)
        cold.append(c["ttft_s"])
        restored.append(r["ttft_s"])
        same.append(c["text"] == r["text"])
        tokens.append(r["restored"])
    c_ms, r_ms = statistics.median(cold) * 1000, statistics.median(restored) * 1000
    ratio = r_ms / c_ms
    print("\n| TTFT, ~1,500-token system prompt, fresh server | median |")
    print("|---|---|")
    print(f"| cold (prefill) | {c_ms:,.1f} ms |")
    print(f"| after a restart (prefix from disk) | {r_ms:,.1f} ms |")
    print(f"| ratio | {ratio:.3f}x (target <= 0.25x: {'met' if ratio <= 0.25 else 'MISSED'}) |")
    print(f"\nsame output in every round: {all(same)}; restored tokens: {tokens}")


if __name__ == "__main__":
    main(sys.argv[1:])
