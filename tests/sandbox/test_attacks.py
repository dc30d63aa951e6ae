"""The nine ways out an attack suite found with ``allow_process`` (and ``allow_network``) on,
each tried again with the language's own checks turned off (``language_checks=False``,
reachable from Python only), so that what refuses it is the kernel: hard rlimits, the
worker's PID namespace, a uid of its own, its network and mount namespaces, seccomp, file
modes. Every attack runs against real agent servers with ``allow_process`` and
``allow_network`` each on and off, and must leave the worker serving the next job.

1. a command raising its own RLIMIT_AS / RLIMIT_CPU and allocating past ``worker_memory_mb``;
2. a command (``setsid``) outliving its run and its worker;
3. one server's fork bomb starving another's commands (RLIMIT_NPROC per uid);
4. a pathname UNIX socket outside the workspace (mode 0777);
5. binding a UDP port of the host;  6. UDP to the host's loopback;
7. TCP to another service on the host's loopback (another conch server's API) or its own
   address, by a command or by ``http_get``;
8. ``conch.db`` and a ``conch.toml`` conch wrote, read through a hard link in the workspace;
9. the side bugs: a 200,000-deep pipeline ``input`` (a JSON 400, not a plain-text 500) and
   ``run_process`` with ``stdin`` for a command slower than 0.2 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conch.config import Settings, write_private
from conch.sandbox import landlock, namespaces, seccomp, slirp
from conch.sandbox.jobs import Job
from conch.sandbox.layers import SandboxUnavailable
from conch.sandbox.pool import SandboxPool
from tests.web.agent_fixtures import AgentServer, start_agent_server

ROOT = os.geteuid() == 0


def _no_namespaces() -> str | None:
    if not ROOT:
        return None
    return namespaces.check("/", [], True, True)


pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the kernel layers are Linux's"),
    pytest.mark.skipif(not ROOT, reason="needs root: namespaces, a uid per worker, file modes "
                                        "that bind the workers"),
    pytest.mark.skipif(landlock.abi_version() < 4,
                       reason=f"the kernel offers Landlock ABI {landlock.abi_version()} "
                              "(4 or later needed: TCP rules)"),
    pytest.mark.skipif(seccomp.available() is not None, reason=f"seccomp: {seccomp.available()}"),
    pytest.mark.skipif(_no_namespaces() is not None,
                       reason=f"the kernel refuses the worker's namespaces: {_no_namespaces()}"),
]

# A Python every worker user can start (this one may live in root's 0700 home).
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
# A marker no other process on the machine has in its command line.
MARK = str(900_000 + os.getpid() % 90_000)


@dataclass
class Host:
    """What the attacks aim at on the host: a UNIX socket in /tmp and one in /run (mode 0777),
    a TCP listener on loopback (another conch server's API, say), one on every address (the
    host's own address), a UDP socket on loopback; each records what reached it."""

    unix_paths: list[str] = field(default_factory=list)
    tcp_port: int = 0
    udp_port: int = 0
    reached: list[str] = field(default_factory=list)
    _socks: list[socket.socket] = field(default_factory=list)

    def close(self) -> None:
        for sock in self._socks:
            sock.close()
        for path in self.unix_paths:
            with _suppress():
                os.unlink(path)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


def _own_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # nothing is sent: only the route is looked up
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    found = Host()

    def accept(sock: socket.socket, name: str) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            found.reached.append(name)
            conn.close()

    for where in ("/tmp", "/run"):
        path = f"{where}/conch-attack-{os.getpid()}.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, 0o777)
        sock.listen()
        found.unix_paths.append(path)
        found._socks.append(sock)
        threading.Thread(target=accept, args=(sock, path), daemon=True).start()
    tcp = socket.socket()
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("0.0.0.0", 0))  # loopback and the host's own address
    tcp.listen()
    found.tcp_port = int(tcp.getsockname()[1])
    found._socks.append(tcp)
    threading.Thread(target=accept, args=(tcp, "tcp"), daemon=True).start()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", 0))
    found.udp_port = int(udp.getsockname()[1])
    found._socks.append(udp)

    def receive() -> None:
        while True:
            try:
                udp.recvfrom(100)
            except OSError:
                return
            found.reached.append("udp")

    threading.Thread(target=receive, daemon=True).start()
    yield found
    found.close()


def _base(parent: str | None) -> Path:
    path = Path(tempfile.mkdtemp(prefix="conch-attack-", dir=parent))
    path.chmod(0o755)
    return path


# allow_process, allow_network, where the workspace is: beneath /tmp (the host's socket
# directory stays visible; seccomp refuses UNIX sockets) or elsewhere (/var/lib: the
# worker's mount namespace covers /tmp and /run).
CONFIGS = [
    pytest.param((False, False, "/tmp"), id="process-off-network-off"),
    pytest.param((True, False, "/tmp"), id="process-on-network-off"),
    pytest.param((False, True, "/var/lib"), id="process-off-network-on"),
    pytest.param((True, True, "/var/lib"), id="process-on-network-on"),
    pytest.param((True, False, "/var/lib"), id="process-on-network-off-covered"),
]


@pytest.fixture(scope="module", params=CONFIGS)
def server(request: pytest.FixtureRequest) -> Iterator[AgentServer]:
    process, network, parent = request.param
    if network and slirp.unavailable() is not None:
        pytest.skip(f"no user-mode network stack: {slirp.unavailable()}")
    if not os.path.isdir(parent):
        pytest.skip(f"no {parent} here")
    base = _base(parent)
    running = start_agent_server(base / "data", language_checks=False, workspace=base / "ws",
                                 workers=1, allow_process=process, allow_network=network,
                                 wall_time_s=15.0)
    try:
        yield running
    finally:
        running.stop()
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _run(server: AgentServer, command: str, **limits: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"command": command}
    if limits:
        payload["limits"] = limits
    with server.client() as c:
        body = c.post("/api/v1/execute", json=payload).json()
    assert isinstance(body, dict)
    return body


def _still_serving(server: AgentServer) -> None:
    with server.client() as c:
        started = time.perf_counter()
        assert c.get("/health").status_code == 200
        assert time.perf_counter() - started < 0.5
        assert c.post("/api/v1/execute", json={"command": "1 + 1"}).json()["result"] == "2"


def _python(server: AgentServer, code: str, **limits: Any) -> dict[str, Any] | None:
    """Run ``code`` in a Python started by ``run_process``: its output, or ``None`` where
    the command could not even start (``allow_process`` off: Landlock refuses the exec)."""
    body = _run(server, f"run_process({json.dumps(PYTHON)}, [\"-c\", {json.dumps(code)}])",
                **limits)
    if not server.settings.allow_process:
        assert body["success"] is False and body["error"]["kind"] == "PermissionError", body
        return None
    assert body["success"] is True, body["error"]
    return json.loads(body["result"])  # type: ignore[no-any-return]


def test_every_new_layer_is_in_force(server: AgentServer) -> None:
    with server.client() as c:
        layers = c.get("/health", params={"detail": "true"}).json()["sandbox"]["layers"]
    for name in ("landlock", "seccomp", "user", "uid_range", "pid_namespace",
                 "network_namespace", "files"):
        assert layers[name]["active"], (name, layers[name])
    assert "PID 1" in layers["pid_namespace"]["detail"]
    assert "sandbox_uids 60000-60999" in layers["uid_range"]["detail"]
    if server.settings.allow_network:
        assert layers["network_stack"]["active"] and "slirp4netns" in layers["network_stack"]["detail"]
    else:
        assert "only its own loopback" in layers["network_namespace"]["detail"]


# 1 -----------------------------------------------------------------------------------------


def test_a_command_cannot_lift_its_limits(server: AgentServer) -> None:
    code = """
import resource as r
for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_FSIZE"):
    which = getattr(r, name)
    try:
        r.setrlimit(which, (r.RLIM_INFINITY, r.RLIM_INFINITY))
        print(name, "RAISED")
    except (ValueError, OSError) as exc:
        print(name, "refused", exc)
print("CORE", r.getrlimit(r.RLIMIT_CORE))
try:
    block = bytearray(1200 * 2**20)
    print("ALLOCATED", len(block))
except MemoryError:
    print("MemoryError")
"""
    out = _python(server, code)
    if out is not None:
        assert "RAISED" not in out["stdout"] and "ALLOCATED" not in out["stdout"], out
        assert out["stdout"].count("refused") == 5 and "MemoryError" in out["stdout"], out
        assert "CORE (0, 0)" in out["stdout"], out
    _still_serving(server)


# 2 -----------------------------------------------------------------------------------------


def _left(seconds: str) -> list[str]:
    done = subprocess.run(["pgrep", "-f", f"^sleep {seconds}$"], capture_output=True,
                          text=True, check=False)
    return done.stdout.split()


def _detached(seconds: str) -> str:
    """A command that leaves its session and its output behind (so that run_process need
    not wait for it) and sleeps."""
    script = f"exec sleep {seconds} </dev/null >/dev/null 2>&1"
    return f'run_process("setsid", ["-f", "sh", "-c", "{script}"])'


def test_a_command_does_not_outlive_its_run_or_its_worker(server: AgentServer) -> None:
    body = _run(server, _detached(f"{MARK}1"))
    if not server.settings.allow_process:
        assert body["error"]["kind"] == "PermissionError", body
        _still_serving(server)
        return
    assert body["success"], body
    time.sleep(0.3)
    assert _left(f"{MARK}1") == [], "a command outlived the run that started it"
    # The worker killed mid-run (as the server does on a timeout or a disconnect).
    result: dict[str, Any] = {}

    def run() -> None:
        result.update(_run(server, _detached(f"{MARK}2") + "; sleep(20000)"))

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 10
    while not _left(f"{MARK}2") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _left(f"{MARK}2"), "the command did not start"
    victim = server.pool.busy_pids()[0]
    os.kill(victim, signal.SIGKILL)
    thread.join(30)
    assert result.get("success") is False, result
    deadline = time.monotonic() + 5
    while _left(f"{MARK}2") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _left(f"{MARK}2") == [], "a command outlived its worker"
    _still_serving(server)


# 3 (two servers) --------------------------------------------------------------------------


def test_two_servers_cannot_starve_each_others_processes(tmp_path: Path) -> None:
    base = _base(None)
    bomb = 'run_process("sh", ["-c", "for i in $(seq 200); do sleep 4 & done; wait"])'

    async def run() -> tuple[Any, list[Any], set[int], set[int]]:
        pools = [SandboxPool(Settings(data_dir=base / f"data-{name}", workspace=base / f"ws-{name}",
                                      workers=2, allow_process=True, worker_pids_max=32,
                                      wall_time_s=20.0))
                 for name in ("b", "c")]
        for pool in pools:
            await pool.start()
        try:
            b, c = pools
            uids = [{_uid(pid) for pid in pool.worker_pids()} for pool in pools]
            bombing = asyncio.create_task(b.run(Job("program", source=bomb)))
            await asyncio.sleep(1.0)  # the bomb has forked what it could
            echoes = [await c.run(Job("program", source='run_process("echo", ["still here"])'))
                      for _ in range(3)]
            return await bombing, echoes, uids[0], uids[1]
        finally:
            for pool in pools:
                await pool.close()

    try:
        bombed, echoes, uids_b, uids_c = asyncio.run(run())
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    assert not uids_b & uids_c and 0 not in uids_b | uids_c, (uids_b, uids_c)
    result = json.loads(bombed.result)
    assert "fork" in result["stderr"].lower() or "resource" in result["stderr"].lower(), result
    for echo in echoes:
        assert echo.success and json.loads(echo.result)["stdout"] == "still here\n", echo


def _uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(pid)


# 4 -----------------------------------------------------------------------------------------


def test_host_unix_sockets_are_unreachable(server: AgentServer, host: Host) -> None:
    code = f"""
import socket
for path in {host.unix_paths!r}:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        print(path, "CONNECTED")
    except OSError as exc:
        print(path, type(exc).__name__)
"""
    before = list(host.reached)
    out = _python(server, code)
    if out is not None:
        assert "CONNECTED" not in out["stdout"], out
        covered = not str(server.workspace).startswith("/tmp/")
        # Hidden by the worker's mount namespace, else refused by seccomp.
        kind = "FileNotFoundError" if covered else "PermissionError"
        assert out["stdout"].count(kind) == 2, out
    assert host.reached == before
    _still_serving(server)


# 5, 6, 7 ---------------------------------------------------------------------------------


def test_udp_reaches_no_host_port(server: AgentServer, host: Host) -> None:
    port = _free_udp_port()
    code = f"""
import socket, time
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", {port}))
    s.settimeout(4)
    print("bound inside", flush=True)
    try:
        print("RECEIVED", s.recvfrom(100))
    except OSError as exc:
        print("nothing arrived", type(exc).__name__)
except OSError as exc:
    print("bind", type(exc).__name__)
for address in ("127.0.0.1", {_own_address()!r}):
    try:
        t = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        t.sendto(b"x", (address, {host.udp_port}))
        print("sent", address)
    except OSError as exc:
        print("send", address, type(exc).__name__)
"""
    before = list(host.reached)
    answer: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: answer.update(out=_python(server, code)))
    thread.start()
    time.sleep(1.5)  # the command has bound its port, and waits
    # While it holds it: the host's port is free, and what is sent to it reaches the host.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as mine:
        mine.bind(("0.0.0.0", port))
    for address in ("127.0.0.1", _own_address()):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(b"from the host", (address, port))
    thread.join(30)
    out = answer.get("out")
    if out is not None:
        assert "RECEIVED" not in out["stdout"], out
        if not server.settings.allow_network:
            assert "bound inside" not in out["stdout"] and "sent" not in out["stdout"], out
    time.sleep(0.3)
    assert "udp" not in host.reached[len(before):], "a datagram reached the host"
    _still_serving(server)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def test_local_services_are_unreachable(server: AgentServer, host: Host) -> None:
    targets = [("127.0.0.1", host.tcp_port), (_own_address(), host.tcp_port),
               ("10.255.255.1", 80), ("169.254.169.254", 80)]
    code = f"""
import socket
for address, port in {targets!r}:
    try:
        socket.create_connection((address, port), timeout=3)
        print(address, "CONNECTED")
    except OSError as exc:
        print(address, type(exc).__name__)
"""
    before = list(host.reached)
    out = _python(server, code)
    if out is not None:
        assert "CONNECTED" not in out["stdout"], out
        if server.settings.allow_network:
            # The namespace's routes: the host's loopback is the worker's own (nothing
            # listens there), every other address is prohibited.
            assert out["stdout"].count("PermissionError") == 3, out
    for address, port in targets[:2]:
        body = _run(server, f'http_get("http://{address}:{port}/api/v1/execute")')
        assert body["success"] is False, body
        assert body["error"]["kind"] in ("PermissionError", "IOError"), body
    assert host.reached == before, "a local service was reached"
    _still_serving(server)


def test_the_network_still_goes_out_where_allowed(tmp_path: Path) -> None:
    """With allow_network the stack carries traffic out: the package index this machine
    reaches (through an address that network_allow must then list, as the language's
    policy requires too)."""
    if slirp.unavailable() is not None:
        pytest.skip(f"no user-mode network stack: {slirp.unavailable()}")
    try:
        infos = socket.getaddrinfo("pypi.org", 443, socket.AF_INET, socket.SOCK_STREAM)
        socket.create_connection(infos[0][4][:2], timeout=5).close()
    except OSError as exc:
        pytest.skip(f"this machine reaches no outside host: {exc}")
    address = str(infos[0][4][0])
    base = _base("/var/lib")
    server = start_agent_server(base / "data", language_checks=False, workspace=base / "ws",
                                workers=1, allow_process=True, allow_network=True,
                                network_allow=[address])
    try:
        code = ("import socket; s = socket.create_connection(('pypi.org', 443), timeout=10); "
                "print('connected', s.getpeername()[0])")
        out = _python(server, code)
        assert out is not None and f"connected {address}" in out["stdout"], out
        _still_serving(server)
    finally:
        server.stop()
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_the_model_effect_reaches_the_inference_server_only(host: Host) -> None:
    """Network off, model on: the worker reaches ``models_url`` (a server on the host's
    loopback) through the relay in its namespace, and no other port there."""
    import http.server

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"data": []}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    models = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=models.serve_forever, daemon=True).start()
    port = models.server_address[1]
    base = _base(None)
    server = start_agent_server(base / "data", language_checks=False, workspace=base / "ws",
                                workers=1, models_url=f"http://127.0.0.1:{port}/v1")
    try:
        body = _run(server, f'http_get("http://127.0.0.1:{port}/v1/models")')
        assert body["success"], body
        answer = json.loads(body["result"])
        assert answer["status"] == 200 and answer["body"] == '{"data": []}', answer
        before = list(host.reached)
        body = _run(server, f'http_get("http://127.0.0.1:{host.tcp_port}/")')
        assert body["error"]["kind"] == "PermissionError", body
        assert host.reached == before
        _still_serving(server)
    finally:
        server.stop()
        models.shutdown()
        subprocess.run(["rm", "-rf", str(base)], check=False)


# 8 -----------------------------------------------------------------------------------------


def test_the_database_and_config_are_not_readable(server: AgentServer) -> None:
    data = server.settings.data_dir
    db = data / "conch.db"
    config = data / "conch.toml"
    write_private(config, 'api_key = "sk-the-server-key"\n')
    assert oct(db.stat().st_mode & 0o777) == oct(0o600)
    assert oct(config.stat().st_mode & 0o777) == oct(0o600)
    assert oct(data.stat().st_mode & 0o777) == oct(0o711)
    for path in data.glob("conch.db-*"):
        assert path.stat().st_mode & 0o077 == 0, path
    ws = server.workspace
    for name, target in (("planted-db", db), ("planted-config", config)):
        with _suppress():
            os.unlink(ws / name)
        os.link(target, ws / name)
        body = _run(server, f'cat("{name}")')
        assert body["success"] is False and body["error"]["kind"] == "PermissionError", body
        assert "sk-the-server-key" not in str(body)
    _still_serving(server)


def test_strict_refuses_a_readable_database(tmp_path: Path) -> None:
    base = _base(None)
    try:
        data = base / "data"
        data.mkdir()
        (data / "conch.db").write_text("")
        (data / "conch.db").chmod(0o644)
        settings = Settings(data_dir=data, workspace=base / "ws", workers=1, sandbox="strict")

        async def start() -> None:
            pool = SandboxPool(settings)
            try:
                await pool.start()
            finally:
                await pool.close()

        with pytest.raises(SandboxUnavailable, match=r"conch\.db is mode 0644"):
            asyncio.run(start())
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


# Without the namespaces ------------------------------------------------------------------

_WITHOUT_NAMESPACES = """
import asyncio, json, socket, subprocess, sys, time
from pathlib import Path
from conch.config import Settings
from conch.sandbox.jobs import Job
from conch.sandbox.pool import SandboxPool

base, mark, sock = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
settings = Settings(data_dir=base / "data", workspace=base / "ws", workers=1, allow_process=True)
pool = SandboxPool(settings, language_checks=False)
probe = ("import socket; s = socket.socket(socket.AF_UNIX); "
         f"s.connect({sock!r}); print('CONNECTED')")

async def main():
    await pool.start()
    try:
        out = {name: layer.active for name, layer in pool.layers.items()}
        detached = f"exec sleep {mark} </dev/null >/dev/null 2>&1"
        await pool.run(Job("program", source=f'run_process("setsid", ["-f", "sh", "-c", "{detached}"])'))
        time.sleep(0.3)
        out["left"] = subprocess.run(["pgrep", "-f", f"^sleep {mark}$"], capture_output=True,
                                     text=True).stdout.split()
        unix = await pool.run(Job("program", source=f'run_process("python3", ["-c", {json.dumps(probe)}])'))
        out["unix"] = json.loads(unix.result)
        out["next"] = (await pool.run(Job("program", source="1 + 1"))).result
        return out
    finally:
        await pool.close()

print(json.dumps(asyncio.run(main())))
"""


def _drop_sys_admin() -> None:
    # PR_CAPBSET_DROP, CAP_SYS_ADMIN: root without it, as in a default Docker container.
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(24, 21, 0, 0, 0) != 0:
        os._exit(3)


def test_without_namespaces_the_fallbacks_hold(host: Host) -> None:
    """Root without ``CAP_SYS_ADMIN``: no namespaces, so seccomp refuses UNIX sockets and a
    worker with a uid of its own ends every process of that uid after each run."""
    base = _base(None)
    source = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [source, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    try:
        done = subprocess.run([sys.executable, "-c", _WITHOUT_NAMESPACES, str(base), f"{MARK}3",
                               host.unix_paths[0]], preexec_fn=_drop_sys_admin, env=env,
                              capture_output=True, text=True, timeout=180, check=False)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    if done.returncode == 3:
        pytest.skip("CAP_SETPCAP is needed to drop CAP_SYS_ADMIN from the bounding set")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["user"] and report["uid_range"], report
    assert not report["pid_namespace"] and not report["network_namespace"], report
    assert report["left"] == [], "a command outlived its run"
    assert "CONNECTED" not in report["unix"]["stdout"], report["unix"]
    assert "PermissionError" in report["unix"]["stderr"], report["unix"]
    assert report["next"] == "2"


# 9 -----------------------------------------------------------------------------------------


def test_a_deeply_nested_pipeline_input_is_a_json_400(server: AgentServer) -> None:
    depth = 200_000
    body = b'{"steps": ["_"], "input": ' + b"[" * depth + b"]" * depth + b"}"
    for path in ("/api/v1/pipeline", "/api/v1/execute"):
        sent = body if path.endswith("pipeline") else (
            b'{"command": "1", "limits": ' + b"[" * depth + b"]" * depth + b"}")
        with server.client() as c:
            answer = c.post(path, content=sent, headers={"content-type": "application/json"})
        assert answer.status_code == 400, (path, answer.status_code, answer.text[:200])
        assert answer.headers["content-type"].startswith("application/json"), path
        assert "recursion" in answer.text, answer.text[:300]
    _still_serving(server)


def test_run_process_feeds_stdin_to_a_slow_command(server: AgentServer) -> None:
    if not server.settings.allow_process:
        pytest.skip("run_process needs allow_process")
    text = "line one\nline two\n" * 1000
    body = _run(server, f'run_process("sh", ["-c", "sleep 0.6; cat"], {json.dumps(text)})')
    assert body["success"], body["error"]
    out = json.loads(body["result"])
    assert out["code"] == 0 and out["stdout"] == text, out["stderr"]
    _still_serving(server)
