"""Two agent servers on one PostgreSQL database and one shared ``sessions_dir``: a session run
on one resumes on the other with its bindings and files, and the lease keeps them from running
it at once (a run meets a session the other is running with ``409`` and ``Retry-After``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from conch.sessions import runtime as runtime_module
from tests.orchestration.pg import postgres_cluster
from testsupport.servers import run_in_session, start_thread_server

pytestmark = pytest.mark.timeout(300)


def test_two_servers_resume_each_others_sessions(tmp_path: Path) -> None:
    shared = tmp_path / "shared-sessions"
    with postgres_cluster(tmp_path) as url:
        common = {"database_url": url, "sessions_dir": shared, "workers": 1, "session_spares": 1,
                  "wall_time_s": 15.0}
        a = start_thread_server(tmp_path / "a", **common)
        b = start_thread_server(tmp_path / "b", **common)
        try:
            with a.client() as ca, b.client() as cb:
                sid = ca.post("/api/v1/sessions", json={}).json()["id"]
                run_in_session(ca, sid, 'let mut x = 1; write("a.txt", "from A")')
                # B waits for A to give the lease back (it does once the session is idle).
                started = time.monotonic()
                assert run_in_session(cb, sid, 'x = x + 1; write("b.txt", "from B"); [x, cat("a.txt")]')[
                    "value"] == [2, "from A"]
                assert time.monotonic() - started < runtime_module.BUSY_WAIT_S + 1
                # A resumes what B made (its warm worker was stale: replaced and restored).
                assert run_in_session(ca, sid, 'x = x + 10; [x, cat("b.txt")]')["value"] == [12, "from B"]
                assert cb.get(f"/api/v1/sessions/{sid}/files/b.txt").text == "from B"

                # While A runs the session, B's run waits, then answers 409 with Retry-After.
                def long_run() -> None:
                    with a.client() as c:
                        c.post("/api/v1/execute", json={"command": "sleep(9000); x",
                                                        "session": sid})

                thread = threading.Thread(target=long_run)
                thread.start()
                time.sleep(0.5)
                busy = cb.post("/api/v1/execute", json={"command": "x", "session": sid})
                assert busy.status_code == 409, busy.text
                assert busy.json()["error"]["kind"] == "Conflict"
                assert int(busy.headers["retry-after"]) >= 1
                assert cb.post(f"/api/v1/sessions/{sid}/pause").status_code == 409
                thread.join(30)
                assert run_in_session(cb, sid, "x")["value"] == 12

                # Deleted on one server, gone on both.
                assert ca.delete(f"/api/v1/sessions/{sid}").status_code == 200
                gone = cb.post("/api/v1/execute", json={"command": "x", "session": sid})
                assert gone.status_code == 404
                assert not (shared / sid).exists()
        finally:
            a.stop()
            b.stop()
