"""Orchestration: workflow steps/s in conch, Prefect 3 and raw Dask, side by side; agent-loop
overhead per step.

Shapes (trivial steps, each returns a small Int):
- fan-out/fan-in: 1 -> 998 -> 1 (1,000 steps);
- chain: 200 steps, each depending on the previous one.

conch: a ``conch serve`` process (SQLite, 2 sandbox workers, defaults otherwise); the time is
from ``POST /workflows`` to the workflow's ``complete`` event, every step durable and run in
the sandbox. Prefect 3: the same DAG as ``@task`` functions in a ``@flow`` with its defaults
(thread pool task runner, its local API and database), timed around the flow call in a
process of its own. Dask: ``dask.delayed`` with the default threaded scheduler, no
persistence (the floor). Agent loop: a task of 20 tool steps against a model server that
answers instantly; the p50 of the steps' ``elapsed_ms`` (model round trip, tool call in the
sandbox, step recorded in the database).

Targets (issue 11): conch >= 10x Prefect's steps/s on both shapes; agent-loop overhead per
step <= 5 ms p50.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
FAN = 998
CHAIN = 200


def fan_workflow() -> dict[str, Any]:
    steps = [{"id": "root", "run": "1"}]
    steps += [{"id": f"s{i}", "depends_on": ["root"], "run": f"{i}"} for i in range(FAN)]
    steps.append({"id": "sink", "depends_on": [f"s{i}" for i in range(FAN)], "run": "len(steps)"})
    return {"name": "fan", "steps": steps}


def chain_workflow() -> dict[str, Any]:
    steps = [{"id": "c0", "run": "0"}]
    steps += [
        {"id": f"c{i}", "depends_on": [f"c{i - 1}"], "run": f"steps.c{i - 1}.result + 1"}
        for i in range(1, CHAIN)
    ]
    return {"name": "chain", "steps": steps}


def conch_runs() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    import httpx
    from tests.orchestration.scripted_model import ScriptedModel, final, tool
    from tests.orchestration.servers import start_process_server

    model = ScriptedModel().start()
    goal = model.script(
        "bench loop", *[tool("len", value=[1, 2, 3]) for _ in range(20)], final("done")
    )
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = start_process_server(Path(tmp) / "data", Path(tmp) / "log", models_url=model.v1)
        try:
            with httpx.Client(base_url=server.url, timeout=600) as c:
                c.post(
                    "/api/v1/orchestration/workflows", json={"steps": [{"id": "warm", "run": "1"}]}
                )
                time.sleep(1)
                for name, body in (("fan", fan_workflow()), ("chain", chain_workflow())):
                    started = time.perf_counter()
                    wf = c.post("/api/v1/orchestration/workflows", json=body).json()
                    with c.stream("GET", f"/api/v1/orchestration/workflows/{wf['id']}/events") as r:
                        for line in r.iter_lines():
                            if line.startswith("event: complete") or line.startswith(
                                "event: error"
                            ):
                                break
                    elapsed = time.perf_counter() - started
                    status = c.get(f"/api/v1/orchestration/workflows/{wf['id']}").json()["status"]
                    out[name] = {"seconds": elapsed, "steps": len(body["steps"]), "status": status}
                task = c.post(
                    "/api/v1/orchestration/tasks",
                    json={"goal": goal, "tools": ["len"], "max_steps": 25},
                ).json()
                while True:
                    record = c.get(f"/api/v1/orchestration/tasks/{task['id']}").json()
                    if record["status"] not in ("pending", "running"):
                        break
                    time.sleep(0.1)
                ms = [s["elapsed_ms"] for s in record["steps"]]
                out["loop"] = {
                    "p50_ms": statistics.median(ms),
                    "steps": len(ms),
                    "status": record["status"],
                }
        finally:
            server.stop()
            model.stop()
    return out


PREFECT = r"""
import json, sys, time
import prefect
from prefect import flow, task

@task
def one(i):
    return i

@task
def count(*xs):
    return len(xs)

@flow
def fan(n):
    root = one.submit(1)
    mids = [one.submit(i, wait_for=[root]) for i in range(n)]
    return count.submit(*mids).result()

@task
def inc(x):
    return x + 1

@flow
def chain(n):
    f = one.submit(0)
    for _ in range(n - 1):
        f = inc.submit(f)
    return f.result()

fan(2)  # start Prefect's local API and database outside the timing
out = {"version": prefect.__version__}
for name, fn, n, steps in (("fan", fan, %(fan)d, %(fan)d + 2), ("chain", chain, %(chain)d, %(chain)d)):
    t = time.perf_counter(); fn(n); out[name] = {"seconds": time.perf_counter() - t, "steps": steps}
print("RESULT " + json.dumps(out))
"""

DASK = r"""
import json, time
import dask
from dask import delayed

def one(i): return i
def count(*xs): return len(xs)
def inc(x): return x + 1

out = {}
t = time.perf_counter()
root = delayed(one)(1)
mids = [delayed(lambda r, i=i: i)(root) for i in range(%(fan)d)]
dask.compute(delayed(count)(*mids))
out["fan"] = {"seconds": time.perf_counter() - t, "steps": %(fan)d + 2}
t = time.perf_counter()
f = delayed(one)(0)
for _ in range(%(chain)d - 1):
    f = delayed(inc)(f)
f.compute()
out["chain"] = {"seconds": time.perf_counter() - t, "steps": %(chain)d}
print("RESULT " + json.dumps(out))
"""


# Prefect 3 pins a FastAPI/pydantic range of its own, and with the FastAPI conch uses its
# local API fails on ``Body(min_items=...)``: it runs from a virtualenv of its own.
PREFECT_REQUIREMENTS = ["prefect>=3,<4", "fastapi<0.116"]


def find_prefect() -> str:
    """The interpreter of Prefect's virtualenv (``.bench-cache/prefect``, made on first use)."""
    from peers import peer_venv

    return str(peer_venv("prefect", PREFECT_REQUIREMENTS, "prefect") / "python")


def peer(script: str, name: str) -> dict[str, Any] | str:
    try:
        python = find_prefect() if name.startswith("Prefect") else sys.executable
    except RuntimeError as exc:
        return f"{name} did not run: {exc}"
    with tempfile.TemporaryDirectory() as home:
        # Prefect's local API starts outside the timing; on a loaded machine it needs more
        # than its default 20 s to answer.
        env = {
            **os.environ,
            "PREFECT_HOME": home,
            "PREFECT_LOGGING_LEVEL": "WARNING",
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        }
        try:
            proc = subprocess.run(
                [python, "-c", script % {"fan": FAN, "chain": CHAIN}],
                capture_output=True, text=True, timeout=1800, env=env,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return f"{name}: timed out"
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])  # type: ignore[no-any-return]
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return f"{name} did not run: {tail[0]}"


def main() -> dict[str, Any]:
    results: dict[str, Any] = {
        "conch": conch_runs(),
        "prefect": peer(PREFECT, "Prefect 3"),
        "dask": peer(DASK, "Dask"),
    }
    print(f"{'shape':<10}{'engine':<12}{'steps':>7}{'seconds':>10}{'steps/s':>11}{'conch x':>10}")
    for shape in ("fan", "chain"):
        c = results["conch"][shape]
        conch_rate = c["steps"] / c["seconds"]
        for engine in ("conch", "prefect", "dask"):
            r = results[engine]
            if isinstance(r, str):
                print(f"{shape:<10}{engine:<12}{r}")
                continue
            rate = r[shape]["steps"] / r[shape]["seconds"]
            ratio = conch_rate / rate
            print(
                f"{shape:<10}{engine:<12}{r[shape]['steps']:>7}{r[shape]['seconds']:>10.2f}{rate:>11.0f}{ratio:>9.2f}x"
            )
    if not isinstance(results["prefect"], str):
        print(f"(prefect = Prefect {results['prefect']['version']}, its defaults)")
    loop = results["conch"]["loop"]
    print(
        f"agent loop: {loop['steps']} steps, p50 {loop['p50_ms']:.1f} ms per step (target <= 5 ms)"
    )
    if not isinstance(results["prefect"], str):
        for shape in ("fan", "chain"):
            c = results["conch"][shape]
            p = results["prefect"][shape]
            ratio = (c["steps"] / c["seconds"]) / (p["steps"] / p["seconds"])
            print(
                f"{shape}: conch/Prefect = {ratio:.1f}x (target >= 10x): {'met' if ratio >= 10 else 'MISSED'}"
            )
    return results


if __name__ == "__main__":
    main()
