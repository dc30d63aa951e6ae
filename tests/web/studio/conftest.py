"""A real agent server and inference server on loopback (as ``conch up`` runs them, sharing one
configuration), and a real Chromium driven by Playwright against the studio they serve."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
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
from tests.web.conftest import _free_port
from testsupport.scripted_model import ScriptedModel
from testsupport.servers import Server, start_thread_server

ROOT = Path(__file__).resolve().parents[3]  # the checkout

CHROMIUM = os.environ.get("CONCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}


@dataclass
class Servers:
    agent: str
    inference: str
    settings: Settings
    data_dir: Path

    def get(self, base: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.settings.api_key}"} if self.settings.api_key else {}
        return httpx.get(base + path, headers=headers, timeout=30, **kw)


def _serve(app: Any, port: int) -> tuple[Any, threading.Thread]:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("a conch server did not start")
        time.sleep(0.05)
    return server, thread


def start_servers(data_dir: Path, **overrides: Any) -> tuple[Servers, list[tuple[Any, threading.Thread]]]:
    from conch.web.agent.app import create_app as create_agent_app
    from conch.web.inference.app import create_app as create_inference_app

    port, models_port = _free_port(), _free_port()
    if "models_url" in Settings.model_fields:
        # Where the agent server's model calls go: this inference server, as under `conch up`.
        overrides.setdefault("models_url", f"http://127.0.0.1:{models_port}/v1")
    settings = Settings(
        data_dir=data_dir, port=port, models_port=models_port, n_parallel=2, n_ctx=1024, **overrides
    )
    running = [
        _serve(create_agent_app(settings), settings.port),
        _serve(create_inference_app(settings), settings.models_port),
    ]
    servers = Servers(
        f"http://127.0.0.1:{settings.port}",
        f"http://127.0.0.1:{settings.models_port}",
        settings,
        data_dir,
    )
    return servers, running


def stop_servers(running: list[tuple[Any, threading.Thread]]) -> None:
    for server, _ in running:
        server.should_exit = True
    for _, thread in running:
        thread.join(timeout=30)


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    running_servers, running = start_servers(tmp_path_factory.mktemp("studio-data"))
    yield running_servers
    stop_servers(running)
    db.dispose_all()


# Package scope, not session: Playwright's sync API keeps an asyncio loop running in this
# thread while it is open, and tests run after these (asyncio.run) would find it.
@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium; `make test` does it as root)")
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def shots() -> Path:
    """Screenshots of every page at 1280x800, for a reviewer to look at: in
    ``artifacts/studio-screenshots/`` of the checkout (git-ignored; the folder CI keeps as
    artefacts, named in the README), or in $CONCH_STUDIO_SCREENSHOTS when set."""
    kept = Path(os.environ.get("CONCH_STUDIO_SCREENSHOTS") or ROOT / "artifacts" / "studio-screenshots")
    kept.mkdir(parents=True, exist_ok=True)
    return kept


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT)
    # The studio loads nothing from elsewhere: any request off loopback fails the test.
    outside: list[str] = []

    def check(route: Any) -> None:
        url = route.request.url
        if not url.startswith(("http://127.0.0.1:", "http://localhost:", "data:")):
            outside.append(url)
            route.abort()
        else:
            route.continue_()

    context.route("**/*", check)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    context.close()
    assert not outside, f"the studio requested outside addresses: {outside}"
    assert not errors, f"uncaught errors in the page: {errors}"


# An orchestration server driven by the scripted model (tests/conftest.py), per test module (the runs and
# approvals pages need tasks whose model answers are known).
@pytest.fixture(scope="module")
def orch(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         scripted: ScriptedModel) -> Iterator[Server]:
    name = request.module.__name__.rsplit(".", 1)[-1]
    srv = start_thread_server(tmp_path_factory.mktemp(name), models_url=scripted.v1, wall_time_s=5.0)
    yield srv
    srv.stop()


# -- an inference server killed mid-answer, then started again ---------------------------------
_SERVE = """
import sys, uvicorn
from pathlib import Path
from conch.config import Settings
from conch.web.inference.app import create_app
data, port, models_port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
settings = Settings(data_dir=data, port=port, models_port=models_port, n_parallel=1, n_ctx=1024)
uvicorn.run(create_app(settings), host="127.0.0.1", port=models_port, log_level="warning")
"""


class InferenceProcess:
    """`conch models serve` in its own process, so that a test can kill it (SIGKILL: the
    connection drops mid-stream, as when the machine or the process dies)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port, self.models_port = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{self.models_port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, str(self.data_dir), str(self.port), str(self.models_port)],
            env=env,
        )
        # Generous: importing conch and starting a server takes a few seconds, more on a busy
        # machine.
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/v1/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, "the inference server exited"
            time.sleep(0.2)
        raise RuntimeError("the inference server did not start")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture()
def inference(tmp_path: Path) -> Iterator[InferenceProcess]:
    server = InferenceProcess(tmp_path / "data")
    server.data_dir.mkdir()
    server.start()
    yield server
    server.kill()
