"""What the server benchmarks share: llama.cpp's ``llama-server``, a server process, a streaming load generator.

- ``build_llama_server``: llama.cpp's C++ server built once into ``.bench-cache/`` from the sdist
  of the llama-cpp-python version installed here (the same llama.cpp conch runs), on the CPU with
  the installed build's backend flags;
- ``server``: a server process, up until its readiness URL answers, stopped on exit;
- ``one``, ``sequential``, ``burst``, ``closed_loop``: streaming ``/v1/chat/completions``
  requests (temperature 0, ``stream_options.include_usage``), each timed: send, first token,
  last token, tokens;
- ``peak_rss_mb``: the peak resident memory of a process and its children (``VmHWM``).

Used by ``inference.py`` (the CPU comparison with llama-server) and ``gpu.py`` (the GPU one).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.metadata
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench-cache"


# -- llama-server, built from the installed llama-cpp-python's sdist ------------------------------

def llama_cpp_python_version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def installed_cmake_args() -> list[str]:
    """The CMake flags ``make`` built llama-cpp-python with when they are CPU flags (its state file).

    ``scripts/llama_build_flags.py`` records the build it chose in ``.venv/.llama-build-wanted``;
    the CPU build has none (llama.cpp's defaults: ``GGML_NATIVE``, OpenMP). A GPU backend's
    flags are left out: this llama-server is the CPU yardstick.
    """
    state = Path(sys.prefix) / ".llama-build-wanted"
    with contextlib.suppress(OSError, ValueError):
        want = json.loads(state.read_text())
        if want.get("backend") == "cpu":
            return str(want.get("cmake_args") or "").split()
    return []


def build_llama_server(version: str | None = None, cache: Path = CACHE, jobs: int = 2) -> Path:
    """Path of ``llama-server`` for llama-cpp-python ``version`` (default: the installed one).

    Built once (about 10 minutes on two cores) under ``cache/llama-server/<version>/``: the sdist
    is fetched with ``pip download``, ``vendor/llama.cpp`` configured for a CPU Release build and
    the ``llama-server`` target built; a binary already there is returned as it is. Raises
    ``RuntimeError`` saying why when that fails (the log is ``build.log`` beside it).
    """
    version = version or llama_cpp_python_version()
    work = cache / "llama-server" / version
    binary = work / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    work.mkdir(parents=True, exist_ok=True)
    with (work / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run building it: wait for that build
        if binary.exists():
            return binary
        return _build(version, work, binary, jobs)


def _build(version: str, work: Path, binary: Path, jobs: int) -> Path:
    log = work / "build.log"
    sdist = work / f"llama_cpp_python-{version}.tar.gz"
    src = work / f"llama_cpp_python-{version}"
    with log.open("a") as fh:
        if not sdist.exists():
            rc = subprocess.call([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                  f"llama-cpp-python=={version}", "-d", str(work)], stdout=fh, stderr=fh)
            if rc != 0 or not sdist.exists():
                raise RuntimeError(f"pip download of the llama-cpp-python {version} sdist failed; see {log}")
        if not (src / "vendor" / "llama.cpp" / "CMakeLists.txt").exists():
            with tarfile.open(sdist) as tar:
                tar.extractall(work, filter="data")
        for tool in ("cmake", "c++"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is not on PATH: cannot build llama-server")
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        t0 = time.time()
        print(f"  building llama-server {version} (CPU, Release, -j{jobs}); log: {log}", flush=True)
        rc = subprocess.call(["cmake", "-S", str(src / "vendor" / "llama.cpp"), "-B", str(work / "build"), *gen,
                              "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",  # as llama-cpp-python builds it
                              "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF", "-DGGML_HIP=OFF",
                              "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                              "-DLLAMA_BUILD_EXAMPLES=OFF",
                              # the web UI is fetched from the network by default
                              "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
                              *installed_cmake_args()], stdout=fh, stderr=fh)
        if rc == 0:
            rc = subprocess.call(["cmake", "--build", str(work / "build"), "-j", str(jobs), "--target", "llama-server"],
                                 stdout=fh, stderr=fh)
    if rc != 0 or not binary.exists():
        raise RuntimeError(f"building llama-server {version} failed; see {log}")
    print(f"  built llama-server in {time.time() - t0:.0f} s", flush=True)
    return binary


# -- a server process ---------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(cmd: list[str], env: dict[str, str], ready: str, log: Path,
           timeout_s: float = 300) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` (output to ``log``) until ``ready`` answers 200; terminate it on exit."""
    with log.open("ab") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=fh)
    try:
        deadline = time.time() + timeout_s
        while True:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
                raise RuntimeError(f"{Path(cmd[0]).name} exited with {proc.returncode} ({' '.join(tail)[:300]}); "
                                   f"see {log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready, timeout=2).status_code == 200:
                    break
            if time.time() > deadline:
                raise RuntimeError(f"{Path(cmd[0]).name} did not come up; see {log}")
            time.sleep(0.3)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def peak_rss_mb(pid: int) -> float | None:
    """Peak resident memory (``VmHWM``) of ``pid`` plus that of its live children, in MB."""
    total = 0
    pids = [pid]
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                pids += [int(c) for c in (task / "children").read_text().split()]
    for p in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
    return total / 1024 if total else None


# -- the load generator -----------------------------------------------------------------------------

def body(model: str, prompt: str, max_tokens: int, system: str | None = None, stop: bool = True) -> dict[str, Any]:
    """A streaming greedy chat request; ``stop``: with a stop string that never matches, as the CPU
    benchmark has always sent (every server then checks for stop strings alike)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    out: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                           "stream": True, "stream_options": {"include_usage": True}}
    if stop:
        out["stop"] = ["\u0000never"]
    return out


async def one(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> dict[str, Any]:
    """One streaming request, timed: ``ttft_s``, ``decode_tps``, ``tokens``, ``prompt_tokens``, ``error``."""
    rec: dict[str, Any] = {"t_send": time.time(), "t_first": None, "t_last": None, "tokens": None, "chunks": 0,
                           "prompt_tokens": None, "error": None, "text": ""}
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=payload) as r:
            if r.status_code != 200:
                rec["error"] = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return _finish(rec)
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line[6:].strip() == "[DONE]":
                    # left before the body's end: httpx closes the connection, so every request
                    # opens its own (llama-server at times drops a kept-alive connection just as
                    # the next request goes out on it); a loopback connect is ~0.1 ms, alike for all
                    break
                obj = json.loads(line[6:])
                if "error" in obj:
                    rec["error"] = str(obj["error"])[:300]
                if obj.get("usage"):
                    rec["tokens"] = obj["usage"].get("completion_tokens")
                    rec["prompt_tokens"] = obj["usage"].get("prompt_tokens")
                for ch in obj.get("choices") or []:
                    if content := (ch.get("delta") or {}).get("content"):
                        rec["text"] += content
                        now = time.time()
                        rec["t_first"] = rec["t_first"] or now
                        rec["t_last"] = now
                        rec["chunks"] += 1
    except Exception as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    return _finish(rec)


def _finish(rec: dict[str, Any]) -> dict[str, Any]:
    rec["t_end"] = time.time()
    if rec["tokens"] is None:
        rec["tokens"] = rec["chunks"]
    first = rec["t_first"]
    rec["ttft_s"] = None if first is None else first - rec["t_send"]
    span = (rec["t_last"] - first) if first is not None else 0
    rec["decode_tps"] = (rec["tokens"] - 1) / span if span > 0 and rec["tokens"] > 1 else None
    return rec


def _client(n: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    return httpx.AsyncClient(timeout=900, limits=limits)


async def sequential(url: str, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests one after another, on one connection."""
    async with _client(1) as client:
        return [await one(client, url, p) for p in payloads]


async def burst(url: str, payloads: list[dict[str, Any]], start_at: float | None = None) -> list[dict[str, Any]]:
    """The requests all at once (at ``start_at``, a ``time.time()``, when given)."""
    async with _client(len(payloads)) as client:
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        return list(await asyncio.gather(*(one(client, url, p) for p in payloads)))


async def closed_loop(url: str, streams: int, rounds: int, payload: Any) -> tuple[list[dict[str, Any]], float]:
    """``streams`` clients, each sending ``rounds`` requests back to back; (records, wall seconds).

    ``payload(stream, round)`` builds each request. The first round arrives all at once; the
    later ones arrive while the other streams are decoding: TTFT under load.
    """
    async with _client(streams) as client:
        async def stream(s: int) -> list[dict[str, Any]]:
            out = []
            for r in range(rounds):
                rec = await one(client, url, payload(s, r))
                rec["round"] = r
                out.append(rec)
            return out

        t0 = time.time()
        recs = [rec for group in await asyncio.gather(*(stream(s) for s in range(streams))) for rec in group]
        return recs, time.time() - t0


def median(xs: list[Any]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def percentile(xs: list[Any], q: float) -> float | None:
    """The ``q`` quantile (0..1) by linear interpolation; with few samples p99 is about the max."""
    vals = sorted(x for x in xs if x is not None)
    if not vals:
        return None
    pos = (len(vals) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


if __name__ == "__main__":  # python benchmarks/serving.py: build (or find) llama-server, print its path
    print(build_llama_server())
