"""Marketplace and MCP: search and install at 10,000 published agents, MCP against REST.

A real agent server (uvicorn, its own process) on a database holding the curated catalogue
and 10,000 more agents (published through the marketplace service, the same code as the
route, before the server starts). This process is the client (httpx, keep-alive, one
request at a time) and measures, side by side:

- search: ``GET /api/v1/marketplace/search`` for a mix of queries (a common word, a rare
  word, an exact name, two words, a prefix, a category filter), against the same queries as
  a plain ``LIKE`` scan of the same table (what a registry without a full-text index does);
- install: ``POST /api/v1/marketplace/install`` of agents not installed yet (resolve, verify
  the digest, record, register with orchestration);
- MCP: ``tools/call execute {"command": "1 + 1"}`` as JSON-RPC over streamable HTTP (the
  session opened once, as every MCP client does), against ``POST /api/v1/execute`` with the
  same program; both through the same HTTP client, so the ratio is the servers' own.

Targets (issue 12): search p50/p99 <= 10/50 ms, install p50 <= 20 ms, MCP p50 <= 2x REST.
"""

from __future__ import annotations

import os
import random
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

N_AGENTS = int(os.environ.get("CONCH_BENCH_AGENTS", "10000"))
N_SEARCH = int(os.environ.get("CONCH_BENCH_SEARCHES", "400"))
N_INSTALL = int(os.environ.get("CONCH_BENCH_INSTALLS", "200"))
N_CALLS = int(os.environ.get("CONCH_BENCH_CALLS", "500"))

_SERVER = """
import sys, uvicorn
from conch.config import Settings
from conch.web.agent.app import create_app
settings = Settings(data_dir=sys.argv[1], port=int(sys.argv[2]), workers=2)
uvicorn.run(create_app(settings), host="127.0.0.1", port=int(sys.argv[2]),
            log_level="warning", access_log=False, loop="uvloop", http="httptools")
"""

WORDS = ["log", "csv", "json", "yaml", "code", "file", "report", "metric", "trace", "alert", "deploy", "test", "lint", "format", "search", "index", "parse", "convert", "summary", "audit", "backup", "schema", "table", "chart", "queue", "cache", "token", "budget", "invoice", "email", "calendar", "ticket", "review", "release", "docker", "kube", "terraform", "python", "rust", "sql"]
TOOLS = ["cat", "grep", "ls", "head", "tail", "from_csv", "from_json", "to_json", "wc", "find"]


def _populate(data_dir: Path) -> float:
    from conch.config import Settings
    from conch.lang.builtins.registry import load_all
    from conch.marketplace.catalogue import CATALOGUE
    from conch.marketplace.records import PublishRequest
    from conch.marketplace.service import MarketplaceService

    load_all()
    service = MarketplaceService.from_settings(Settings(data_dir=data_dir))
    service.seed(CATALOGUE)
    rng = random.Random(12)
    started = time.perf_counter()
    for i in range(N_AGENTS):
        words = rng.sample(WORDS, 4)
        service.publish(
            PublishRequest(
                name=f"{words[0]}-{words[1]}-{i}",
                description=f"Helps with {words[0]} and {words[1]}: {' '.join(words[2:])} tasks.",
                system_prompt="You are a helpful agent. Use the tools.",
                tools=rng.sample(TOOLS, 3),
                model="local:smollm2-135m-instruct",
                category=rng.choice(["data", "code", "ops", "files", "docs"]),
                tags=words[2:],
            )
        )
    from conch import db

    db.dispose_all()
    return (time.perf_counter() - started) / N_AGENTS * 1000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _queries(rng: random.Random) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(N_SEARCH):
        w = rng.sample(WORDS, 2)
        kind = i % 6
        if kind == 0:
            out.append({"q": w[0]})  # a common word: ~1/10 of all agents match
        elif kind == 1:
            out.append({"q": f"{w[0]} {w[1]}"})
        elif kind == 2:
            out.append({"q": f"{w[0]}-{w[1]}-{rng.randrange(N_AGENTS)}"})  # maybe exact
        elif kind == 3:
            out.append({"q": w[0][:3]})  # a prefix, as typed
        elif kind == 4:
            out.append({"q": w[0], "category": "code"})
        else:
            out.append({"q": "file-summariser"})  # an exact name
    return out


def _like_baseline(db_path: Path, queries: list[dict[str, Any]]) -> list[float]:
    conn = sqlite3.connect(db_path)
    times = []
    for params in queries:
        words = params["q"].replace("-", " ").split()
        where = " OR ".join(
            "(name LIKE ? OR description LIKE ? OR search_text LIKE ?)" for _ in words
        )
        args = [f"%{w}%" for w in words for _ in range(3)]
        started = time.perf_counter()
        conn.execute(
            f"SELECT * FROM marketplace_agents WHERE latest AND ({where}) ORDER BY name LIMIT 20",
            args,
        ).fetchall()
        conn.execute(
            f"SELECT count(*) FROM marketplace_agents WHERE latest AND ({where})", args
        ).fetchall()
        times.append((time.perf_counter() - started) * 1000)
    conn.close()
    return times


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="conch-bench-market-") as tmp:
        data_dir = Path(tmp)
        per_publish = _populate(data_dir)
        print(f"published {N_AGENTS} agents ({per_publish:.2f} ms each, in-process)")
        port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
        proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(data_dir), str(port)], env=env)
        try:
            _measure(data_dir, port)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _measure(data_dir: Path, port: int) -> None:
    base = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=base, timeout=60)
    deadline = time.monotonic() + 60
    while True:
        try:
            if client.get("/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the agent server did not start")
        time.sleep(0.1)
    rng = random.Random(7)
    queries = _queries(rng)
    for params in queries[:20]:  # warm the caches, as a running server has them
        client.get("/api/v1/marketplace/search", params=params)
    search = [
        _timed(
            lambda p=params: client.get("/api/v1/marketplace/search", params=p).raise_for_status()
        )
        for params in queries
    ]
    like = _like_baseline(data_dir / "conch.db", queries)

    names = [
        a["name"]
        for a in client.get("/api/v1/marketplace/search", params={"q": "log", "limit": 100}).json()[
            "results"
        ]
    ]
    names += [
        a["name"]
        for a in client.get("/api/v1/marketplace/search", params={"q": "csv", "limit": 100}).json()[
            "results"
        ]
    ]
    names = list(dict.fromkeys(names))[:N_INSTALL]
    install = [
        _timed(
            lambda n=n: client.post(
                "/api/v1/marketplace/install", json={"name": n, "version": "^1"}
            ).raise_for_status()
        )
        for n in names
    ]

    rest, mcp = _mcp_vs_rest(client)
    client.close()

    def row(label: str, xs: list[float], target: str = "") -> None:
        print(
            f"{label:<44} p50 {_pct(xs, 50):7.2f} ms  p99 {_pct(xs, 99):7.2f} ms  n={len(xs):<5} {target}"
        )

    print(f"\n{N_AGENTS} agents + catalogue; sequential requests over keep-alive HTTP")
    row("search (FTS5 bm25, HTTP round trip)", search, "target p50<=10 p99<=50")
    row("  baseline: LIKE scan, in-process SQL only", like)
    print(f"  ratio search/LIKE p50: {_pct(search, 50) / _pct(like, 50):.2f}x")
    row("install (resolve, verify, register; HTTP)", install, "target p50<=20")
    row("POST /api/v1/execute 1 + 1", rest)
    row("MCP tools/call execute 1 + 1 (streamable HTTP)", mcp, "target p50<=2x REST")
    print(f"  ratio MCP/REST p50: {_pct(mcp, 50) / _pct(rest, 50):.2f}x")


def _mcp_vs_rest(client: httpx.Client) -> tuple[list[float], list[float]]:
    headers = {"Accept": "application/json, text/event-stream"}
    init = client.post(
        "/mcp",
        headers=headers,
        json={
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "bench", "version": "1"},
            },
        },
    )
    init.raise_for_status()
    session = {
        **headers,
        "Mcp-Session-Id": init.headers["mcp-session-id"],
        "Mcp-Protocol-Version": "2025-06-18",
    }
    client.post(
        "/mcp", headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
    )
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "execute", "arguments": {"command": "1 + 1"}},
    }
    check = client.post("/mcp", headers=session, json=call).json()
    assert check["result"]["content"][0]["text"] == "2", check
    rest: list[float] = []
    mcp: list[float] = []
    # alternate, so that other load on the machine skews both alike
    for i in range(N_CALLS + 50):
        a = _timed(
            lambda: client.post("/api/v1/execute", json={"command": "1 + 1"}).raise_for_status()
        )
        b = _timed(
            lambda i=i: client.post(
                "/mcp", headers=session, json={**call, "id": i + 2}
            ).raise_for_status()
        )
        if i >= 50:
            rest.append(a)
            mcp.append(b)
    return rest, mcp


if __name__ == "__main__":
    main()
