"""Sessions (issue 31): a session's first run, warm runs against stateless ones, many idle
sessions, pause and resume of a large state, the cost of saving after a run.

The agent server runs in its own process (uvloop, httptools, no access log, as in
``benchmarks/agent_server.py``, whose minimal keep-alive HTTP/1.1 client this one shares the
shape of); this process is the load generator. The peer is a Jupyter kernel (``ipykernel``)
started and driven by ``jupyter_client``, what self-hosted code interpreters run: from the
current interpreter where both import, else from a virtualenv of their own in ``.bench-cache``
(the ``bench`` extra installs them). Scenarios, and their targets:

- ``create``: ``POST /api/v1/sessions`` then ``execute 1 + 1`` in it, one after the other with
  a pause between (spares refill), and back to back: p50 <= 25 ms, and >= 20x faster than
  starting a Jupyter kernel and executing ``1 + 1``;
- ``warm``: ``execute 1 + 1`` in a warm session (one per client) against stateless
  ``execute 1 + 1``, at 1 and 16 clients, in alternating rounds: >= 0.9x the requests/s;
- ``idle``: 1,000 sessions made and run once, then idle past ``session_idle_s``: no process
  left per idle session, server RSS growth <= 100 MB;
- ``large``: a session holding about 10 MB of bindings, paused and resumed (the first run
  after the pause): p50 <= 100 ms each;
- ``save``: ``n = n + 1`` (saves one small binding) against ``n + 1`` (saves nothing) in a warm
  session, alternating: the difference <= 10 % of the run's time.

``CONCH_BENCH_SCENARIOS=create,warm`` runs a subset; ``CONCH_BENCH_SECONDS`` (2) and
``CONCH_BENCH_ROUNDS`` (3) size the load runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DURATION_S = float(os.environ.get("CONCH_BENCH_SECONDS", "2"))
ROUNDS = int(os.environ.get("CONCH_BENCH_ROUNDS", "3"))
SCENARIOS = os.environ.get("CONCH_BENCH_SCENARIOS", "create,warm,idle,large,save").split(",")
SRC = Path(__file__).resolve().parent.parent / "src"
JUPYTER_REQUIREMENTS = ["jupyter_client>=8", "ipykernel>=6"]

# Run in the peer's interpreter: start a kernel, execute 1 + 1, take the result; N times.
_JUPYTER = """
import json, sys, time
from jupyter_client.manager import start_new_kernel
out = []
for _ in range(int(sys.argv[1])):
    started = time.perf_counter()
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        reply = kc.execute_interactive("1 + 1", timeout=60, output_hook=lambda m: None,
                                       store_history=False)
        assert reply["content"]["status"] == "ok", reply
        out.append(time.perf_counter() - started)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
print(json.dumps(out))
"""


def _start(data_dir: str, **settings: Any) -> tuple[subprocess.Popen[bytes], int]:
    """An agent server with these settings; the pool, the zygote and its spares started."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from agent_server import AGENT_CODE, start_server

    return start_server(AGENT_CODE, data_dir, SRC, settings=settings, settle_s=2.0, wait_s=90)


class Conn:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Conn:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        assert self.reader is not None and self.writer is not None
        data = b"" if body is None else (body if isinstance(body, bytes) else
                                          json.dumps(body).encode())
        self.writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        raw = await self.reader.readexactly(length)
        return status, json.loads(raw) if raw else None


async def _ok(conn: Conn, method: str, path: str, body: Any = None) -> Any:
    status, answer = await conn.request(method, path, body)
    if status >= 400 or (isinstance(answer, dict) and answer.get("success") is False):
        raise RuntimeError(f"{method} {path}: {status} {answer}")
    return answer


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out: list[int] = []
    frontier = [pid]
    while frontier:
        here = frontier.pop()
        kids = [p for p, parent in parents.items() if parent == here]
        out += kids
        frontier += kids
    return out


def _cpu_s(pid: int) -> float:
    """CPU seconds used so far by ``pid`` and every live process under it, with what their
    reaped children used (a session's worker, once ended, is counted by its parent): the
    cost of a scenario, which other load on the machine hardly changes."""
    total = 0.0
    for p in (pid, *_descendants(pid)):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def _p50(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


# -- the scenarios ------------------------------------------------------------------------


async def _create(port: int, pid: int) -> dict[str, Any]:
    conn = await Conn(port).open()
    out: dict[str, Any] = {}
    try:
        for label, pause in (("spaced", 0.3), ("back_to_back", 0.0)):
            times, made = [], []
            cpu = _cpu_s(pid)
            for _ in range(25):
                started = time.perf_counter()
                sid = (await _ok(conn, "POST", "/api/v1/sessions", {}))["id"]
                answer = await _ok(conn, "POST", "/api/v1/execute",
                                   {"command": "1 + 1", "session": sid})
                times.append(time.perf_counter() - started)
                assert answer["result"] == "2", answer
                made.append(sid)
                if pause:
                    await asyncio.sleep(pause)
            await asyncio.sleep(1.0)  # the last spares refilled: their cost is the sessions'
            cpu = _cpu_s(pid) - cpu
            for sid in made:
                await _ok(conn, "DELETE", f"/api/v1/sessions/{sid}")
            out[label] = {"p50_ms": _p50(times), "min_ms": min(times) * 1000,
                          "max_ms": max(times) * 1000, "n": len(times),
                          "cpu_ms_each": cpu / len(times) * 1000}
            await asyncio.sleep(1.0)
    finally:
        conn.close()
    return out


def _jupyter(n: int = 5) -> dict[str, Any]:
    try:
        import ipykernel  # noqa: F401
        import jupyter_client  # noqa: F401

        python = sys.executable
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from peers import peer_venv

        python = str(peer_venv("jupyter", JUPYTER_REQUIREMENTS, "jupyter_client, ipykernel")
                     / "python")
    done = subprocess.run([python, "-c", _JUPYTER, str(n)], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-500:])
    times = json.loads(done.stdout)
    return {"p50_ms": _p50(times), "min_ms": min(times) * 1000, "n": len(times)}


async def _client(port: int, body: dict[str, Any], stop: float, latencies: list[float]) -> None:
    conn = await Conn(port).open()
    try:
        while time.perf_counter() < stop:
            started = time.perf_counter()
            await _ok(conn, "POST", "/api/v1/execute", body)
            latencies.append(time.perf_counter() - started)
    finally:
        conn.close()


async def _load(port: int, pid: int, bodies: list[dict[str, Any]]) -> dict[str, float]:
    await asyncio.gather(*(_client(port, b, time.perf_counter() + 0.3, []) for b in bodies))
    latencies: list[float] = []
    cpu = _cpu_s(pid)
    started = time.perf_counter()
    await asyncio.gather(*(_client(port, b, started + DURATION_S, latencies) for b in bodies))
    elapsed = time.perf_counter() - started
    cpu = _cpu_s(pid) - cpu
    return {"rps": len(latencies) / elapsed, "p50_ms": _p50(latencies),
            "cpu_us_per_req": cpu / len(latencies) * 1e6}


async def _warm(port: int, pid: int) -> dict[str, Any]:
    conn = await Conn(port).open()
    sessions = [(await _ok(conn, "POST", "/api/v1/sessions", {}))["id"] for _ in range(16)]
    for sid in sessions:
        await _ok(conn, "POST", "/api/v1/execute", {"command": "let base = 1", "session": sid})
    out: dict[str, Any] = {}
    for clients in (1, 16):
        runs: dict[str, list[dict[str, float]]] = {"session": [], "stateless": []}
        for i in range(ROUNDS):
            order = ["session", "stateless"] if i % 2 == 0 else ["stateless", "session"]
            for label in order:
                bodies = [{"command": "1 + 1", **({"session": sessions[k]}
                                                   if label == "session" else {})}
                          for k in range(clients)]
                runs[label].append(await _load(port, pid, bodies))
        ratios = [s["rps"] / p["rps"] for s, p in zip(runs["session"], runs["stateless"],
                                                        strict=True)]
        for label, found in runs.items():
            out[f"{clients}/{label}/cpu_us_per_req"] = statistics.median(
                r["cpu_us_per_req"] for r in found)
        for label, found in runs.items():
            found.sort(key=lambda r: r["rps"])
            out[f"{clients}/{label}"] = found[len(found) // 2]
        out[f"{clients}/ratio"] = statistics.median(ratios)
    conn.close()  # idle through the rounds: the server has closed it
    conn = await Conn(port).open()
    for sid in sessions:
        await _ok(conn, "DELETE", f"/api/v1/sessions/{sid}")
    conn.close()
    return out


async def _idle(port: int, pid: int, idle_s: float, n: int = 1000) -> dict[str, Any]:
    conn = await Conn(port).open()
    before_procs = len(_descendants(pid))
    rss_before = _rss_mb(pid)
    started = time.perf_counter()
    for i in range(n):
        sid = (await _ok(conn, "POST", "/api/v1/sessions", {}))["id"]
        await _ok(conn, "POST", "/api/v1/execute", {"command": f"let v = {i}", "session": sid})
    made_s = time.perf_counter() - started
    peak_procs = len(_descendants(pid))
    # Idle past session_idle_s, then the heartbeat's next tick pauses them.
    deadline = time.monotonic() + idle_s + 60
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        listed = await _ok(conn, "GET", "/api/v1/sessions?status=active&limit=1000")
        if not listed:
            break
    await asyncio.sleep(2.0)
    after_procs = len(_descendants(pid))
    paused = await _ok(conn, "GET", "/api/v1/sessions?status=paused&limit=1000")
    conn.close()
    return {"sessions": n, "made_s": made_s, "processes_before": before_procs,
            "processes_peak": peak_procs, "processes_idle": after_procs,
            "paused": len(paused), "rss_before_mb": rss_before, "rss_after_mb": _rss_mb(pid)}


async def _large(port: int) -> dict[str, Any]:
    conn = await Conn(port).open()
    sid = (await _ok(conn, "POST", "/api/v1/sessions", {}))["id"]
    note = "x" * 60
    await _ok(conn, "POST", "/api/v1/execute", {"session": sid, "command": (
        f'let big = range(0, 100000) | map(fn(i) => {{id: i, name: "customer-" + str(i), '
        f'note: "{note}"}}) | reverse')})
    described = await _ok(conn, "GET", f"/api/v1/sessions/{sid}")
    pauses, resumes = [], []
    for _ in range(8):
        started = time.perf_counter()
        await _ok(conn, "POST", f"/api/v1/sessions/{sid}/pause")
        pauses.append(time.perf_counter() - started)
        started = time.perf_counter()
        answer = await _ok(conn, "POST", "/api/v1/execute",
                           {"session": sid, "command": "len(big)"})
        resumes.append(time.perf_counter() - started)
        assert answer["value"] == 100000, answer
    await _ok(conn, "DELETE", f"/api/v1/sessions/{sid}")
    conn.close()
    return {"state_bytes": described["state_bytes"], "pause_p50_ms": _p50(pauses),
            "resume_p50_ms": _p50(resumes), "n": len(pauses)}


async def _save(port: int) -> dict[str, Any]:
    conn = await Conn(port).open()
    sid = (await _ok(conn, "POST", "/api/v1/sessions", {}))["id"]
    await _ok(conn, "POST", "/api/v1/execute", {"session": sid, "command": "let mut n = 0"})
    saving = {"session": sid, "command": "n = n + 1"}
    plain = {"session": sid, "command": "n + 1"}
    times: dict[str, list[float]] = {"saving": [], "plain": []}
    for _ in range(300):  # warm up both programs' paths
        await _ok(conn, "POST", "/api/v1/execute", saving)
        await _ok(conn, "POST", "/api/v1/execute", plain)
    for i in range(3000):
        for label, body in ((("saving", saving), ("plain", plain)) if i % 2 == 0
                            else (("plain", plain), ("saving", saving))):
            started = time.perf_counter()
            await _ok(conn, "POST", "/api/v1/execute", body)
            times[label].append(time.perf_counter() - started)
    await _ok(conn, "DELETE", f"/api/v1/sessions/{sid}")
    conn.close()
    saving_ms, plain_ms = _p50(times["saving"]), _p50(times["plain"])
    return {"saving_p50_ms": saving_ms, "plain_p50_ms": plain_ms,
            "overhead": (saving_ms - plain_ms) / saving_ms}


def run() -> dict[str, Any]:
    import uvloop

    results: dict[str, Any] = {"duration_s": DURATION_S, "rounds": ROUNDS, "cpus": os.cpu_count()}
    base = Path(tempfile.mkdtemp(prefix="conch-bench-sessions-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        if SCENARIOS != ["idle"]:
            proc, port = _start(str(base / "main"), session_workers_max=200)
            try:
                if "create" in SCENARIOS:
                    results["create"] = uvloop.run(_create(port, proc.pid))
                    try:
                        results["jupyter"] = _jupyter()
                    except Exception as exc:
                        results["jupyter"] = {"error": str(exc)}
                if "warm" in SCENARIOS:
                    results["warm"] = uvloop.run(_warm(port, proc.pid))
                if "large" in SCENARIOS:
                    results["large"] = uvloop.run(_large(port))
                if "save" in SCENARIOS:
                    results["save"] = uvloop.run(_save(port))
            finally:
                proc.terminate()
                proc.wait(timeout=60)
        if "idle" in SCENARIOS:
            idle_s = 5.0
            proc, port = _start(str(base / "idle"), session_idle_s=idle_s,
                                session_workers_max=1000)
            try:
                results["idle"] = uvloop.run(_idle(port, proc.pid, idle_s))
            finally:
                proc.terminate()
                proc.wait(timeout=120)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    return results


def main() -> None:
    results = run()
    print(f"{results['cpus']} CPUs; load rounds of {DURATION_S:g} s, {ROUNDS} rounds")
    if "create" in results:
        for label, r in results["create"].items():
            print(f"create + 1 + 1 ({label}): p50 {r['p50_ms']:.1f} ms (min {r['min_ms']:.1f}, "
                  f"max {r['max_ms']:.1f}, n {r['n']}); CPU {r['cpu_ms_each']:.1f} ms each, "
                  "server, worker and the spare replacing it")
        jupyter = results.get("jupyter", {})
        if "p50_ms" in jupyter:
            speedup = jupyter["p50_ms"] / results["create"]["spaced"]["p50_ms"]
            print(f"Jupyter kernel start + 1 + 1: p50 {jupyter['p50_ms']:.0f} ms "
                  f"(n {jupyter['n']}): conch {speedup:.0f}x faster")
        else:
            print(f"Jupyter kernel: NOT RUN: {jupyter.get('error')}")
    if "warm" in results:
        for clients in (1, 16):
            s, p = results["warm"][f"{clients}/session"], results["warm"][f"{clients}/stateless"]
            print(f"warm session c={clients}: {s['rps']:.0f} req/s (p50 {s['p50_ms']:.2f} ms) vs "
                  f"stateless {p['rps']:.0f} req/s (p50 {p['p50_ms']:.2f} ms): "
                  f"{results['warm'][f'{clients}/ratio']:.2f}x (median of paired rounds); CPU "
                  f"{results['warm'][f'{clients}/session/cpu_us_per_req']:.0f} vs "
                  f"{results['warm'][f'{clients}/stateless/cpu_us_per_req']:.0f} µs/req")
    if "idle" in results:
        r = results["idle"]
        print(f"{r['sessions']} sessions made and run once in {r['made_s']:.0f} s; processes "
              f"{r['processes_before']} before, {r['processes_peak']} at the peak, "
              f"{r['processes_idle']} once idle ({r['paused']} paused); server RSS "
              f"{r['rss_before_mb']:.0f} -> {r['rss_after_mb']:.0f} MB "
              f"(+{r['rss_after_mb'] - r['rss_before_mb']:.0f})")
    if "large" in results:
        r = results["large"]
        print(f"{r['state_bytes'] / 1e6:.1f} MB of bindings: pause p50 {r['pause_p50_ms']:.0f} ms,"
              f" resume (first run after) p50 {r['resume_p50_ms']:.0f} ms (n {r['n']})")
    if "save" in results:
        r = results["save"]
        print(f"n = n + 1 (saves n) p50 {r['saving_p50_ms']:.3f} ms, n + 1 (saves nothing) "
              f"{r['plain_p50_ms']:.3f} ms: saving costs {r['overhead'] * 100:.1f} % of the run")
    if "--json" in sys.argv:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
