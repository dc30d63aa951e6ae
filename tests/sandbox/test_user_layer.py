"""The user layer where the sandbox user cannot search its way to the workspace, as on a
server run as root with its default workspace beneath ``/root`` (mode 0700): each worker
covers the directory in the way in a mount namespace of its own, runs as the sandbox user,
and finds nothing else of that directory. Where the kernel refuses the namespace, workers
stay root and the layer says why.

The workers run with the language's own path checks off (``language_checks=False``), so
that what a program cannot see is the mount namespace's doing (and Landlock's), not the
language's.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import conch
from conch.config import Settings
from conch.sandbox import identity, mountns, probe
from conch.sandbox.jobs import Job
from conch.sandbox.pool import SandboxPool

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="mount namespaces are Linux's"),
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="needs root: CAP_SYS_ADMIN for the mount namespace, CAP_SETUID "
                              "and CAP_CHOWN for the sandbox user"),
]


def _nobody() -> identity.SandboxUser:
    try:
        return identity.resolve("nobody")
    except LookupError as exc:
        pytest.skip(str(exc))


def _private(parent: str | None) -> tuple[Path, Path]:
    """A directory every user can reach (``base``) holding one that only root can search
    (``private``), beneath ``parent``."""
    base = Path(tempfile.mkdtemp(prefix="conch-userlayer-", dir=parent))
    base.chmod(0o755)
    private = base / "private"
    private.mkdir()
    private.chmod(0o700)
    return base, private


@pytest.fixture(scope="module")
def namespaces() -> Iterator[None]:
    """Skips where this kernel or container refuses the namespace (no CAP_SYS_ADMIN)."""
    base, private = _private(None)
    (private / "ws").mkdir()
    user = _nobody()
    try:
        refused = mountns.check(str(private / "ws"), str(private), user.uid, user.gid)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    if refused is not None:
        pytest.skip(f"no mount namespace here (needs CAP_SYS_ADMIN): {refused}")
    yield


def _interpreter_home() -> str:
    """The outermost directory above this interpreter that the sandbox user cannot search
    (``/root`` for a pyenv Python in root's home)."""
    blocked = identity.first_blocked(os.path.realpath(sys.executable), _nobody())
    if blocked is None:
        pytest.skip("the sandbox user can reach this interpreter: nothing to hide it behind")
    return blocked[0]


def _programs(pool: SandboxPool, *sources: str) -> list[Any]:
    async def run() -> list[Any]:
        await pool.start()
        try:
            return [await pool.run(Job("program", source=s)) for s in sources]
        finally:
            await pool.close()

    return asyncio.run(run())


@pytest.mark.parametrize("where", ["temporary", "beside-the-interpreter"])
def test_a_workspace_beneath_a_private_directory(namespaces: None, where: str) -> None:
    """``beside-the-interpreter``: the covered directory is the one the interpreter is
    installed beneath (root's home, on a default root install), so that every import after
    the drop goes through the descriptors the worker opened before its mount namespace."""
    user = _nobody()
    base, private = _private(_interpreter_home() if where != "temporary" else None)
    hidden = str(private) if where == "temporary" else _interpreter_home()
    data = private / "data"
    data.mkdir()
    (data / "conch.db").write_text("rows")
    (private / "conch.toml").write_text('api_key = "sk-the-server-key"\n')
    # Readable by every user: only the namespace keeps the worker from them.
    for secret in (data / "conch.db", private / "conch.toml"):
        secret.chmod(0o644)
    try:
        # One sandbox user for every worker (no uid range): the one these tests follow.
        settings = Settings(data_dir=data, workers=1, wall_time_s=10.0, sandbox_uids="")
        pool = SandboxPool(settings, language_checks=False)
        answers = _programs(
            pool,
            'cat("/proc/self/status") | lines() | filter(fn(l) => starts_with(l, "Uid:"))',
            'mkdir("notes"); write("notes/today.txt", "kept")',
            'cat("notes/today.txt")',
            f'[exists("{private}/conch.toml"), exists("{data}/conch.db"), '
            f'exists("{data}/workspace/notes/today.txt")]',
            f'cat("{private}/conch.toml")',
            # Imported on first use only (not by the worker's preload).
            'from_toml("a = 1")', "to_yaml({b: 2})", "to_toml({c: 3})", 'hash("x", "sha265")',
            "pwd()",
        )
        layer = pool.layers["user"]
        assert layer.active, layer
        assert f"{user.name} (uid {user.uid}" in layer.detail
        assert f"mount namespace of each worker's own, in which {hidden} " in layer.detail
        (status, wrote, read, seen, secret, toml, yaml, tomli, hint, pwd) = answers
        uid_line = json.loads(status.result)
        assert uid_line == [f"Uid:\t{user.uid}\t{user.uid}\t{user.uid}\t{user.uid}"], uid_line
        assert wrote.success and read.result == "kept", (wrote, read)
        written = data / "workspace" / "notes" / "today.txt"
        assert written.read_text() == "kept"
        assert (written.stat().st_uid, written.parent.stat().st_uid) == (user.uid, user.uid)
        assert json.loads(seen.result) == [False, False, True], seen
        assert secret.error is not None and secret.error.kind == "FileNotFoundError", secret
        assert "sk-the-server-key" not in str(secret)
        assert json.loads(toml.result) == {"a": 1}, toml
        assert yaml.result == "b: 2\n", yaml
        assert tomli.result == "c = 3\n", tomli
        assert hint.error is not None and hint.error.hint == 'did you mean "sha256"?', hint
        assert pwd.result == str(data / "workspace")
        # The worker's namespace was its own: the server still sees everything.
        assert (private / "conch.toml").exists()
        mounts = Path("/proc/self/mountinfo").read_text().split("\n")
        assert not [m for m in mounts if f" {hidden} " in m and "tmpfs" in m], mounts
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_the_probe_names_the_cover_before_the_workspace_exists(namespaces: None) -> None:
    """``conch config show`` and ``conch serve``'s strict check ask before the server has
    made its data directory: what exists of the path is tried."""
    base, private = _private(None)
    try:
        layer, drop = probe.user(Settings(data_dir=private / "data" / "conch"))
        assert layer.active, layer
        assert drop is not None and drop.cover == str(private)
        assert not (private / "data").exists()
        assert probe.probe(Settings(data_dir=private / "data"))["user"] == layer
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


_WITHOUT_SYS_ADMIN = """
import asyncio, json, sys
from pathlib import Path
from conch.config import Settings
from conch.sandbox import probe
from conch.sandbox.jobs import Job
from conch.sandbox.pool import SandboxPool

settings = Settings(data_dir=Path(sys.argv[1]), workers=1)
pool = SandboxPool(settings)

async def main():
    await pool.start()
    try:
        return await pool.run(Job("program", source="1 + 1"))
    finally:
        await pool.close()

envelope = asyncio.run(main())
print(json.dumps({"layer": pool.layers["user"].detail, "active": pool.layers["user"].active,
                  "probe": probe.probe(settings)["user"].detail, "user": pool.config.user,
                  "result": envelope.result}))
"""


def _drop_sys_admin() -> None:
    # PR_CAPBSET_DROP, CAP_SYS_ADMIN: root without it, as in a default Docker container.
    if ctypes.CDLL(None, use_errno=True).prctl(24, 21, 0, 0, 0) != 0:
        os._exit(3)


def test_without_a_mount_namespace_workers_stay_root_and_say_why() -> None:
    base, private = _private(None)
    source = str(Path(conch.__file__).resolve().parents[1])
    env = {**os.environ, "CONCH_SANDBOX_UIDS": "", "PYTHONPATH": os.pathsep.join(
        [source, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    try:
        done = subprocess.run([sys.executable, "-c", _WITHOUT_SYS_ADMIN, str(private / "data")],
                              preexec_fn=_drop_sys_admin, env=env, capture_output=True,
                              text=True, timeout=120, check=False)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    if done.returncode == 3:
        pytest.skip("CAP_SETPCAP is needed to drop CAP_SYS_ADMIN from the bounding set")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert not report["active"] and report["user"] is None and report["result"] == "2"
    assert report["layer"] == report["probe"]
    assert report["layer"].startswith(
        f"workers run as root: nobody cannot reach the workspace ({private} is mode 0700, "
        f"owner uid 0) and no mount namespace: unshare(CLONE_NEWNS): Operation not permitted")
    assert report["layer"].endswith("set `workspace` to a directory it can reach")
