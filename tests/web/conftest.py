"""A real inference server on a free loopback port, serving the real bundled SmolLM2 model."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conch import db
from conch.config import Settings


@dataclass
class RunningServer:
    url: str
    settings: Settings
    app: Any

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, **{"timeout": 120, **kw})

    def openai(self, **kw: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=self.v1, api_key="anything", max_retries=0, timeout=120, **kw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(data_dir: Path, **overrides: Any) -> tuple[RunningServer, Any, threading.Thread]:
    import uvicorn

    from conch.web.inference.app import create_app

    port = _free_port()
    settings = Settings(data_dir=data_dir, models_port=port, **overrides)
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the inference server did not start")
        time.sleep(0.05)
    return RunningServer(f"http://127.0.0.1:{port}", settings, app), server, thread


@pytest.fixture(scope="session")
def inference_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("conch-data")


@pytest.fixture(scope="session")
def inference_server(inference_data_dir: Path) -> Iterator[RunningServer]:
    # Drafting on (its default is off), as this shared server has always run.
    running, server, thread = start_server(inference_data_dir, n_parallel=4, n_ctx=1024, max_queue=64, draft_max=8)
    yield running
    server.should_exit = True
    thread.join(timeout=30)
    db.dispose_all()


@pytest.fixture()
def busy_server(tmp_path: Path) -> Iterator[RunningServer]:
    """One sequence and a queue of one, to reach the queue limit quickly."""
    running, server, thread = start_server(tmp_path / "data", n_parallel=1, n_ctx=512, max_queue=1)
    yield running
    server.should_exit = True
    thread.join(timeout=30)
