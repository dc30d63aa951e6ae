"""Two sessions kept apart by the kernel, not by the language: with the language's own path,
effect and network checks turned off (``language_checks=False``, reachable from Python only),
a program of session A tries to read, write, list and signal what is session B's, and to join
their workspaces with hard and symbolic links, both with conch's builtins and from a command
it starts. What refuses it is the kernel: B's workspace is not in A's mount namespace (a
tmpfs over ``sessions_dir`` holds only A's), A's Landlock domain is A's workspace, A runs as
a uid of its own, in a PID namespace of its own. Each attempt is made on A's own workspace
too, where it must work, so that a refusal is the boundary's and not a broken test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conch.sandbox import landlock, namespaces, seccomp
from tests.web.agent_fixtures import AgentServer, start_agent_server

ROOT = os.geteuid() == 0


def _no_namespaces() -> str | None:
    return namespaces.check("/", [], True, True) if ROOT else None


pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the kernel layers are Linux's"),
    pytest.mark.skipif(not ROOT, reason="needs root: a uid per worker, namespaces"),
    pytest.mark.skipif(landlock.abi_version() < 1, reason="the kernel offers no Landlock"),
    pytest.mark.skipif(seccomp.available() is not None, reason=f"seccomp: {seccomp.available()}"),
    pytest.mark.skipif(_no_namespaces() is not None,
                       reason=f"the kernel refuses the worker's namespaces: {_no_namespaces()}"),
]

PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


@pytest.fixture(scope="module")
def server() -> Iterator[AgentServer]:
    base = Path(tempfile.mkdtemp(prefix="conch-sessions-", dir="/var/tmp"))
    base.chmod(0o755)
    running = start_agent_server(base / "data", language_checks=False, workers=1,
                                 session_spares=2, allow_process=True, wall_time_s=15.0)
    try:
        yield running
    finally:
        running.stop()
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _new(server: AgentServer) -> str:
    with server.client() as c:
        return str(c.post("/api/v1/sessions", json={}).json()["id"])


def _run(server: AgentServer, sid: str, command: str) -> dict[str, Any]:
    with server.client() as c:
        body = c.post("/api/v1/execute", json={"command": command, "session": sid}).json()
    assert isinstance(body, dict)
    return body


def _python(server: AgentServer, sid: str, code: str) -> dict[str, Any]:
    """Run ``code`` in a Python the session's program starts; what it printed, as JSON."""
    body = _run(server, sid, f"run_process({json.dumps(PYTHON)}, [\"-c\", {json.dumps(code)}])")
    assert body["success"], body
    out = json.loads(body["result"])
    assert out["code"] == 0, out
    return json.loads(out["stdout"])  # type: ignore[no-any-return]


_PROBE = """
import json, os, signal
target, victim, own = {target!r}, {victim!r}, {own!r}
out = {{}}
def attempt(name, fn):
    try:
        got = fn()
        out[name] = ["ok", got if isinstance(got, (str, int, list)) else None]
    except OSError as exc:
        out[name] = ["refused", type(exc).__name__]
attempt("read", lambda: open(os.path.join(target, "secret.txt")).read())
attempt("write", lambda: open(os.path.join(target, "planted.txt"), "w").write("pwned"))
attempt("list", lambda: sorted(os.listdir(target)))
attempt("list_parent", lambda: sorted(os.listdir(os.path.dirname(os.path.dirname(target)))))
attempt("hard_link", lambda: os.link(os.path.join(target, "secret.txt"),
                                     os.path.join(own, "linked.txt")))
attempt("symlink", lambda: os.symlink(os.path.join(target, "secret.txt"),
                                      os.path.join(own, "via-link.txt")))
attempt("through_symlink", lambda: open(os.path.join(own, "via-link.txt")).read())
attempt("signal", lambda: os.kill(victim, 0))
print(json.dumps(out))
"""


def _probe(server: AgentServer, sid: str, target: Path, victim: int, own: Path) -> dict[str, Any]:
    return _python(server, sid, _PROBE.format(target=str(target), victim=victim, own=str(own)))


def test_two_sessions_are_kept_apart_by_the_kernel(server: AgentServer) -> None:
    runtime = server.app.state.session_runtime
    dirs = server.app.state.sessions.dirs
    a, b = _new(server), _new(server)
    assert _run(server, b, 'write("secret.txt", "B only")')["success"]
    assert _run(server, a, 'write("secret.txt", "A alone"); mkdir("sub")')["success"]
    ws_a, ws_b = Path(os.path.realpath(dirs.workspace(a))), Path(os.path.realpath(dirs.workspace(b)))
    pid_a, pid_b = runtime.worker_pid(a), runtime.worker_pid(b)
    assert pid_a and pid_b and pid_a != pid_b
    assert os.stat(f"/proc/{pid_a}").st_uid != os.stat(f"/proc/{pid_b}").st_uid

    # The control: every attempt works on A's own workspace.
    control = _probe(server, a, ws_a, pid_a, ws_a / "sub")
    for name in ("read", "write", "list", "hard_link", "symlink", "through_symlink"):
        assert control[name][0] == "ok", (name, control)
    assert control["through_symlink"][1] == "A alone"
    _run(server, a, 'rm("sub", recursive=true); rm("planted.txt"); rm("secret.txt")')

    # A against B: refused by the kernel, not by conch (whose checks are off).
    probe = _probe(server, a, ws_b, pid_b, ws_a)
    for name in ("read", "write", "list", "hard_link", "through_symlink", "signal"):
        assert probe[name][0] == "refused", (name, probe)
    # A symbolic link may be made (it is only a name) but leads nowhere from A.
    assert probe["symlink"][0] == "ok"
    # sessions_dir, as A sees it, holds A alone.
    listed = probe["list_parent"]
    assert listed[0] == "refused" or listed[1] == [ws_a.parent.name], listed
    # conch's own builtins, unchecked, meet the same walls.
    for command in (f'cat("{ws_b}/secret.txt")', f'write("{ws_b}/x.txt", "pwned")',
                    f'ls("{ws_b}")', f'rm("{ws_b}/secret.txt")'):
        body = _run(server, a, command)
        assert not body["success"], (command, body)
    # B is as it was.
    assert sorted(os.listdir(ws_b)) == ["secret.txt"]
    assert (ws_b / "secret.txt").read_text() == "B only"
    # The files API never follows the link A made towards B.
    with server.client() as c:
        r = c.get(f"/api/v1/sessions/{a}/files/via-link.txt")
        assert r.status_code == 400 and "symbolic link" in r.json()["error"]["message"]
        entries = {e["name"]: e["type"] for e in c.get(f"/api/v1/sessions/{a}/files").json()}
        assert entries["via-link.txt"] == "symlink"

    # A paused session holds no process, and its files are no easier to reach.
    with server.client() as c:
        assert c.post(f"/api/v1/sessions/{b}/pause").json()["status"] == "paused"
    assert runtime.worker_pid(b) is None
    again = _probe(server, a, ws_b, pid_b, ws_a)
    for name in ("read", "write", "list", "hard_link", "through_symlink"):
        assert again[name][0] == "refused", (name, again)
    assert (ws_b / "secret.txt").read_text() == "B only"
    # And B, resumed by another worker (another uid), still has its files.
    assert _run(server, b, 'cat("secret.txt")')["result"] == "B only"
