"""Load: 200 tasks submitted at once against the scripted model; all finish and ``/health``
keeps answering throughout (within 100 ms, judged on a machine that is not overloaded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import start_process_server

pytestmark = pytest.mark.timeout(300)

API = "/api/v1/orchestration"


def test_200_tasks_and_health_stays_fast(tmp_path: Path, scripted: ScriptedModel) -> None:
    # The server in its own process, as deployed: the test's client threads and the
    # scripted model must not compete with it for one interpreter lock.
    server = start_process_server(
        tmp_path / "data", tmp_path / "server.log", models_url=scripted.v1
    )
    try:
        run_load(server.url, scripted)
    finally:
        server.stop()


def run_load(url: str, scripted: ScriptedModel) -> None:
    goals = [
        scripted.script(f"load task {i}", tool("len", value=list(range(i % 7))), final(str(i)))
        for i in range(200)
    ]
    # /health is probed from a process of its own, so that the test's threads (clients,
    # the scripted model) do not add their own waits to what is measured.
    prober = subprocess.Popen(
        [sys.executable, "-c", PROBE, url],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    try:
        with httpx.Client(base_url=url, timeout=60) as c:

            def submit(goal: str) -> str:
                r = c.post(f"{API}/tasks", json={"goal": goal, "tools": ["len"], "max_steps": 3})
                assert r.status_code == 201, r.text
                return str(r.json()["id"])

            with ThreadPoolExecutor(16) as pool:
                ids = list(pool.map(submit, goals))
            deadline = time.monotonic() + 240
            # Progress from the metrics route (cheap), the records once at the end.
            while time.monotonic() < deadline:
                if c.get(f"{API}/metrics").json()["active_tasks"] == 0:
                    break
                time.sleep(0.25)
            records = {t["id"]: t for t in c.get(f"{API}/tasks", params={"limit": 1000}).json()}
    finally:
        out, _ = prober.communicate("stop\n", timeout=30)
    # Whatever the machine's load: every one of the 200 tasks finished (succeeded), and
    # every /health probe was answered with 200.
    assert len(set(ids)) == 200
    unfinished = {i: records.get(i, {}).get("status") for i in ids}
    unfinished = {i: status for i, status in unfinished.items() if status != "succeeded"}
    assert not unfinished, f"{len(unfinished)} of 200 tasks did not finish: {unfinished}"
    assert prober.returncode == 0, f"the /health prober failed: {out[-2000:]}"
    probe = json.loads(out)
    assert not probe["failures"], f"/health did not answer: {probe['failures'][:5]}"
    latencies = sorted(probe["latencies"])
    assert len(latencies) > 10, "/health was probed too rarely to say it kept answering"
    median, slowest = latencies[len(latencies) // 2], latencies[-1]
    print(
        f"/health under load: {len(latencies)} checks, median {median * 1000:.1f} ms, max {slowest * 1000:.0f} ms"
    )
    # Timings decide nothing on a machine that is itself overloaded: on a shared 2-vCPU
    # machine running other suites every process waits for a core, and the figures then say
    # nothing about the server. Elsewhere the 100 ms target is judged on the median (one
    # descheduled moment must not fail the run) and the maximum is bounded loosely.
    if os.getloadavg()[0] <= (os.cpu_count() or 1):
        assert median < 0.1, f"/health median {median * 1000:.0f} ms"
        assert slowest < 5.0, f"/health took {slowest * 1000:.0f} ms"


PROBE = """
import json, sys, threading, time, httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
latencies, failures = [], []
with httpx.Client(base_url=sys.argv[1], timeout=10) as c:
    c.get("/health")
    while not stop.is_set():
        t = time.perf_counter()
        try:
            status = c.get("/health").status_code
        except httpx.HTTPError as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
        else:
            latencies.append(time.perf_counter() - t)
            if status != 200:
                failures.append(f"status {status}")
        time.sleep(0.02)
print(json.dumps({"latencies": latencies, "failures": failures}))
"""
