"""A server killed with SIGKILL loses nothing a completed run made: 20 active sessions, their
bindings and files, a run in progress at the moment of the kill; a new server on the same
data directory answers every session as of its last completed run (a real ``conch serve``
process, killed for real)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import httpx
import pytest

from testsupport.servers import run_in_session, start_process_server

pytestmark = pytest.mark.timeout(300)


def test_sigkill_with_twenty_active_sessions_loses_no_completed_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"workers": "1", "session_spares": "2", "wall_time_s": "10"}
    first = start_process_server(data, tmp_path / "first.log", **env)
    ids: list[str] = []
    try:
        with first.client() as c:
            for i in range(20):
                sid = c.post("/api/v1/sessions", json={}).json()["id"]
                ids.append(sid)
                run_in_session(c, sid, f'let mut v = {i}; let tag = "s{i}"; write("f.txt", "{i}")')
                if i % 2 == 0:
                    run_in_session(c, sid, f'v = v + 100; mkdir("d"); write("d/g.txt", "{i}-b")')
            # Every session is active, with a worker of its own.
            active = c.get("/api/v1/sessions", params={"status": "active"}).json()
            assert {s["id"] for s in active} == set(ids)
        # A run in progress when the server dies: what it did is not a completed run.
        started = threading.Event()

        def in_progress() -> None:
            with first.client() as c2:
                started.set()
                with contextlib.suppress(httpx.HTTPError):
                    c2.post("/api/v1/execute", json={
                        "command": "v = -1; let lost = 1; sleep(4000)", "session": ids[1]})

        thread = threading.Thread(target=in_progress)
        thread.start()
        started.wait()
        time.sleep(1.0)
    finally:
        first.kill()
    thread.join(30)

    second = start_process_server(data, tmp_path / "second.log", **env)
    try:
        with second.client() as c:
            for i, sid in enumerate(ids):
                expected_v = i + 100 if i % 2 == 0 else i
                got = run_in_session(c, sid, '[v, tag, cat("f.txt"), exists("d/g.txt")]')["value"]
                assert got == [expected_v, f"s{i}", str(i), i % 2 == 0], (i, got)
                if i % 2 == 0:
                    assert run_in_session(c, sid, 'cat("d/g.txt")')["value"] == f"{i}-b"
            lost = c.post("/api/v1/execute", json={"command": "lost", "session": ids[1]}).json()
            assert lost["error"]["kind"] == "NameError"
            # The files API agrees with the programs.
            assert c.get(f"/api/v1/sessions/{ids[2]}/files/d/g.txt").text == "2-b"
            described = c.get(f"/api/v1/sessions/{ids[0]}").json()
            assert {b["name"] for b in described["bindings"]} == {"v", "tag"}
    finally:
        second.stop()
