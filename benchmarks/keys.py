"""Keys: what authentication and limit checks cost per request, in process.

Measures, one call at a time on one thread (the cost a request pays, not throughput):

- ``authenticate``: a key's secret to its principal, from the cache (the steady state; the
  database is read once per ``recheck_s`` per key) and the configured admin key;
- ``admit+finish`` for a key without limits (no database work at all);
- ``admit`` for a key with ``requests_per_minute`` (one transaction: lock, prune, check,
  record), and ``admit+finish`` for a key with ``tokens_per_minute`` and ``tokens_per_day``
  (reserve at admission, settle at the end: two transactions);
- ``admit+finish`` of a run with ``concurrent_runs`` and ``runs_per_minute`` (a lease taken
  and released).

The database is a fresh SQLite file (WAL), or ``--database-url`` (e.g. a PostgreSQL URL).
Limits are set high enough that nothing is refused, so every admission writes. Each limited
key first gets ``--history`` admissions spread evenly over the past day (20,000: one every
4.3 s), so that the windows are in their steady state: as many events in them as a busy key
has, and the oldest leaving the day window as the benchmark runs. The target
(issue 32) is authentication + limit checks <= 0.3 ms per request at p50.

``--http`` measures the same over HTTP, on real servers in their own processes: the p50 of
``POST /api/v1/execute {"command": "1 + 1"}`` and of a 1-token chat (``max_tokens`` 1,
``temperature`` 0, one prompt, so the prompt cache answers its prefix) on a server without
keys, and on one with an admin key, sent with a key without limits and with a key with
``requests_per_minute`` (and, for the chat, ``tokens_per_day``: a reservation and a
settlement in the database). One keep-alive connection, one request at a time; the servers
take turns in rounds (every other round in reverse order) so that other load on the machine
falls on both alike, and the ratio is the median of the rounds' ratios. Target: with keys
>= 0.95x the throughput without (p50 without / p50 with).

    python benchmarks/keys.py [--n 3000] [--database-url URL] [--json]
    python benchmarks/keys.py --http [--n 400] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _timed(fn: Callable[[], Any], n: int) -> dict[str, float]:
    for _ in range(min(200, n)):  # warm the statement caches and the connection pool
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e6)
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 4),
        "p90_ms": round(samples[int(0.9 * (n - 1))], 4),
        "p99_ms": round(samples[int(0.99 * (n - 1))], 4),
    }


def _history(limiter: Any, principal: Any, count: int, **demand: Any) -> None:
    """``count`` admissions of ``principal`` at times spread over the day before now."""
    now = time.time()
    clock = limiter.clock
    try:
        for i in range(count):
            at = now - 86_400 + (i + 1) * 86_400 / (count + 1)
            limiter.clock = lambda at=at: at
            limiter.finish(limiter.admit(principal, **demand), tokens=demand.get("tokens"))
    finally:
        limiter.clock = clock


def run(url: str, n: int, history: int) -> dict[str, Any]:
    from conch import db
    from conch.keys import KeyService, Limiter

    engine = db.engine_for(url)
    keys = KeyService(engine, admin_keys=["bench-admin-key"])
    limiter = Limiter(engine)
    big = 10**12
    free = keys.create(name="bench-free", scopes=["inference"])
    rpm = keys.create(name="bench-rpm", scopes=["inference"], limits={"requests_per_minute": big})
    tok = keys.create(
        name="bench-tokens",
        scopes=["inference"],
        limits={"requests_per_minute": big, "tokens_per_minute": big, "tokens_per_day": big},
    )
    runs = keys.create(
        name="bench-runs",
        scopes=["execute"],
        limits={"runs_per_minute": big, "concurrent_runs": 1000, "requests_per_minute": big},
    )

    for issued, demand in ((rpm, {}), (tok, {"tokens": 64}), (runs, {"run": True})):
        principal = keys.authenticate(issued.secret)
        _history(limiter, principal, history, **demand)

    def auth(secret: str) -> Callable[[], Any]:
        return lambda: keys.authenticate(secret)

    def admit_finish(secret: str, **demand: Any) -> Callable[[], None]:
        def go() -> None:
            principal = keys.authenticate(secret)
            assert principal is not None
            admission = limiter.admit(principal, **demand)
            limiter.finish(admission, tokens=demand.get("tokens") and 1)

        return go

    def admit_only(secret: str) -> Callable[[], None]:
        def go() -> None:
            principal = keys.authenticate(secret)
            assert principal is not None
            limiter.admit(principal)

        return go

    results = {
        "database": engine.dialect.name,
        "n": n,
        "history": history,
        "authenticate (key, cached)": _timed(auth(free.secret), n),
        "authenticate (admin key)": _timed(auth("bench-admin-key"), n),
        "authenticate + admit + finish, no limits": _timed(admit_finish(free.secret, tokens=64), n),
        "authenticate + admit, requests_per_minute": _timed(admit_only(rpm.secret), n),
        "authenticate + admit + finish, tokens reserved and settled": _timed(
            admit_finish(tok.secret, tokens=64), n
        ),
        "authenticate + admit + finish, a run (lease)": _timed(
            admit_finish(runs.secret, run=True), n
        ),
    }
    db.dispose_all()
    return results


# -- over HTTP ------------------------------------------------------------------------------

ADMIN = "bench-admin-key"
SRC = Path(__file__).resolve().parent.parent / "src"


def _serve(command: list[str], health: str, data: Path, **env: str) -> tuple[Any, str]:
    """``conch <command>`` in a process of its own: ``(process, base URL)``."""
    import os
    import socket
    import subprocess
    import sys

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONCH_")}
    environ.update({"PYTHONPATH": str(SRC), "CONCH_DATA_DIR": str(data),
                    "CONCH_CONFIG": str(data / "none.toml"), "CONCH_WORKERS": "2",
                    **{f"CONCH_{k.upper()}": v for k, v in env.items()}})  # fmt: skip
    process = subprocess.Popen([sys.executable, "-m", "conch.cli.main", *command, "--port", str(port)],
                               env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + health, timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"conch {' '.join(command)} did not start")
        time.sleep(0.2)


def _p50(url: str, path: str, body: dict[str, Any], headers: dict[str, str], n: int) -> float:
    import httpx

    with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
        for _ in range(min(20, n)):
            r = c.post(path, json=body)
            assert r.status_code == 200, r.text
        samples = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            r = c.post(path, json=body)
            samples.append((time.perf_counter_ns() - t0) / 1e6)
            assert r.status_code == 200, r.text
    return statistics.median(samples)


def run_http(n: int, rounds: int) -> dict[str, Any]:
    """p50 of execute 1 + 1 and of a 1-token chat, without keys and with (see the module doc)."""
    from conch import db
    from conch.config import Settings
    from conch.keys import KeyService

    big = 10**12
    out: dict[str, Any] = {"n": n, "rounds": rounds}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        procs = []
        try:
            plain_agent = _serve(["serve"], "/health", root / "plain")
            keyed_agent = _serve(["serve"], "/health", root / "keyed", admin_key=ADMIN)
            plain_models = _serve(["models", "serve"], "/v1/health", root / "plain-m")
            keyed_models = _serve(["models", "serve"], "/v1/health", root / "keyed-m", admin_key=ADMIN)
            procs = [plain_agent[0], keyed_agent[0], plain_models[0], keyed_models[0]]

            def key(data: Path, **body: Any) -> str:
                engine = db.engine_for(Settings(data_dir=data).effective_database_url)
                return KeyService(engine).create(name="bench", **body).secret

            free_run = key(root / "keyed", scopes=["execute"])
            rpm_run = key(root / "keyed", scopes=["execute"], limits={"requests_per_minute": big})
            free_chat = key(root / "keyed-m", scopes=["inference"])
            tok_chat = key(root / "keyed-m", scopes=["inference"],
                           limits={"requests_per_minute": big, "tokens_per_day": big})  # fmt: skip

            def auth(secret: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {secret}"}

            execute = ("/api/v1/execute", {"command": "1 + 1"})
            chat = ("/v1/chat/completions", {
                "model": "smollm2-135m-instruct", "max_tokens": 1, "temperature": 0,
                "messages": [{"role": "user", "content": "Say yes."}]})  # fmt: skip
            cases = {
                "execute 1 + 1": (execute, [
                    ("without keys", plain_agent[1], {}),
                    ("admin key", keyed_agent[1], auth(ADMIN)),
                    ("key, no limits", keyed_agent[1], auth(free_run)),
                    ("key, requests_per_minute", keyed_agent[1], auth(rpm_run)),
                ]),
                "chat, 1 token": (chat, [
                    ("without keys", plain_models[1], {}),
                    ("key, no limits", keyed_models[1], auth(free_chat)),
                    ("key, requests_per_minute + tokens_per_day", keyed_models[1], auth(tok_chat)),
                ]),
            }  # fmt: skip
            for case, ((path, body), sides) in cases.items():
                samples: dict[str, list[float]] = {label: [] for label, _u, _h in sides}
                for i in range(rounds):
                    order = sides if i % 2 == 0 else sides[::-1]
                    for label, url, headers in order:
                        samples[label].append(_p50(url, path, body, headers, n))
                base = samples["without keys"]
                for label, values in samples.items():
                    entry: dict[str, Any] = {"p50_ms": round(statistics.median(values), 4)}
                    if label != "without keys":
                        # Throughput with keys over without: p50 without / p50 with, per round.
                        entry["ratio"] = round(statistics.median(b / v for b, v in zip(base, values, strict=True)), 3)
                        entry["added_ms"] = round(statistics.median(v - b for b, v in zip(base, values, strict=True)), 4)
                    out[f"{case} / {label}"] = entry
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=30)
            db.dispose_all()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=None, help="timed calls per case (and round)")
    parser.add_argument("--history", type=int, default=20_000, help="past admissions per key")
    parser.add_argument("--database-url", help="default: a fresh SQLite file")
    parser.add_argument("--http", action="store_true", help="measure over HTTP (see above)")
    parser.add_argument("--rounds", type=int, default=5, help="--http: rounds of every server")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    if args.http:
        results = run_http(args.n or 400, args.rounds)
        if args.json:
            print(json.dumps(results, indent=2))
            return
        print(f"{results.pop('n')} requests per server per round, {results.pop('rounds')} rounds")
        for name, r in results.items():
            extra = f"  ratio {r['ratio']:.3f}  +{r['added_ms']:.4f} ms" if "ratio" in r else ""
            print(f"  {name:<60} p50 {r['p50_ms']:.4f} ms{extra}")
        return
    args.n = args.n or 3000
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'keys.db'}"
        results = run(url, args.n, args.history)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"database: {results.pop('database')}, {results.pop('n')} calls per case, "
        f"{results.pop('history')} past admissions per limited key"
    )
    for name, r in results.items():
        print(f"  {name:<60} p50 {r['p50_ms']:.4f} ms  p90 {r['p90_ms']:.4f}  p99 {r['p99_ms']:.4f}")


if __name__ == "__main__":
    main()
