"""``conch keys``: the real executable on the configured database, and a running server
that honours what it does (a key made, changed or revoked applies within a second)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conch import db

CONCH = Path(sys.executable).parent / "conch"

pytestmark = pytest.mark.skipif(not CONCH.exists(), reason="pip install -e . for the script")


def keys(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CONCH), "keys", *args], capture_output=True, text=True, env=env,
                          timeout=60)  # fmt: skip


def _json(r: subprocess.CompletedProcess[str]) -> object:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_keys_commands(env: dict[str, str]) -> None:
    made = _json(keys("create", "ci", "-s", "execute", "-s", "inference", "-t", "acme",
                      "-l", "tokens_per_day=1000", "-l", "runs_per_minute=5", "-m", "local:*",
                      "--json", env=env))  # fmt: skip
    assert isinstance(made, dict)
    key_id, secret = made["id"], made["secret"]
    assert secret.startswith("ck-") and made["tenant"] == "acme"
    assert made["limits"] == {"tokens_per_day": 1000, "runs_per_minute": 5}
    listed = _json(keys("list", "--json", env=env))
    assert isinstance(listed, list) and [k["id"] for k in listed] == [key_id]
    assert secret not in json.dumps(listed)
    plain = keys("list", env=env)
    assert plain.returncode == 0 and "ci" in plain.stdout
    shown = _json(keys("show", key_id, "--json", env=env))
    assert isinstance(shown, dict) and shown["scopes"] == ["execute", "inference"]
    changed = _json(keys("update", key_id, "-l", "tokens_per_day=null", "-s", "execute", "--json", env=env))
    assert isinstance(changed, dict)
    assert changed["limits"] == {"runs_per_minute": 5} and changed["scopes"] == ["execute"]
    usage = _json(keys("usage", key_id, "--json", env=env))
    assert isinstance(usage, dict) and usage["limits"][0]["limit"] == "runs_per_minute"
    rotated = _json(keys("rotate", key_id, "--json", env=env))
    assert isinstance(rotated, dict) and rotated["secret"] != secret
    revoked = _json(keys("revoke", key_id, "--json", env=env))
    assert isinstance(revoked, dict) and revoked["status"] == "revoked"
    assert keys("list", "--active", "--json", env=env).stdout.strip() == "[]"
    # Refusals name the field, exit 1; bad usage exits 2.
    r = keys("create", "x", "-s", "root", env=env)
    assert r.returncode == 1 and "scopes[0]" in r.stderr
    r = keys("show", "key_missing", env=env)
    assert r.returncode == 1 and "no key" in r.stderr
    r = keys("create", "x", "-l", "tokens_per_day", env=env)
    assert r.returncode == 2 and "NAME=VALUE" in r.stderr
    # Every change is in the audit log, as made by the CLI.
    from conch.config import Settings
    from conch.keys import AuditLog

    eng = db.engine_for(Settings(data_dir=Path(env["CONCH_DATA_DIR"])).effective_database_url)
    entries = AuditLog(eng).read(target=f"key:{key_id}").entries
    assert [e.action for e in entries] == ["key.revoked", "key.rotated", "key.changed", "key.created"]
    assert {e.actor_id for e in entries} == {"cli"} and entries[0].actor_name.startswith("cli (")
    db.dispose_all()


def test_a_running_server_honours_the_cli(env: dict[str, str], tmp_path: Path) -> None:
    """A key made with the CLI works on a server sharing the database; revoked with the CLI,
    it is refused within a second. The first key of an install needs no server."""
    from tests.web.agent_fixtures import start_agent_server

    made = _json(keys("create", "service", "-s", "execute", "--json", env=env))
    assert isinstance(made, dict)
    server = start_agent_server(Path(env["CONCH_DATA_DIR"]), admin_key="the-admin")
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {made['secret']}"},
                          timeout=60) as c:  # fmt: skip
            assert c.post("/api/v1/execute", json={"command": "6 * 7"}).json()["value"] == 42
            assert keys("revoke", made["id"], env=env).returncode == 0
            start = time.monotonic()
            while c.post("/api/v1/execute", json={"command": "1"}).status_code != 401:
                assert time.monotonic() - start < 1.0
                time.sleep(0.02)
    finally:
        server.stop()
        db.dispose_all()
