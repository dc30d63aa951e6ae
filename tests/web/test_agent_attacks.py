"""The sandbox attack corpus: every program is refused or contained, nothing escapes the
workspace, and the server stays healthy after each one (SPEC §2.4)."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conch.lang.builtins.registry import all_builtins
from tests.web.agent_fixtures import *  # noqa: F403
from tests.web.agent_fixtures import AgentServer, start_agent_server

SECRET = "top secret, outside the workspace"
PROBE_VAR = "CONCH_SANDBOX_PROBE_TOKEN"


@pytest.fixture(scope="module")
def sandboxed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentServer, Path]]:
    root = tmp_path_factory.mktemp("attack")
    outside = root / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    (root / "data").mkdir()
    (root / "data" / "secret.txt").write_text(SECRET)  # the workspace's parent
    os.environ[PROBE_VAR] = "leaked"
    try:
        server = start_agent_server(
            root / "data",
            wall_time_s=2.0,
            worker_memory_mb=512,
            max_output_bytes=1024 * 1024,
        )
    finally:
        del os.environ[PROBE_VAR]
    ws = server.workspace
    (ws / "inside.txt").write_text("fine")
    (ws / "outlink").symlink_to(outside, target_is_directory=True)
    (ws / "passwd").symlink_to("/etc/passwd")
    (ws / "sub").mkdir()
    yield server, outside
    server.stop()


def _refused(*kinds: str) -> Callable[[dict[str, Any]], bool]:
    def check(body: dict[str, Any]) -> bool:
        return body["success"] is False and body["error"]["kind"] in kinds

    check.__doc__ = " or ".join(kinds)
    return check


def _refused_or(
    pred: Callable[[dict[str, Any]], bool], *kinds: str
) -> Callable[[dict[str, Any]], bool]:
    refused = _refused(*kinds)
    return lambda body: refused(body) or (body["success"] and pred(body))


PERM = _refused("PermissionError")
RESOURCE = _refused("LimitError", "TimeoutError")

CORPUS: list[tuple[str, str, Callable[[dict[str, Any]], bool]]] = [
    ("parent traversal", 'cat("../secret.txt")', PERM),
    ("deep traversal", 'cat("../../outside/secret.txt")', PERM),
    ("traversal through a subdirectory", 'cat("sub/../../secret.txt")', PERM),
    ("absolute path", 'cat("/etc/passwd")', PERM),
    ("absolute path outside", "cat(" + '"{outside}/secret.txt"' + ")", PERM),
    (
        "list the real root",
        'ls("/")',
        _refused_or(lambda b: "etc" not in b["result"], "PermissionError"),
    ),
    ("list the parent", 'ls("..")', PERM),
    ("symlinked directory pointing outside", 'cat("outlink/secret.txt")', PERM),
    ("list a symlinked directory", 'ls("outlink")', PERM),
    ("symlinked file pointing outside", 'cat("passwd")', PERM),
    ("write outside", 'write("../escape.txt", "x")', PERM),
    ("write to an absolute path", 'write("{outside}/escape.txt", "x")', PERM),
    ("write through a symlink", 'write("outlink/escape.txt", "x")', PERM),
    ("append outside", 'append("../secret.txt", "x")', PERM),
    ("mkdir outside", 'mkdir("../newdir")', PERM),
    ("touch outside", 'touch("{outside}/touched")', PERM),
    ("remove outside", 'rm("../secret.txt")', PERM),
    ("move a secret in", 'mv("../secret.txt", "stolen.txt")', PERM),
    ("copy a system file in", 'cp("/etc/passwd", "copy.txt")', PERM),
    ("copy out", 'cp("inside.txt", "{outside}/copied.txt")', PERM),
    ("cd out of the workspace", 'cd("..")', PERM),
    ("open outside", 'open("/etc/hostname")', PERM),
    ("stat outside", 'stat("/etc/passwd")', PERM),
    (
        "exists outside",
        'exists("/etc/passwd")',
        _refused_or(lambda b: b["value"] is False, "PermissionError"),
    ),
    (
        "grep outside",
        'grep("root", "/etc/passwd")',
        _refused_or(lambda b: "root" not in b["result"], "PermissionError"),
    ),
    (
        "find outside",
        'find("/", "passwd")',
        _refused_or(lambda b: "passwd" not in b["result"], "PermissionError"),
    ),
    (
        "glob outside",
        'glob("../*")',
        _refused_or(lambda b: "secret" not in b["result"], "PermissionError"),
    ),
    ("du outside", 'du("/")', PERM),
    ("infinite loop", "while true { 1 }", RESOURCE),
    (
        "busy native computation",
        "10 ** 10 ** 10",
        _refused("LimitError", "TimeoutError", "ValueError"),
    ),
    ("unbounded recursion", "fn f(x) => f(x + 1)\nf(0)", _refused("LimitError")),
    ("mutual recursion", "fn a(x) => b(x)\nfn b(x) => a(x)\na(1)", _refused("LimitError")),
    ("deeply nested source", "[" * 50_000 + "]" * 50_000, _refused("SyntaxError", "LimitError")),
    (
        "memory bomb by materialising pairs",
        "range(0, 10**10) | map(fn(x) => [x, x]) | len",
        RESOURCE,
    ),
    ("huge string repeat", '"x" | repeat(10**12)', _refused("LimitError", "ValueError")),
    (
        "zip bomb-style repeat",
        '"abcdefgh" | repeat(10**6) | repeat(10**6)',
        _refused("LimitError", "ValueError"),
    ),
    ("huge list", "range(0, 10**9) | map(fn(x) => x)", RESOURCE),
    ("output flood", 'while true { print("flood flood flood flood") }', RESOURCE),
    ("huge result", '"y" | repeat(5 * 1024 * 1024)', RESOURCE),
    ("sleep forever", "sleep(10**9)", RESOURCE),
    (
        "server secrets in the environment",
        f'env("{PROBE_VAR}")',
        lambda b: b["success"] and b["value"] is None,
    ),
    (
        "any CONCH_ variable",
        'env() | keys | where(fn(k) => k | starts_with("CONCH_")) | len',
        lambda b: b["success"] and b["value"] == 0,
    ),
]


@pytest.mark.parametrize(("name", "code", "check"), CORPUS, ids=[c[0] for c in CORPUS])
def test_attack_is_refused_or_contained(
    sandboxed: tuple[AgentServer, Path],
    name: str,
    code: str,
    check: Callable[[dict[str, Any]], bool],
) -> None:
    server, outside = sandboxed
    before = sorted(p.name for p in outside.iterdir())
    code = code.replace("{outside}", str(outside))
    with server.client() as c:
        r = c.post("/api/v1/execute", json={"command": code})
        assert r.status_code == 200, r.text
        body = r.json()
        assert check(body), f"{name}: {body['error'] or body['result'][:200]}"
        assert c.get("/health").json()["status"] == "healthy"
    assert sorted(p.name for p in outside.iterdir()) == before
    assert (outside / "secret.txt").read_text() == SECRET
    assert (server.workspace.parent / "secret.txt").read_text() == SECRET


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 25


def test_pool_is_whole_after_the_corpus(sandboxed: tuple[AgentServer, Path]) -> None:
    server, _ = sandboxed
    pool = server.pool
    deadline = time.monotonic() + 30
    while len(pool.worker_pids()) < pool.size and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pool.worker_pids()) == pool.size
    with server.client() as c:
        assert c.post("/api/v1/execute", json={"command": "1 + 1"}).json()["value"] == 2


def test_stream_flood_is_contained(sandboxed: tuple[AgentServer, Path]) -> None:
    server, _ = sandboxed
    with server.client() as c:
        text = c.post(
            "/api/v1/stream/eval",
            json={
                "code": 'while true { print("flood flood flood") }',
                "limits": {"output_bytes": 10_000},
            },
        ).text
    assert "event: error" in text and "LimitError" in text
    assert len(text) < 200_000


RISKY = [b.name for b in all_builtins() if b.effect in ("network", "process")]


def test_network_and_process_effects_are_off_by_default(
    sandboxed: tuple[AgentServer, Path],
) -> None:
    server, _ = sandboxed
    allowed = set(server.pool.config.allowed_effects)
    assert "network" not in allowed and "process" not in allowed
    assert {"pure", "read", "write"} <= allowed


@pytest.mark.parametrize("name", RISKY or ["<none registered>"])
def test_network_and_process_builtins_refused(
    sandboxed: tuple[AgentServer, Path], name: str
) -> None:
    if not RISKY:
        pytest.skip("no network or process builtin is registered in this build")
    server, _ = sandboxed
    with server.client() as c:
        body = c.post(f"/api/v1/call/{name}", json={"args": ["http://127.0.0.1:9"]}).json()
    assert body["success"] is False
    assert body["error"]["kind"] in ("PermissionError", "TypeError")


def test_fifty_concurrent_long_runs_keep_health_responsive(
    agent_server_factory: Callable[..., AgentServer],
) -> None:
    server = agent_server_factory(workers=4, wall_time_s=1.0)
    programs = ["sleep(400)", "while true { 1 }"]
    results: list[int] = []
    kinds: list[str] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            r = c.post("/api/v1/execute", json={"command": programs[i % 2]})
        with lock:
            results.append(r.status_code)
            body = r.json()
            kinds.append("ok" if body["success"] else body["error"]["kind"])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    latencies: list[float] = []
    with httpx.Client(base_url=server.url, timeout=30) as c:
        while any(t.is_alive() for t in threads):
            started = time.perf_counter()
            assert c.get("/health").status_code == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(0.02)
    for t in threads:
        t.join()
    assert results == [200] * 50
    assert set(kinds) <= {"ok", "TimeoutError", "LimitError"}
    assert kinds.count("ok") == 25  # every sleep finished; every loop was stopped
    assert len(latencies) >= 10
    # Generous against CI noise: the typical probe is far below 100 ms, none is slow.
    assert statistics.median(latencies) < 0.1
    assert sorted(latencies)[int(len(latencies) * 0.9)] < 0.1
    assert max(latencies) < 1.0
