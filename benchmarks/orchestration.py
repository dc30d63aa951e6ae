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

Agents: checkpoints and approvals (issue 20; ``--agents-only`` runs just these), every server
a ``conch serve`` process on SQLite against the scripted model (it answers at once):
- checkpoint overhead: tasks/s of 20 concurrent 10-step tasks (9 calls of the pure ``len``,
  then a final answer), from the first ``POST /tasks`` to the last task's ``complete``
  event; this tree's server against conch at the parent of the commit that added
  checkpoints (its ``src`` taken with ``git archive``), both up at once, measured in
  alternation, the median of 5 rounds each (and CPU per step, from /proc). Target: with
  >= 0.9x without.
- resume latency: a task is killed (SIGKILL of its server) while its 4th model request is in
  flight; the server restarts on the same data directory; the time from its first ``200`` to
  ``/health`` to the resumed task's first new step (its event, on the task's stream).
  Target: <= 1 s.
- approval round trip: one task whose 20 ``len`` calls each ask (``{"tools": {"len":
  "ask"}}``); at each ``interrupt`` event, the time from sending ``POST .../approve`` to the
  approved call's ``step`` event. Target: p50 <= 50 ms.

Agents: live deltas (issue 35; ``--deltas-only`` runs just these), the same servers and model:
- tasks no one watches: the checkpoint-overhead batch (20 concurrent 10-step tasks), this
  tree's server against conch at the parent of the commit that added live deltas
  (``src/conch/orchestration/live.py``), in alternation, 5 rounds each: tasks/s and CPU per
  step (no target: on a shared machine two servers running the same code differ by 25%).
- a watched task: one task of 20 ``len`` steps and a final answer, with a subscriber that
  asked for deltas (the model streams each reply in 3-character chunks, as fast as it can)
  and without one: the median step ``elapsed_ms`` (steps 1-20; the first reply is held
  until the subscriber has joined), 3 rounds each, and the live events it got.
- the loop's own cost per step, in-process, without the model, the sandbox or the database
  (which the batch above includes, and whose noise on a shared machine hides a few
  percent): ``run_loop`` with a model and a tool that answer at once, 200 tasks of 50 steps
  in each protocol, this tree against the same base (a process each, alternated, best of
  5); and what a task run adds to each model turn of a task no one watches (the live
  bookkeeping and the retry wrapper: ``TaskRun._ask`` against calling the model directly).
  Target: the cost per step does not grow: the loop alone within 5% of the base's, and the
  task run's addition under 1% of the CPU a step costs end to end.
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

    from testsupport.scripted_model import ScriptedModel, final, tool
    from testsupport.servers import start_process_server

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


# -- agents: checkpoints and approvals (issue 20) -----------------------------------------

TASKS = "/api/v1/orchestration/tasks"
AGENT_TASKS = 20  # concurrent tasks per overhead round
AGENT_ROUNDS = 5  # overhead rounds per server
RESUME_ROUNDS = 5
APPROVALS = 20
# The commit that added checkpoints; "without" is conch at its parent.
CHECKPOINTS_FILE = "src/conch/orchestration/checkpoints.py"


def _serve(src: Path, data_dir: Path, log: Path, **conch: str) -> tuple[subprocess.Popen[bytes], str, float]:  # fmt: skip
    """``conch serve`` from ``src`` on ``data_dir``: its process, URL and the time
    (``perf_counter``) of its first ``200`` to ``/health`` (asked every 10 ms)."""
    import httpx

    sys.path.insert(0, str(ROOT))
    from testsupport.servers import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCH_")}
    env.update({"PYTHONPATH": str(src), "CONCH_DATA_DIR": str(data_dir),
                "CONCH_CONFIG": str(data_dir / "none.toml")})  # fmt: skip
    env.update({f"CONCH_{k.upper()}": v for k, v in conch.items()})
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conch.cli.main", "serve", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    with httpx.Client(timeout=2) as c:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"conch serve exited: {log.read_text()[-2000:]}")
            try:
                if c.get(url + "/health").status_code == 200:
                    return proc, url, time.perf_counter()
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("conch serve did not start")
            time.sleep(0.01)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class _Events:
    """A task's event stream read in a thread: ``(arrival perf_counter, event, data)``."""

    def __init__(self, url: str, task_id: str, after: int = 0) -> None:
        import queue
        import threading

        self.queue: queue.Queue[tuple[float, str, Any]] = queue.Queue()
        self.last_id = after
        self._url = f"{url}{TASKS}/{task_id}/events?last_event_id={after}"
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        import httpx

        name, data = "message", ""
        try:
            with httpx.stream("GET", self._url, timeout=None) as r:
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("id: "):
                        self.last_id = int(line[4:])
                    elif line.startswith("data: "):
                        data = line[6:]
                    elif not line:
                        self.queue.put((time.perf_counter(), name, json.loads(data)))
                        name, data = "message", ""
        except Exception as exc:  # the server was killed: the reader ends
            self.queue.put((time.perf_counter(), "closed", repr(exc)))

    def wait(self, done: Any, timeout: float = 60) -> tuple[float, str, Any]:
        """The first event ``done(name, data)`` accepts."""
        deadline = time.monotonic() + timeout
        while True:
            at, name, data = self.queue.get(timeout=max(0.01, deadline - time.monotonic()))
            if done(name, data):
                return at, name, data
            if name in ("complete", "error", "closed"):
                raise RuntimeError(f"the task ended before the awaited event: {name} {data}")


def _old_src(tmp: Path, added_file: str = CHECKPOINTS_FILE) -> tuple[Path, str]:
    """conch's ``src`` at the parent of the commit that added ``added_file``, and its commit."""
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%h", "--", added_file],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()[-1]  # fmt: skip
    parent = subprocess.run(
        ["git", "rev-parse", "--short", f"{added}^"], cwd=ROOT, capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip
    archive = subprocess.run(["git", "archive", parent, "src"], cwd=ROOT, capture_output=True, check=True)  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
    return tmp / "src", parent


def _cpu_s(pid: int) -> float | None:
    """CPU seconds used so far by a process and its children (the sandbox workers); None
    where ``/proc`` cannot say."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids = [pid, *map(int, f.read().split())]
        total = 0
        for p in pids:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None


def _batch(url: str, goal: str, n: int, pid: int | None = None) -> tuple[float, float | None]:
    """Seconds from the first of ``n`` concurrent task POSTs to the last one's end, and the
    CPU seconds the server ``pid`` used meanwhile."""
    import httpx

    cpu = _cpu_s(pid) if pid else None
    with httpx.Client(base_url=url, timeout=120) as c:
        started = time.perf_counter()
        ids = [
            c.post(TASKS, json={"goal": goal, "tools": ["len"], "max_steps": 12}).json()["id"]
            for _ in range(n)
        ]
        for task_id in ids:  # a finished task's stream replays and ends at once
            with c.stream("GET", f"{TASKS}/{task_id}/events") as r:
                for line in r.iter_lines():
                    if line in ("event: complete", "event: error"):
                        break
        elapsed = time.perf_counter() - started
        after = _cpu_s(pid) if pid else None
        for task_id in ids:
            record = c.get(f"{TASKS}/{task_id}").json()
            if record["status"] != "succeeded" or len(record["steps"]) != 10:
                raise RuntimeError(f"task {task_id}: {record['status']}, {len(record['steps'])} steps")  # fmt: skip
    return elapsed, (after - cpu if after is not None and cpu is not None else None)


def checkpoint_overhead(model: Any, tmp: Path, added_file: str = CHECKPOINTS_FILE) -> dict[str, Any]:  # fmt: skip
    from testsupport.scripted_model import final, tool

    goal = model.script_by_position(
        "bench checkpoints", *[tool("len", value=[1, 2, 3]) for _ in range(9)], final("done")
    )
    old_src, parent = _old_src(tmp / "old", added_file)
    servers = {}
    try:
        for name, src in (("with", SRC), ("without", old_src)):
            proc, url, _ = _serve(src, tmp / f"data-{name}", tmp / f"{name}.log", models_url=model.v1)  # fmt: skip
            servers[name] = (proc, url)
            _batch(url, goal, AGENT_TASKS)  # warm: sandbox workers, imports, SQLite
        rates: dict[str, list[float]] = {"with": [], "without": []}
        cpu: dict[str, list[float]] = {"with": [], "without": []}
        for i in range(AGENT_ROUNDS):
            for name in ("with", "without") if i % 2 == 0 else ("without", "with"):
                proc, url = servers[name]
                seconds, used = _batch(url, goal, AGENT_TASKS, proc.pid)
                rates[name].append(AGENT_TASKS / seconds)
                if used is not None:
                    cpu[name].append(1000 * used / (AGENT_TASKS * 10))
    finally:
        for proc, _ in servers.values():
            _stop(proc)
    with_, without = statistics.median(rates["with"]), statistics.median(rates["without"])
    return {"with": with_, "without": without, "ratio": with_ / without, "rounds": rates,
            "without_commit": parent,
            "cpu_ms_per_step": {k: statistics.median(v) for k, v in cpu.items() if v}}  # fmt: skip


def resume_latency(model: Any, tmp: Path) -> dict[str, Any]:
    import httpx

    from testsupport.scripted_model import final, tool

    data, log = tmp / "data-resume", tmp / "resume.log"
    latencies, startups = [], []
    proc, url, _ = _serve(SRC, data, log, models_url=model.v1)
    try:
        for i in range(RESUME_ROUNDS):
            # The 4th model request hangs the first time it is asked: the server is killed
            # then; the resumed task asks it again and is answered at once.
            goal = model.script_by_position(
                f"bench resume {i}",
                *[tool("len", value=[1, 2, 3]) for _ in range(3)],
                {"delay_first": 60, "content": tool("len", value=[1, 2, 3])},
                *[tool("len", value=[1, 2, 3]) for _ in range(2)],
                final("done"),
            )
            asked = len(model.requests_for(goal))
            with httpx.Client(base_url=url, timeout=60) as c:
                task_id = c.post(TASKS, json={"goal": goal, "tools": ["len"], "max_steps": 10}).json()["id"]  # fmt: skip
                deadline = time.monotonic() + 60
                while len(model.requests_for(goal)) < asked + 4:  # the 4th is in flight
                    if time.monotonic() > deadline:
                        raise RuntimeError("the task did not reach its 4th model request")
                    time.sleep(0.01)
                time.sleep(0.05)
                steps = len(c.get(f"{TASKS}/{task_id}").json()["steps"])
            proc.kill()
            proc.wait(10)
            spawned = time.perf_counter()
            proc, url, healthy = _serve(SRC, data, log, models_url=model.v1)
            startups.append(healthy - spawned)
            events = _Events(url, task_id)
            at, _, _ = events.wait(lambda n, d, k=steps: n == "step" and d["index"] >= k)
            latencies.append(at - healthy)
            with httpx.Client(base_url=url, timeout=60) as c:
                record = c.get(f"{TASKS}/{task_id}").json()
                while record["status"] in ("pending", "running"):
                    time.sleep(0.05)
                    record = c.get(f"{TASKS}/{task_id}").json()
            if record["status"] != "succeeded" or len(record["steps"]) != 7:
                raise RuntimeError(f"resumed task {task_id}: {record['status']}, {len(record['steps'])} steps")  # fmt: skip
    finally:
        _stop(proc)
    return {"median_s": statistics.median(latencies), "max_s": max(latencies),
            "seconds": latencies, "startup_s": statistics.median(startups)}  # fmt: skip


def approval_round_trip(model: Any, tmp: Path) -> dict[str, Any]:
    import httpx

    from testsupport.scripted_model import final, tool

    goal = model.script_by_position(
        "bench approvals", *[tool("len", value=[1, 2, 3]) for _ in range(APPROVALS)], final("done")
    )
    proc, url, _ = _serve(SRC, tmp / "data-approvals", tmp / "approvals.log", models_url=model.v1)
    trips, answers = [], []
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            task = c.post(TASKS, json={"goal": goal, "tools": ["len"], "max_steps": APPROVALS + 2,
                                       "approvals": {"tools": {"len": "ask"}}}).json()  # fmt: skip
            events = _Events(url, task["id"])
            for i in range(APPROVALS):
                events.wait(lambda n, d: n == "interrupt")
                sent = time.perf_counter()
                r = c.post(f"{TASKS}/{task['id']}/approve")
                answers.append(time.perf_counter() - sent)
                if r.status_code != 200:
                    raise RuntimeError(f"approve: {r.status_code} {r.text}")
                at, _, _ = events.wait(lambda n, d, i=i: n == "step" and d["index"] == i)
                trips.append(at - sent)
            events.wait(lambda n, d: n in ("complete", "error"))
            record = c.get(f"{TASKS}/{task['id']}").json()
            if record["status"] != "succeeded" or len(record["steps"]) != APPROVALS + 1:
                raise RuntimeError(f"approvals task: {record['status']}, {len(record['steps'])} steps")  # fmt: skip
    finally:
        _stop(proc)
    ordered = sorted(trips)
    return {"p50_ms": 1000 * statistics.median(trips),
            "p95_ms": 1000 * ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
            "approve_p50_ms": 1000 * statistics.median(answers), "n": len(trips)}  # fmt: skip


LIVE_FILE = "src/conch/orchestration/live.py"
WATCHED_STEPS = 20
WATCHED_ROUNDS = 3


def watched_task(model: Any, tmp: Path) -> dict[str, Any]:
    """Step times of one 21-step task with and without a subscriber asking for deltas."""
    import httpx

    from testsupport.scripted_model import final, tool

    proc, url, _ = _serve(SRC, tmp / "data-watched", tmp / "watched.log", models_url=model.v1)
    step_ms: dict[str, list[float]] = {"watched": [], "unwatched": []}
    live_events: list[int] = []
    try:
        for i in range(2 * WATCHED_ROUNDS):
            mode = ("watched", "unwatched")[i % 2]
            goal = model.script_by_position(
                f"bench watched {i}",
                # Held until the subscriber has joined: the turns after it stream.
                {"delay_first": 1.0, "content": tool("len", value=[1, 2, 3])},
                *[tool("len", value=[1, 2, 3]) for _ in range(WATCHED_STEPS - 1)],
                final("done"),
            )
            with httpx.Client(base_url=url, timeout=60) as c:
                body = {"goal": goal, "tools": ["len"], "max_steps": WATCHED_STEPS + 2}
                task_id = c.post(TASKS, json=body).json()["id"]
                query = "?deltas=true" if mode == "watched" else ""
                n_live = 0
                with c.stream("GET", f"{TASKS}/{task_id}/events{query}") as r:
                    name = ""
                    for line in r.iter_lines():
                        if line.startswith("event: "):
                            name = line[7:]
                            n_live += name in ("model_start", "delta", "model_end")
                        if name in ("complete", "error") and line.startswith("data: "):
                            break
                record = c.get(f"{TASKS}/{task_id}").json()
            if record["status"] != "succeeded":
                raise RuntimeError(f"watched task: {record['status']} {record['error']}")
            step_ms[mode].append(statistics.median(s["elapsed_ms"] for s in record["steps"][1:]))
            if mode == "watched":
                live_events.append(n_live)
                asked = model.requests_for(goal)
                if not all(q.get("stream") for q in asked[1:]):
                    raise RuntimeError("a watched task's model requests did not stream")
    finally:
        _stop(proc)
    return {k: statistics.median(v) for k, v in step_ms.items()} | {
        "rounds": step_ms, "live_events": live_events,
    }  # fmt: skip


LOOP_COST = r"""
import asyncio, json, sys, time
from conch.orchestration.loop import run_loop
from conch.orchestration.turns import Reply

N_TASKS, STEPS = 200, 50
ACTION = json.dumps({"tool": "len", "args": {"value": [1, 2, 3]}})
FINAL = json.dumps({"final": "done"})
USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}

async def one(protocol):
    turns = 0
    async def chat(messages, constraint):
        nonlocal turns
        turns += 1
        if protocol == "native":
            if turns >= STEPS:
                return Reply("done", dict(USAGE))
            return Reply("", dict(USAGE), [{"id": f"c{turns}", "name": "len",
                                            "arguments": '{"value": [1, 2, 3]}'}])
        return Reply(ACTION if turns < STEPS else FINAL, dict(USAGE))
    async def tool(name, args):
        return {"success": True, "result": 3}
    async def on_step(step):
        pass
    out = await run_loop(protocol, goal="g", tools=["len"], max_steps=STEPS, system="s",
                         chat=chat, call_tool=tool, on_step=on_step)
    assert out.status == "succeeded", out.error

async def main():
    result = {}
    for protocol in ("json", "native"):
        await one(protocol)  # warm
        best = None
        for _ in range(5):
            started = time.process_time()
            for _ in range(N_TASKS):
                await one(protocol)
            per_step = (time.process_time() - started) / (N_TASKS * STEPS) * 1e6
            best = per_step if best is None else min(best, per_step)
        result[protocol] = best
    print(json.dumps(result))

asyncio.run(main())
"""

TASK_RUN_COST = r"""
import asyncio, json, tempfile, time
from pathlib import Path
from conch import db
from conch.config import Settings
from conch.orchestration.runtime import Runtime
from conch.orchestration.task_run import TaskRun
from conch.orchestration.turns import Reply

N = 200_000

async def main():
    with tempfile.TemporaryDirectory() as d:
        settings = Settings(data_dir=Path(d))
        rt = Runtime(settings, db.engine_for(settings.effective_database_url))
        run = TaskRun(rt, None, "task_bench", None, None)
        reply = Reply("{}", {"completion_tokens": 5})
        async def ask(on_delta):
            return reply
        best = {}
        for name in ("direct", "task_run"):
            for _ in range(3):
                started = time.process_time()
                if name == "direct":
                    for i in range(N):
                        await ask(None)
                else:
                    for i in range(N):
                        await run._ask(ask, i)
                us = (time.process_time() - started) / N * 1e6
                best[name] = min(us, best.get(name, us))
        rt.close()
    print(json.dumps({"added_us_per_turn": best["task_run"] - best["direct"], **best}))

asyncio.run(main())
"""


def _in_process(script: str, src: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCH_")}
    env["PYTHONPATH"] = str(src)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def loop_cost(tmp: Path) -> dict[str, Any]:
    """The loop's own CPU per step, this tree and the base; what a task run adds per turn."""
    old_src, parent = _old_src(tmp / "old-loop", LIVE_FILE)
    runs: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
    for i in range(4):
        for name in ("with", "without") if i % 2 == 0 else ("without", "with"):
            runs[name].append(_in_process(LOOP_COST, SRC if name == "with" else old_src))
    per_step = {name: {p: min(r[p] for r in rs) for p in ("json", "native")}
                for name, rs in runs.items()}  # fmt: skip
    return {"us_per_step": per_step, "without_commit": parent,
            "task_run": _in_process(TASK_RUN_COST, SRC)}  # fmt: skip


def delta_runs() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from testsupport.scripted_model import ScriptedModel

    model = ScriptedModel().start()
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            (tmp / "old").mkdir()
            (tmp / "old-loop").mkdir()
            return {
                "loop": loop_cost(tmp),
                "unwatched": checkpoint_overhead(model, tmp, LIVE_FILE),
                "watched": watched_task(model, tmp),
            }
    finally:
        model.stop()


def print_deltas(r: dict[str, Any]) -> None:
    o, w = r["unwatched"], r["watched"]
    ms = o["cpu_ms_per_step"]
    print(f"{'agents: live deltas':<48}{'figure':>12}{'target':>12}  ")
    loop = r["loop"]
    rows: list[tuple[str, str, str, Any]] = []
    for protocol in ("json", "native"):
        this, before = loop["us_per_step"]["with"][protocol], loop["us_per_step"]["without"][protocol]
        rows.append((f"loop alone, {protocol}: this / before ({loop['without_commit']})",
                     f"{this / before:.2f}x", "<= 1.05x", this / before <= 1.05))  # fmt: skip
    added = loop["task_run"]["added_us_per_turn"]
    step_us = 1000 * min(ms.values()) if ms else 1000.0
    rows += [
        ("task run, per unwatched turn: added", f"{added:.2f} us", "< 1% step",
         added < 0.01 * step_us),
        ("unwatched tasks/s, this tree", f"{o['with']:.2f}", "", ""),
        (f"unwatched tasks/s, before ({o['without_commit']})", f"{o['without']:.2f}", "", ""),
    ]  # fmt: skip
    if len(ms) == 2:
        rows.append(("CPU per step, this / before",
                     f"{ms['with']:.2f}/{ms['without']:.2f} ms", "", ""))  # fmt: skip
    rows += [
        ("watched task: step p50", f"{w['watched']:.1f} ms", "", ""),
        ("unwatched task: step p50", f"{w['unwatched']:.1f} ms", "", ""),
    ]
    for name, figure, target, ok in rows:
        verdict = "" if target == "" else ("met" if ok else "MISSED")
        print(f"{name:<48}{figure:>12}{target:>12}  {verdict}")
    rounds = ", ".join(f"{k} " + "/".join(f"{x:.2f}" for x in v) for k, v in o["rounds"].items())
    print(f"(unwatched: tasks/s per round: {rounds}; watched: live events per task "
          f"{w['live_events']}, step p50 per round {w['rounds']}; loop alone, us per step: "
          f"{loop['us_per_step']})")  # fmt: skip


def agent_runs() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from testsupport.scripted_model import ScriptedModel

    model = ScriptedModel().start()
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            (tmp / "old").mkdir()
            return {
                "overhead": checkpoint_overhead(model, tmp),
                "resume": resume_latency(model, tmp),
                "approval": approval_round_trip(model, tmp),
            }
    finally:
        model.stop()


def print_agents(r: dict[str, Any]) -> None:
    o, res, a = r["overhead"], r["resume"], r["approval"]
    rows = [
        ("tasks/s with checkpoints", f"{o['with']:.2f}", "", ""),
        (f"tasks/s without ({o['without_commit']})", f"{o['without']:.2f}", "", ""),
        ("with / without", f"{o['ratio']:.2f}x", ">= 0.9x", o["ratio"] >= 0.9),
        ("resume: /health -> first new step, median", f"{res['median_s'] * 1000:.0f} ms", "<= 1 s",
         res["median_s"] <= 1),
        ("resume: ... max", f"{res['max_s'] * 1000:.0f} ms", "<= 1 s", res["max_s"] <= 1),
        ("approve -> its step, p50", f"{a['p50_ms']:.1f} ms", "<= 50 ms", a["p50_ms"] <= 50),
        ("approve -> its step, p95", f"{a['p95_ms']:.1f} ms", "", ""),
    ]  # fmt: skip
    print(f"{'agents: checkpoints and approvals':<48}{'figure':>12}{'target':>12}  ")
    for name, figure, target, ok in rows:
        verdict = "" if target == "" else ("met" if ok else "MISSED")
        print(f"{name:<48}{figure:>12}{target:>12}  {verdict}")
    rounds = ", ".join(f"{k} " + "/".join(f"{x:.2f}" for x in v) for k, v in o["rounds"].items())
    print(f"(overhead: {AGENT_TASKS} concurrent 10-step tasks, tasks/s per round: {rounds})")
    if len(o["cpu_ms_per_step"]) == 2:
        ms = o["cpu_ms_per_step"]
        print(f"(CPU of the server and its sandbox workers per step, median: with {ms['with']:.2f} "
              f"ms, without {ms['without']:.2f} ms: {ms['without'] / ms['with']:.2f}x the tasks/s "
              "where the CPU is the limit)")  # fmt: skip
    print(f"(resume: {len(res['seconds'])} rounds, "
          + ", ".join(f"{x * 1000:.0f}" for x in res["seconds"])
          + f" ms; restart to /health {res['startup_s']:.2f} s median)")  # fmt: skip
    print(f"(approvals: {a['n']} round trips; the approve request itself answers in "
          f"{a['approve_p50_ms']:.1f} ms p50)")  # fmt: skip


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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    if "--deltas-only" in (argv or []):
        deltas = delta_runs()
        print_deltas(deltas)
        return {"deltas": deltas}
    if "--agents-only" in (argv or []):
        agents = agent_runs()
        print_agents(agents)
        return {"agents": agents}
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
    results["agents"] = agent_runs()
    print_agents(results["agents"])
    results["deltas"] = delta_runs()
    print_deltas(results["deltas"])
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
