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
(issue 32) is authentication + limit checks <= 0.3 ms per request at p50; the HTTP comparison
(``execute 1 + 1`` and a 1-token chat with and without keys) joins this script when the
routes land.

    python benchmarks/keys.py [--n 3000] [--database-url URL] [--json]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=3000, help="timed calls per case")
    parser.add_argument("--history", type=int, default=20_000, help="past admissions per key")
    parser.add_argument("--database-url", help="default: a fresh SQLite file")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
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
