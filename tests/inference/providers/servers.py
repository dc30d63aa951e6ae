"""Real OpenAI-compatible servers on loopback for the provider tests and the benchmark:
llama-cpp-python's own server (``python -m llama_cpp.server``) and a second conch inference
server, both serving the bundled SmolLM2 file."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.inference.providers.standins import free_port


def _wait(url: str, proc: subprocess.Popen[bytes] | None = None, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(url, timeout=2, headers={"Authorization": "Bearer sk-llama-test"}).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


@contextmanager
def llama_cpp_server(model_path: Path, alias: str = "smollm2", api_key: str | None = None,
                     n_ctx: int = 1024, extra: list[str] | None = None) -> Iterator[str]:
    """``python -m llama_cpp.server`` on a free port; yields its OpenAI base URL (``…/v1``)."""
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--model_alias", alias,
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
           # By default it ends a running stream whenever another request arrives, and
           # conch's health probes are requests (docs/providers.md).
           "--interrupt_requests", "False", *(extra or [])]
    if api_key:
        cmd += ["--api_key", api_key]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _wait(f"http://127.0.0.1:{port}/v1/models", proc)
        # Its first completion takes seconds (warm-up); pay for it here, not in a test's timeout.
        httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                   headers={"Authorization": f"Bearer {api_key or 'unused'}"},
                   json={"model": alias, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def conch_inference_server(data_dir: Path, **overrides: Any) -> Iterator[tuple[str, Any]]:
    """A conch inference server in this process on a free port; yields (base URL …/v1, app)."""
    import uvicorn

    from conch.config import Settings
    from conch.web.inference.app import create_app

    port = free_port()
    settings = Settings(data_dir=data_dir, models_port=port, **overrides)
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the conch inference server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1", app
    finally:
        server.should_exit = True
        thread.join(timeout=30)
