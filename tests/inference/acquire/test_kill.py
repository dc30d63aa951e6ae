"""A process killed mid-download or mid-conversion leaves no model listed; cleanup frees the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conch.config import Settings
from conch.inference.models.acquire import Acquirer
from conch.inference.models.store import ModelStore
from tests.inference.sources.servers import FileServer

# A hang (a stuck socket or thread) fails the test instead of stalling the suite.
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]


def _spawn(code: str, data_dir: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, CONCH_DATA_DIR=str(data_dir), CONCH_CONFIG=str(data_dir / "none.toml"),
               PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen[str], marker: str, timeout: float = 60) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if marker in line:
            return
        if not line and proc.poll() is not None:
            raise AssertionError(f"child exited early: {proc.stderr.read() if proc.stderr else ''}")
    raise AssertionError(f"child never printed {marker!r}")


def _after_restart(data_dir: Path) -> tuple[ModelStore, Acquirer]:
    settings = Settings(data_dir=data_dir)
    store = ModelStore(settings)
    acq = Acquirer(settings, store)
    acq.recover()  # what the server does when it starts
    return store, acq


def test_kill_mid_download(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    payload = os.urandom(8 * 1024 * 1024)
    server = FileServer({"big.gguf": payload})
    server.chunk_delay = 0.02  # ~3 MB/s: the download is still running when it is killed
    with server.run() as base:
        proc = _spawn(f"""
            from conch.config import Settings
            from conch.inference.models.acquire import Acquirer, DownloadSpec
            from conch.inference.models.store import ModelStore
            s = Settings(); store = ModelStore(s); acq = Acquirer(s, store)
            seen = []
            def progress(ev):
                if ev["completed"] > 1_000_000 and not seen:
                    seen.append(1); print("MIDWAY", flush=True)
            acq.download("big", DownloadSpec(source="url", url="{base}/big.gguf"), progress)
            print("FINISHED", flush=True)
        """, data_dir)
        try:
            _wait_for(proc, "MIDWAY")
            # The placeholder is visible while the download runs...
            assert ModelStore(Settings(data_dir=data_dir)).get("big").status == "downloading"  # type: ignore[union-attr]
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
    store, _ = _after_restart(data_dir)
    assert store.get("big") is None
    assert store.list() == [] or all(r.status == "ready" for r in store.list())
    leftovers = list((data_dir / "tmp").iterdir())
    assert leftovers, "the killed download should have left partial files"
    freed, removed = store.cleanup()
    assert freed > 0 and removed
    assert list((data_dir / "tmp").iterdir()) == []


def test_kill_mid_conversion(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    from tests.inference.convert.tiny_llama import make_tiny_llama

    data_dir = tmp_path / "data"
    src = tmp_path / "tiny"
    make_tiny_llama(src)
    proc = _spawn(f"""
        import time
        from conch.config import Settings
        from conch.inference.models.acquire import Acquirer, DownloadSpec
        from conch.inference.models.store import ModelStore
        s = Settings(); store = ModelStore(s); acq = Acquirer(s, store)
        acq.download("tiny", DownloadSpec(source="file", path="{src}"))
        def progress(ev):
            if 0 < ev["completed"] < ev["total"]:
                print("MIDWAY", flush=True)
                time.sleep(60)  # stands for a long conversion; the test kills us here
        acq.convert("tiny", "gguf", "f32", None, progress)
        print("FINISHED", flush=True)
    """, data_dir)
    try:
        _wait_for(proc, "MIDWAY")
        assert ModelStore(Settings(data_dir=data_dir)).get("tiny-f32").status == "converting"  # type: ignore[union-attr]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    store, _ = _after_restart(data_dir)
    assert store.get("tiny-f32") is None
    assert [r.id for r in store.list()] == ["tiny"]
    partial = [p for p in (data_dir / "tmp").iterdir()]
    assert partial and any(p.name.startswith("tiny-f32.") for p in partial)
    freed, _ = store.cleanup()
    assert freed > 0
    assert list((data_dir / "tmp").iterdir()) == []
    assert store.get("tiny") is not None and store.get("tiny").status == "ready"  # type: ignore[union-attr]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(data_dir: Path, port: int) -> subprocess.Popen[str]:
    conch = Path(sys.executable).parent / "conch"
    if not conch.exists():
        pytest.skip("the conch command is not installed in this environment")
    env = dict(os.environ, CONCH_DATA_DIR=str(data_dir), CONCH_CONFIG=str(data_dir / "none.toml"))
    proc = subprocess.Popen([str(conch), "models", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise AssertionError("the server exited at start")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server did not start")


@pytest.mark.timeout(300)
def test_server_killed_mid_download_and_restarted(tmp_path: Path) -> None:
    import httpx

    data_dir = tmp_path / "data"
    payload = os.urandom(8 * 1024 * 1024)
    files = FileServer({"big.gguf": payload})
    files.chunk_delay = 0.02
    port = _free_port()
    server = _start_server(data_dir, port)
    api = f"http://127.0.0.1:{port}/v1"
    try:
        with files.run() as base, httpx.stream(
            "POST", f"{api}/models/big/download", timeout=60,
            json={"source": "url", "url": f"{base}/big.gguf", "stream": True},
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and '"completed"' in line:
                    ev = json.loads(line[6:])
                    if ev["completed"] > 1_000_000:
                        break
            detail = httpx.get(f"{api}/models/big", timeout=10).json()
            assert detail["status"] == "downloading"
            server.send_signal(signal.SIGKILL)
            server.wait(10)
    finally:
        if server.poll() is None:
            server.kill()
    server = _start_server(data_dir, port)
    try:
        ids = [m["id"] for m in httpx.get(f"{api}/models", timeout=10).json()["data"]]
        assert "big" not in ids
        assert httpx.get(f"{api}/models/big", timeout=10).status_code == 404
        assert any((data_dir / "tmp").iterdir())
        cleaned = httpx.post(f"{api}/storage/cleanup", timeout=30)
        assert cleaned.status_code == 200
        assert list((data_dir / "tmp").iterdir()) == []
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
