"""Context as llama-server gives it: the same long prompts accepted and refused by both servers.

llama-server at its defaults (``-c 0``, ``-np -1``) serves every request from one unified KV
pool of the model's training context (8,192 tokens for the bundled SmolLM2) and refuses a
prompt only when it does not fit that context. conch at its defaults must answer the same:
a 2k, 4k and 8k-token prompt served, one past the context refused with ``400
context_length_exceeded``. The llama-server half runs when the benchmark peer is built
(``make bench`` builds it into ``.bench-cache``; ``CONCH_TEST_LLAMA_SERVER`` names another
binary), and is skipped otherwise.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conch import db
from conch.inference.models.bundled import find_bundled_gguf
from tests.web.conftest import RunningServer, _free_port, start_server

ROOT = Path(__file__).resolve().parents[2]
# Prompt sizes (user-message tokens, about): three that fit the 8,192-token context, one that does not.
SIZES = (2000, 4000, 8000, 8400)
WORD = " lighthouse"  # one token in SmolLM2's vocabulary, so a message of n words is ~n tokens


def _message(n: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Count the words.{WORD * n}"}]


def _ask(c: httpx.Client, model: str, n: int) -> tuple[int, int | None, str | None]:
    """Status, prompt tokens (when served) and error code (when refused) of one request."""
    r = c.post("/v1/chat/completions", json={"model": model, "messages": _message(n), "max_tokens": 1,
                                             "temperature": 0})
    if r.status_code == 200:
        return 200, int(r.json()["usage"]["prompt_tokens"]), None
    err = r.json().get("error", {})
    return r.status_code, None, err.get("code") or err.get("type")


@pytest.fixture(scope="module")
def conch_at_defaults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running, server, thread = start_server(tmp_path_factory.mktemp("ctx-data"))
    yield running
    server.should_exit = True
    thread.join(timeout=30)
    db.dispose_all()


def _conch_answers(running: RunningServer) -> dict[int, tuple[int, int | None, str | None]]:
    with running.client(timeout=600) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
        return {n: _ask(c, model, n) for n in SIZES}


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_conch_serves_the_training_context_by_default(conch_at_defaults: RunningServer) -> None:
    """The bundled SmolLM2 was trained on 8,192 tokens: an 8k-token prompt is served at the
    defaults, a longer one is refused naming the context; the model reports that context."""
    with conch_at_defaults.client(timeout=600) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
        status, tokens, _ = _ask(c, model, 8000)
        assert status == 200 and tokens is not None and 8000 < tokens < 8192
        r = c.post("/v1/chat/completions", json={"model": model, "messages": _message(8400), "max_tokens": 1})
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
        assert "maximum context length is 8192 tokens" in err["message"]


def _llama_server() -> Path | None:
    named = os.environ.get("CONCH_TEST_LLAMA_SERVER")
    if named:
        return Path(named) if Path(named).exists() else None
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return None
    binary = ROOT / ".bench-cache" / "llama-server" / version / "build" / "bin" / "llama-server"
    return binary if binary.exists() else None


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_long_prompts_are_accepted_and_refused_as_llama_server_does(
    conch_at_defaults: RunningServer, tmp_path: Path
) -> None:
    binary = _llama_server()
    if binary is None:
        pytest.skip("llama-server is not built (make bench builds it into .bench-cache)")
    model = find_bundled_gguf()
    assert model is not None
    port = _free_port()
    log = (tmp_path / "llama-server.log").open("wb")
    env = {**os.environ, "LD_LIBRARY_PATH": f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    # llama-server as users start it: the model and a port, every other setting its default.
    proc = subprocess.Popen([str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "llama-server.log").read_text(errors="replace")[-2000:]
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama-server did not start"
            time.sleep(0.5)
        with httpx.Client(base_url=base, timeout=600) as c:
            theirs = {n: _ask(c, "m", n) for n in SIZES}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    ours = _conch_answers(conch_at_defaults)
    assert [ours[n][0] for n in SIZES] == [theirs[n][0] for n in SIZES], (ours, theirs)
    assert [ours[n][0] for n in SIZES] == [200, 200, 200, 400]
    # Both templates make prompts of the same size (within a few tokens of each other).
    for n in SIZES[:3]:
        assert abs(int(ours[n][1] or 0) - int(theirs[n][1] or 0)) <= 8, (n, ours[n], theirs[n])
    assert ours[SIZES[3]][2] == "context_length_exceeded"
