"""Real agent servers for the orchestration tests: in a thread (uvicorn on a free loopback
port) or as a separate ``conch serve`` process (for SIGKILL and several servers)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from conch.config import Settings

SRC = str(Path(__file__).resolve().parents[1] / "src")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_in_session(c: httpx.Client, sid: str, command: str) -> dict[str, Any]:
    """``command`` run in session ``sid``: its envelope, which must be a success."""
    r = c.post("/api/v1/execute", json={"command": command, "session": sid})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"], body
    return body  # type: ignore[no-any-return]


def _create_app(settings: Settings) -> Any:
    from conch.web.agent.app import create_app

    return create_app(settings)


@dataclass
class Server:
    url: str
    settings: Settings
    app: Any = None
    _server: Any = None
    _thread: threading.Thread | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def orchestrator(self) -> Any:
        return self.app.state.orchestrator

    def client(self, **kw: Any) -> httpx.Client:
        kw.setdefault("timeout", 60)
        return httpx.Client(base_url=self.url, **kw)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            assert self._thread is not None
            self._thread.join(timeout=30)
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def kill(self) -> None:
        """SIGKILL the server process (and nothing else)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


def start_thread_server(data_dir: Path, **overrides: Any) -> Server:
    import uvicorn

    # IPPROTO_TCP spelled out: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    # sockets whose protocol says TCP, and a socket.socket() says 0. With Nagle on, each
    # reply on a kept-alive connection waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    overrides.setdefault("workers", 2)
    settings = Settings(data_dir=data_dir, port=port, **overrides)
    app = _create_app(settings)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the agent server did not start")
        time.sleep(0.02)
    return Server(f"http://127.0.0.1:{port}", settings, app, server, thread)


def start_process_server(data_dir: Path, log: Path, port: int | None = None, **env: str) -> Server:
    """``conch serve`` in its own process, configured through CONCH_* variables; on ``port``
    when given (a server started again where a browser page still points), else a free one."""
    port = port or free_port()
    environ = {
        **os.environ,
        "PYTHONPATH": SRC,
        "CONCH_DATA_DIR": str(data_dir),
        "CONCH_CONFIG": str(data_dir / "none.toml"),
    }
    environ.update({f"CONCH_{k.upper()}": v for k, v in env.items()})
    out = log.open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "conch.cli.main", "serve", "--port", str(port)],
        env=environ,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"conch serve exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("conch serve did not start")
        time.sleep(0.1)
    return Server(url, Settings(data_dir=data_dir), process=process)


def wait_for(client: httpx.Client, path: str, done: Any, timeout: float = 60.0) -> dict[str, Any]:
    """Poll ``path`` until ``done(record)``; the last record."""
    deadline = time.monotonic() + timeout
    while True:
        record = client.get(path).json()
        if done(record):
            return record  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting on {path}: {record}")
        time.sleep(0.05)


def finished(record: dict[str, Any]) -> bool:
    return record.get("status") in ("succeeded", "failed", "cancelled")
