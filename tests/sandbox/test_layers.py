"""The kernel layers on their own: attacks that the language's checks would stop, run with
those checks turned off (``SandboxPool(language_checks=False)``, reachable from Python only),
against a real agent server. Each must be refused by the kernel, reported as the language
reports refusals (``PermissionError``), and leave the worker serving and the server
answering ``/health`` within 100 ms.

The server's data directory holds its database and a ``conch.toml`` with a key, both
readable by every user: only Landlock stands between a worker and them. ``/etc/shadow``
through a hard link planted in the workspace is what the unprivileged worker user stops.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conch.config import Settings
from conch.sandbox import landlock, seccomp
from conch.sandbox.jobs import Job
from conch.sandbox.layers import SandboxUnavailable
from conch.sandbox.pool import SandboxPool
from tests.web.agent_fixtures import AgentServer, start_agent_server

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the kernel layers are Linux's"),
    pytest.mark.skipif(landlock.abi_version() < 4,
                       reason=f"the kernel offers Landlock ABI {landlock.abi_version()} "
                              "(4 or later needed: TCP rules)"),
    pytest.mark.skipif(seccomp.available() is not None,
                       reason=f"seccomp: {seccomp.available()}"),
]

ROOT = os.geteuid() == 0
# A Python the sandbox user can start (this one may live in root's 0700 home).
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    """A directory every user can reach (pytest's own tmp is 0700 under root)."""
    path = Path(tempfile.mkdtemp(prefix="conch-layers-"))
    path.chmod(0o755)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture(scope="module")
def listener() -> Iterator[int]:
    """A TCP listener on loopback that nothing in a worker may reach."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    yield int(sock.getsockname()[1])
    sock.close()
    assert not accepted, "a worker reached the loopback listener"


@pytest.fixture(scope="module")
def unchecked(base: Path) -> Iterator[AgentServer]:
    data = base / "data"
    data.mkdir()
    # What a worker must never read, readable by every user on purpose.
    (data / "conch.toml").write_text('api_key = "sk-the-server-key"\n')
    (data / "conch.toml").chmod(0o644)
    server = start_agent_server(data, language_checks=False, workspace=base / "ws", workers=1,
                                allow_process=True, wall_time_s=10.0)
    (data / "conch.db").chmod(0o644)
    ws = base / "ws"
    (ws / "link-to-config").symlink_to(data / "conch.toml")
    (ws / "link-to-etc").symlink_to("/etc")
    if ROOT:
        os.link("/etc/shadow", ws / "hardlink-to-shadow")
    yield server
    server.stop()


def _run(server: AgentServer, command: str) -> dict[str, Any]:
    with server.client() as c:
        body = c.post("/api/v1/execute", json={"command": command}).json()
    assert isinstance(body, dict)
    return body


def _still_serving(server: AgentServer) -> None:
    with server.client() as c:
        started = time.perf_counter()
        assert c.get("/health").status_code == 200
        assert time.perf_counter() - started < 0.1
        assert c.post("/api/v1/execute", json={"command": "1 + 1"}).json()["result"] == "2"


def test_the_layers_are_in_force(unchecked: AgentServer) -> None:
    with unchecked.client() as c:
        report = c.get("/health", params={"detail": "true"}).json()["sandbox"]
        metrics = c.get("/metrics").text
    layers = report["layers"]
    assert report["mode"] == "best-effort"
    assert layers["landlock"]["active"] and layers["seccomp"]["active"], layers
    if ROOT:
        assert layers["user"]["active"], layers["user"]
        assert "nobody" in layers["user"]["detail"]
    assert 'conch_sandbox_layer{layer="landlock"} 1.0' in metrics
    assert 'conch_sandbox_layer{layer="seccomp"} 1.0' in metrics


def _reads(base: Path) -> list[str]:
    data = base / "data"
    return [
        'cat("/etc/shadow")',
        f'cat("{data}/conch.toml")',
        f'cat("{data}/conch.db")',
        'cat("/proc/1/environ")',
        'cat("link-to-config")',
        'cat("link-to-etc/hostname")',
        'ls("/root")',
    ] + (['cat("hardlink-to-shadow")'] if ROOT else [])


@pytest.mark.parametrize("index", range(8))
def test_reads_outside_the_workspace_are_refused(unchecked: AgentServer, base: Path,
                                                 index: int) -> None:
    attacks = _reads(base)
    if index >= len(attacks):
        pytest.skip("the hard link to /etc/shadow needs root to plant")
    body = _run(unchecked, attacks[index])
    assert body["success"] is False, (attacks[index], body["result"])
    assert body["error"]["kind"] == "PermissionError", body["error"]
    assert "sk-the-server-key" not in str(body)
    _still_serving(unchecked)


def test_writes_outside_the_workspace_are_refused(unchecked: AgentServer, base: Path) -> None:
    for target in (base / "outside.txt", base / "data" / "conch.toml", Path("/etc/conch-x")):
        body = _run(unchecked, f'write("{target}", "overwritten")')
        assert body["error"]["kind"] == "PermissionError", (target, body)
        assert not target.exists() or "overwritten" not in target.read_text()
    body = _run(unchecked, 'write("inside.txt", "kept")')
    assert body["success"] is True
    written = unchecked.workspace / "inside.txt"
    assert written.read_text() == "kept"
    if ROOT:  # the worker's files are the sandbox user's, not root's
        assert written.stat().st_uid != 0
    _still_serving(unchecked)


def test_tcp_connects_are_refused(unchecked: AgentServer, listener: int) -> None:
    body = _run(unchecked, f'http_get("http://127.0.0.1:{listener}/")')
    assert body["error"]["kind"] == "PermissionError", body["error"]
    _still_serving(unchecked)


def _process(server: AgentServer, command: str, *args: str) -> dict[str, Any]:
    quoted = ", ".join(f'"{a}"' for a in args)
    body = _run(server, f'run_process("{command}", [{quoted}])')
    assert body["success"] is True, body["error"]
    return json.loads(body["result"])  # type: ignore[no-any-return]


def test_namespaces_tracing_and_links_are_refused_to_commands(unchecked: AgentServer) -> None:
    unshare = _process(unchecked, "unshare", "--user", "--map-root-user", "true")
    assert unshare["code"] != 0 and "Operation not permitted" in unshare["stderr"], unshare
    probe = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
             "print(libc.ptrace(16, 1, 0, 0), ctypes.get_errno())")  # PTRACE_ATTACH to pid 1
    ptrace = _process(unchecked, PYTHON, "-c", probe)
    assert ptrace["stdout"].split() == ["-1", "1"], ptrace  # EPERM
    link = _process(unchecked, "ln", "/etc/hostname", "planted")
    assert link["code"] != 0 and not (unchecked.workspace / "planted").exists(), link
    connect = _process(unchecked, PYTHON, "-c",
                       "import socket; socket.create_connection(('127.0.0.1', 1))")
    assert "PermissionError" in connect["stderr"], connect
    _still_serving(unchecked)


def test_the_language_checks_still_refuse_first(base: Path, listener: int) -> None:
    server = start_agent_server(base / "data-checked", workspace=base / "ws-checked", workers=1)
    try:
        for attack in ('cat("/etc/shadow")', f'cat("{base}/data/conch.toml")',
                       f'http_get("http://127.0.0.1:{listener}/")'):
            body = _run(server, attack)
            assert body["error"]["kind"] == "PermissionError", (attack, body)
        _still_serving(server)
    finally:
        server.stop()


def test_server_secrets_are_not_in_the_worker_environment(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://u:pw@h/db")
    monkeypatch.setenv("CONCH_API_KEY", "sk-secret")
    settings = Settings(data_dir=base / "data-env", workspace=base / "ws-env", workers=1)

    async def run() -> Any:
        pool = SandboxPool(settings)
        await pool.start()
        try:
            return await pool.run(Job(mode="program", source="[env('DATABASE_URL'), env()]"))
        finally:
            await pool.close()

    envelope = asyncio.run(run())
    database_url, environment = json.loads(envelope.result)
    assert database_url is None
    assert "pw@h" not in envelope.result and "sk-secret" not in envelope.result
    assert "DATABASE_URL" not in environment


@pytest.mark.skipif(not ROOT, reason="dropping to the sandbox user needs root")
def test_strict_refuses_to_start_without_a_layer(base: Path) -> None:
    # One user for every worker (no uid range), and that one missing.
    settings = Settings(data_dir=base / "data-strict", workspace=base / "ws-strict",
                        sandbox="strict", sandbox_user="conch-no-such-user", sandbox_uids="",
                        workers=1)

    async def start() -> None:
        pool = SandboxPool(settings)
        try:
            await pool.start()
        finally:
            await pool.close()

    with pytest.raises(SandboxUnavailable, match="conch-no-such-user"):
        asyncio.run(start())
    config = base / "strict.toml"
    config.write_text(f'sandbox = "strict"\nsandbox_user = "conch-no-such-user"\n'
                      f'sandbox_uids = ""\ndata_dir = "{base / "data-strict"}"\n')
    cli = subprocess.run([sys.executable, "-c", "from conch.cli.main import main; main()",
                          "serve", "--config", str(config)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert cli.returncode == 2, cli.stderr
    assert 'sandbox = "strict"' in cli.stderr and "conch-no-such-user" in cli.stderr


@pytest.mark.skipif(not ROOT, reason="dropping to the sandbox user needs root")
def test_strict_starts_where_every_layer_is_offered(base: Path) -> None:
    settings = Settings(data_dir=base / "data-strict-ok", workspace=base / "ws-strict-ok",
                        sandbox="strict", workers=1)

    async def run() -> Any:
        pool = SandboxPool(settings)
        await pool.start()
        try:
            return pool.layers, await pool.run(Job(mode="program", source="1 + 1"))
        finally:
            await pool.close()

    layers, envelope = asyncio.run(run())
    assert envelope.result == "2"
    assert all(layers[name].active for name in ("landlock", "seccomp", "user")), layers


@pytest.mark.skipif(not ROOT, reason="RLIMIT_NPROC is set for workers running as the sandbox user")
def test_a_fork_bomb_stops_at_the_process_limit(base: Path) -> None:
    settings = Settings(data_dir=base / "data-pids", workspace=base / "ws-pids", workers=1,
                        allow_process=True, worker_pids_max=8, wall_time_s=20.0)
    bomb = 'run_process("sh", ["-c", "for i in $(seq 40); do sleep 3 & done; wait"])'

    async def run() -> Any:
        pool = SandboxPool(settings)
        await pool.start()
        try:
            limits = pool.layers["limits"]
            bombed = await pool.run(Job(mode="program", source=bomb))
            after = await pool.run(Job(mode="program", source="1 + 1"))
            return limits, bombed, after
        finally:
            await pool.close()

    limits, bombed, after = asyncio.run(run())
    assert bombed.error is None, bombed.error
    result = json.loads(bombed.result)
    if limits.active:  # a cgroup: pids.max
        assert "fork" in result["stderr"].lower() or result["code"] != 0, result
    else:  # RLIMIT_NPROC for the sandbox user
        assert "processes" in limits.detail
        assert "fork" in result["stderr"].lower() or "resource" in result["stderr"].lower(), result
    assert after.result == "2"


def test_commands_end_with_the_run(unchecked: AgentServer) -> None:
    with unchecked.client() as c:
        body = c.post("/api/v1/execute", json={"command": 'run_process("sleep", ["30"])',
                                               "limits": {"wall_time_s": 1}}).json()
    assert body["error"]["kind"] == "TimeoutError", body
    leftover = subprocess.run(["pgrep", "-f", "^sleep 30$"], capture_output=True, text=True,
                              check=False)
    assert leftover.stdout.strip() == "", "the command outlived its run"
    _still_serving(unchecked)


def test_per_worker_cgroups_where_one_is_delegated(base: Path) -> None:
    from conch.sandbox import cgroups

    where, why = cgroups.inspect()
    if where is None:
        pytest.skip(f"no delegated cgroup v2 here: {why}")
    settings = Settings(data_dir=base / "data-cg", workspace=base / "ws-cg", workers=1,
                        worker_pids_max=16)

    async def run() -> Any:
        pool = SandboxPool(settings)
        await pool.start()
        try:
            (worker,) = pool._workers
            assert worker.cgroup is not None
            return (worker.cgroup.path / "pids.max").read_text().strip(), pool.layers["limits"]
        finally:
            await pool.close()

    pids_max, limits = asyncio.run(run())
    assert pids_max == "16" and limits.active


def test_a_worker_may_only_record_its_own_tasks(unchecked: AgentServer) -> None:
    """What a worker sends to be recorded is untrusted input: it can touch no other task."""
    orchestrator = unchecked.app.state.orchestrator
    row = {"id": "task_0123456789abcdef", "goal": "g", "tools": [], "max_steps": 2,
           "model": "m", "timeout": 5}
    orchestrator.record_builtin(111, "task.insert", row)
    with pytest.raises(ValueError, match="did not start"):
        orchestrator.record_builtin(222, "task.finish", {"id": row["id"], "status": "succeeded"})
    with pytest.raises(ValueError, match="malformed"):
        orchestrator.record_builtin(111, "task.insert", {**row, "id": "../../etc"})
    orchestrator.record_builtin(111, "task.finish", {"id": row["id"], "status": "failed"})
    with unchecked.client() as c:
        record = c.get(f"/api/v1/orchestration/tasks/{row['id']}").json()
    assert record["status"] == "failed" and record["goal"] == "g"
