"""Agent server throughput and latency, side by side with a bare Starlette JSON endpoint.

Both servers run in their own processes under the same uvicorn settings (uvloop, httptools,
no access log); this process is the load generator (a minimal keep-alive HTTP/1.1 client on
uvloop, one connection per client, so that the client is not the bottleneck), and the same
client measures both servers. For 1 and 16 concurrent clients it measures requests/s and
p50/p99 latency of ``POST /api/v1/execute {"command": "1 + 1"}`` and of a 10,000-element
pipeline, and the same bodies posted to the bare endpoint (the ceiling). Each scenario runs
in several rounds alternating between conch and the ceiling, and the round with the median
throughput is reported, so that a burst of other load on the machine skews both sides alike
rather than one. Idle RSS is read from /proc.

Targets: execute throughput >= 0.5x the ceiling, p50 <= 3 ms at 1 client, idle server RSS
<= 150 MB (issue 3); execute >= 0.6x at 16 clients, pipeline 10k >= 0.3x at 1 and 16 clients
(issue 22).

``CONCH_BENCH_OLD_SRC=/path/to/old/checkout/src`` adds a third server, the same benchmark on
an older conch, in the same alternating rounds (before/after figures from one run).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

DURATION_S = float(os.environ.get("CONCH_BENCH_SECONDS", "2"))
ROUNDS = int(os.environ.get("CONCH_BENCH_ROUNDS", "3"))
OLD_SRC = os.environ.get("CONCH_BENCH_OLD_SRC")
SCENARIOS = os.environ.get("CONCH_BENCH_SCENARIOS", "execute,pipeline_10k").split(",")
CONCURRENCY = (1, 16)
SRC = Path(__file__).resolve().parent.parent / "src"

# argv: data directory, port, and (optionally) settings as JSON
AGENT_CODE = """
import json, sys, uvicorn
from conch.config import Settings
try:
    from conch.web.agent.app import create_app
except ImportError:  # an older checkout, measured side by side (CONCH_BENCH_OLD_SRC)
    from conch.web.agent_app import create_app
settings = Settings(data_dir=sys.argv[1], port=int(sys.argv[2]),
                    **(json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}))
uvicorn.run(create_app(settings), host="127.0.0.1", port=int(sys.argv[2]),
            log_level="warning", access_log=False, loop="uvloop", http="httptools")
"""

_CEILING = """
import sys, uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

async def endpoint(request: Request) -> JSONResponse:
    body = await request.json()
    return JSONResponse({"success": True, "result": "2", "type": "Int", "echo": len(body)})

app = Starlette(routes=[Route("/api/v1/execute", endpoint, methods=["POST"]),
                        Route("/api/v1/pipeline", endpoint, methods=["POST"]),
                        Route("/health", endpoint, methods=["GET"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False,
            loop="uvloop", http="httptools")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(code: str, data_dir: str, src: Path | str = SRC, *, settings: dict[str, Any] | None = None,
                 settle_s: float = 1.0, wait_s: float = 60) -> tuple[subprocess.Popen[bytes], int]:
    """A server (``code``: AGENT_CODE, or the ceiling) in a process of its own, with this checkout's
    conch (``src``) and none of the caller's CONCH_ settings; back once it accepts connections
    and ``settle_s`` more have passed (its sandbox workers finish starting)."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCH_")}
    env["PYTHONPATH"] = str(src)  # this checkout's conch, not whichever one is installed
    argv = [sys.executable, "-c", code, data_dir, str(port)]
    if settings:
        argv.append(json.dumps(settings))
    proc = subprocess.Popen(argv, env=env)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.05)
    time.sleep(settle_s)
    return proc, port


def _request(path: str, body: bytes, port: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _client(port: int, request: bytes, stop: float, latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < stop:
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = await reader.readexactly(length)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
            latencies.append(time.perf_counter() - started)
    finally:
        writer.close()


async def _load(port: int, path: str, body: bytes, clients: int, pid: int) -> dict[str, float]:
    request = _request(path, body, port)
    # Warm up (connections, caches, worker code paths).
    await asyncio.gather(
        *(_client(port, request, time.perf_counter() + 0.3, []) for _ in range(clients))
    )
    latencies: list[float] = []
    cpu = _cpu_s(pid)
    started = time.perf_counter()
    stop = started + DURATION_S
    await asyncio.gather(*(_client(port, request, stop, latencies) for _ in range(clients)))
    elapsed = time.perf_counter() - started
    cpu = _cpu_s(pid) - cpu
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "requests": len(latencies),
        "cpu_us_per_req": cpu / len(latencies) * 1e6,
    }


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its live children (the sandbox
    workers): a cost per request that other load on the machine hardly changes."""
    total = 0.0
    for p in (pid, *_children(pid)):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def run() -> dict[str, Any]:
    execute = json.dumps({"command": "1 + 1"}).encode()
    pipeline = json.dumps(
        {
            "input": list(range(10_000)),
            "steps": ["map(fn(x) => x * 2)", "where(fn(x) => x % 3 == 0)", "sum"],
        }
    ).encode()
    results: dict[str, Any] = {"duration_s": DURATION_S, "rounds": ROUNDS, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as data, tempfile.TemporaryDirectory() as old_data:
        agent, agent_port = start_server(AGENT_CODE, data)
        ceiling, ceiling_port = start_server(_CEILING, data)
        servers = {"conch": agent_port, "ceiling": ceiling_port}
        procs = [agent, ceiling]
        pids = {"conch": agent.pid, "ceiling": ceiling.pid}
        if OLD_SRC:
            old, servers["old"] = start_server(AGENT_CODE, old_data, OLD_SRC)
            procs.append(old)
            pids["old"] = old.pid
        try:
            time.sleep(1.0)
            workers = _children(agent.pid)
            results["idle_rss_mb"] = {
                "server": round(_rss_mb(agent.pid), 1),
                "sandbox_workers": round(sum(_rss_mb(p) for p in workers), 1),
                "workers": len(workers),
            }
            for name, path, body in (
                ("execute", "/api/v1/execute", execute),
                ("pipeline_10k", "/api/v1/pipeline", pipeline),
            ):
                if name not in SCENARIOS:
                    continue
                for clients in CONCURRENCY:
                    rounds: dict[str, list[dict[str, float]]] = {label: [] for label in servers}
                    for i in range(ROUNDS):
                        # Every other round in reverse order, so no server always goes first.
                        order = list(servers.items())
                        for label, port in order if i % 2 == 0 else order[::-1]:
                            load = _load(port, path, body, clients, pids[label])
                            rounds[label].append(uvloop.run(load))
                    if "old" in rounds:
                        # Paired by round, so a burst of other load hits both alike.
                        results[f"{name}/{clients}/new_vs_old"] = statistics.median(
                            n["rps"] / o["rps"] for n, o in zip(rounds["conch"], rounds["old"], strict=True)
                        )
                    for label, runs in rounds.items():
                        results[f"{name}/{clients}/{label}/cpu_us_per_req"] = statistics.median(
                            r["cpu_us_per_req"] for r in runs
                        )
                        runs.sort(key=lambda r: r["rps"])
                        results[f"{name}/{clients}/{label}"] = runs[len(runs) // 2]
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=30)
    return results


def main() -> None:
    results = run()
    rss = results["idle_rss_mb"]
    print(
        f"idle RSS: server {rss['server']} MB (+ {rss['workers']} sandbox workers, {rss['sandbox_workers']} MB)"
    )
    if OLD_SRC:
        print(f"old: the conch at {OLD_SRC}, measured in the same alternating rounds")
    print(
        f"{'scenario':<28}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'vs ceiling':>12}"
        f"{'CPU µs/req':>12}"
    )
    for name in SCENARIOS:
        for clients in CONCURRENCY:
            conch = results[f"{name}/{clients}/conch"]
            ceiling = results[f"{name}/{clients}/ceiling"]
            rows = [("conch", conch), ("ceiling", ceiling)]
            if f"{name}/{clients}/old" in results:
                rows.insert(1, ("old", results[f"{name}/{clients}/old"]))
            for label, r in rows:
                suffix = f"{r['rps'] / ceiling['rps']:>11.2f}x" if label != "ceiling" else " " * 12
                suffix += f"{results[f'{name}/{clients}/{label}/cpu_us_per_req']:>12.0f}"
                print(
                    f"{name + ' c=' + str(clients) + ' ' + label:<28}{r['rps']:>10.0f}"
                    f"{r['p50_ms']:>10.2f}{r['p99_ms']:>10.2f}{suffix}"
                )
            if f"{name}/{clients}/new_vs_old" in results:
                paired = results[f"{name}/{clients}/new_vs_old"]
                print(f"{name + ' c=' + str(clients) + ' conch / old':<28}{paired:>10.2f}x (median per round)")
    def ratio(name: str, clients: int) -> float:
        return results[f"{name}/{clients}/conch"]["rps"] / results[f"{name}/{clients}/ceiling"]["rps"]

    print("targets:")
    if "execute" in SCENARIOS:
        print(f"  execute >= 0.5x ceiling (issue 3): 1 client {ratio('execute', 1):.2f}x")
        print(f"  execute >= 0.6x ceiling at 16 clients (issue 22): {ratio('execute', 16):.2f}x")
        print(f"  execute p50 <= 3 ms at 1 client: {results['execute/1/conch']['p50_ms']:.2f} ms")
    if "pipeline_10k" in SCENARIOS:
        print(
            f"  pipeline 10k >= 0.3x ceiling (issue 22): 1 client {ratio('pipeline_10k', 1):.2f}x,"
            f" 16 clients {ratio('pipeline_10k', 16):.2f}x"
        )
    print(f"  idle server RSS <= 150 MB: {rss['server']} MB")
    if "--json" in sys.argv:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
