"""The language benchmark: the same pipelines in conch, plain Python and Nushell, side by side.

Each pipeline is timed inside its own runtime (conch and Python in this process, Nushell with its
``timeit`` command), so process start-up is measured only by the cold-start row. The input data
is generated once and handed to each runtime the same way (Nushell reads it from a JSON file).

Run with ``make bench`` or ``python benchmarks/lang.py`` (``--help`` for the options: a subset
of the rows, more repeats, no Nushell). ``--state`` runs instead the benchmark of a session's
state as data (:func:`session_state`: pausing and resuming 10 MB of bindings, and the cost of
saving after a small run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench-cache"
NU_VERSION = "0.115"
REPEATS = 3


def find_nu() -> str:
    """The Nushell binary from the npm package, installed into .bench-cache on first use;
    ``RuntimeError`` saying why when it cannot be had."""
    binary = CACHE / "nu" / "node_modules" / "@nushell" / "linux-x64" / "bin" / "nu"
    if binary.exists():
        return str(binary)
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not on PATH (Nushell comes from the npm package @nushell/linux-x64)")
    CACHE.mkdir(exist_ok=True)
    proc = subprocess.run(
        ["npm", "install", "--silent", "--prefix", str(CACHE / "nu"), f"@nushell/linux-x64@{NU_VERSION}"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 or not binary.exists():
        raise RuntimeError(f"npm install @nushell/linux-x64@{NU_VERSION} failed: {proc.stderr.strip()[-300:]}")
    return str(binary)


def best_of(fn: Callable[[], Any], repeats: int = REPEATS) -> tuple[float, Any]:
    best = float("inf")
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def nu_time(nu: str, script: str, data_file: Path | None) -> float:
    """Best of REPEATS in-process timings reported by Nushell's timeit, in seconds."""
    load = f"let data = (open '{data_file}')\n" if data_file else ""
    body = f"{load}[{', '.join(['0'] * REPEATS)}] | each {{|_| timeit {{ {script} }} | into int }} | math min"
    proc = subprocess.run([nu, "-c", body], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"nu failed: {proc.stderr.strip()[:400]}")
    return int(proc.stdout.strip()) / 1e9


def make_data(tmp: Path) -> dict[str, Any]:
    rows_b = [{"id": i, "key": f"k{i % 100}", "size": (i * 7919) % 100_003} for i in range(100_000)]
    rows_c = [{"id": i, "name": f"file{i}", "size": (i * 104_729) % 1_000_003} for i in range(200_000)]
    text_d = "\n".join(f"line {i} of some words to split and join" for i in range(100_000))
    files = {}
    for name, value in (("b", rows_b), ("c", rows_c), ("d", text_d)):
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(value))
        files[name] = path
    return {"b": rows_b, "c": rows_c, "d": text_d, "files": files}


def python_a() -> int:
    return sum(y for y in (x * 2 for x in range(1_000_000)) if y % 3 == 0)


def python_b(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row["key"]), []).append(row)
    return [{"key": k, "count": len(v)} for k, v in groups.items()]


def python_c(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r["size"])


def python_d(text: str) -> list[str]:
    return ["-".join(line.upper().split(" ")) for line in text.splitlines()]


CONCH = {
    "a": "range(0, 1000000) | map(fn(x) => x * 2) | where(fn(x) => x % 3 == 0) | sum",
    "b": 'let g = data | group_by("key")\nkeys(g) | map(fn(k) => {key: k, count: len(g[k])})',
    "c": 'data | sort_by("size")',
    "d": 'data | lines | map(fn(l) => l | upper | split(" ") | join("-"))',
}

NU = {
    "a": "0..<1000000 | each {|x| $x * 2} | where {|x| $x mod 3 == 0} | math sum",
    "b": "$data | group-by key | items {|k, v| {key: $k, count: ($v | length)}}",
    "c": "$data | sort-by size",
    "d": "$data | lines | each {|l| $l | str upcase | split row ' ' | str join '-'}",
}

LABELS = {
    "a": "(a) 1M Ints: map x2, where %3==0, sum",
    "b": "(b) 100k records: group_by, count per group",
    "c": "(c) sort_by on 200k records",
    "d": "(d) upper/split/join on 100k lines",
}


def cold_start(cmd: list[str], runs: int = 20) -> float:
    """Median wall time of a whole process run."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="abcde", help="the rows to run, e.g. 'ad' (default: abcde)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help=f"timings per row, best kept (default: {REPEATS})")
    parser.add_argument("--no-nu", action="store_true", help="do not run (or install) Nushell")
    parser.add_argument("--state", action="store_true",
                        help="run the session state benchmark instead (encode/decode 10 MB of bindings)")
    args = parser.parse_args(argv)
    if args.state:
        print_state(session_state())
        return []
    repeats: int = args.repeats
    sys.setrecursionlimit(10_000)
    from conch.lang import compile_program
    from conch.lang.context import Context, Limits
    from conch.lang.values import LazyList, to_json_value

    def as_list_or_value(value: Any) -> Any:
        return value.materialize() if isinstance(value, LazyList) else value

    nu: str | None = None
    if not args.no_nu:
        try:
            nu = find_nu()
        except RuntimeError as exc:
            print(f"Nushell: not run ({exc})")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        data = make_data(Path(tmpdir))
        py_funcs: dict[str, Callable[[], Any]] = {
            "a": python_a,
            "b": lambda: python_b(data["b"]),
            "c": lambda: python_c(data["c"]),
            "d": lambda: python_d(data["d"]),
        }
        for key in "abcd":
            if key not in args.only:
                continue
            program = compile_program(CONCH[key])
            variables = {"data": data[key]} if key != "a" else {}
            # Lazy results are forced inside the timed region; the JSON conversion for the
            # agreement check is not part of the work being compared.
            t_conch, out_conch = best_of(lambda p=program, v=variables: as_list_or_value(p.run(variables=v)),
                                       repeats)
            t_py, out_py = best_of(py_funcs[key], repeats)
            assert to_json_value(out_conch) == out_py, f"{key}: conch and Python disagree"
            t_nu = nu_time(nu, NU[key], data["files"].get(key)) if nu else None
            results.append({"bench": LABELS[key], "conch": t_conch, "python": t_py, "nu": t_nu})
            if key == "a":
                # The same with limits, as the agent server runs programs: a checked compile
                # (steps counted, the clock watched, ``*`` bounded).
                ctx = Context(limits=Limits(wall_time_s=600, steps=50_000_000, recursion=1000,
                                            collection_size=10_000_000))
                t_checked, out_checked = best_of(lambda p=program, c=ctx: as_list_or_value(p.run(context=c)),
                                                 repeats)
                assert to_json_value(out_checked) == out_py, "a: checked conch and Python disagree"
                results.append({"bench": "(a) the same, checked (server limits)", "conch": t_checked,
                                "python": t_py, "nu": None})

    if "e" in args.only:
        # Start-up is measured with compiled bytecode in place, as users have it.
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        conch_bin = str(Path(sys.executable).parent / "conch")
        results.append(
            {
                "bench": "(e) cold start: -c '1 + 1'",
                "conch": cold_start([conch_bin, "-c", "1 + 1"]),
                # The same interpreter conch runs on (a version-manager shim would add its own start-up).
                "python": cold_start([sys.executable, "-c", "print(1 + 1)"]),
                "nu": cold_start([nu, "-c", "1 + 1"]) if nu else None,
            }
        )
    print_table(results, repeats)
    return results


def print_table(results: list[dict[str, Any]], repeats: int = REPEATS) -> None:
    print(f"\nconch language benchmark (Nushell {NU_VERSION}; best of {repeats}, cold start median of 20)")
    header = f"{'benchmark':46} {'conch':>9} {'python':>9} {'nushell':>9} {'conch/py':>9} {'nu/conch':>9}"
    print(header)
    print("-" * len(header))
    for r in results:
        nu_t = r["nu"]
        nu_col = f"{nu_t * 1000:8.1f}ms" if nu_t else "  not run"
        ratio = f"{nu_t / r['conch']:8.2f}x" if nu_t else "  not run"
        print(
            f"{r['bench']:46} {r['conch'] * 1000:8.1f}ms {r['python'] * 1000:8.1f}ms "
            f"{nu_col} {r['conch'] / r['python']:8.2f}x {ratio}"
        )


# -- a session's state as data (conch.lang.snapshot) --------------------------------------------

STATE_SETUP = """
let rows = range(0, 60000) | map(fn(i) => {id: i, name: "item ${i} of the catalogue", price: i * 1.25,
    qty: i % 97, ok: i % 3 == 0, note: if i % 5 == 0 { "checked" } else { null }}) | sort_by(fn(r) => r.id)
let readings = range(0, 200000) | map(fn(i) => i / 7) | sort
let text = range(0, 30000) | map(fn(i) => "line ${i}: the quick brown fox") | join("\\n")
let mut total = 0
let scale = 3
fn add(n) { total = total + n; total }
fn fib(n) => if n < 2 { n } else { fib(n - 1) + fib(n - 2) }
let scaled = fn(x) => fib(x) * scale
fn counter() { let mut n = 0; {inc: fn() => { n = n + 1; n }, get: fn() => n} }
let c = counter()
"""


def _median_ms(fn: Callable[[], Any], runs: int) -> tuple[float, Any]:
    times = []
    result = None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000, result


def session_state(runs: int = 15) -> dict[str, Any]:
    """Pause and resume of a session holding about 10 MB of bindings (a 60k-row Table, 200k
    Floats, a long String, functions and closures): the encoding of every binding to its JSON
    document (``export(raw=True)``), and the decoding of those documents into a fresh session
    (``restore``), medians in ms; the disk is the sessions' store's (not timed here). Then the
    cost of a save after a run that changes one small binding of 100: mark, run, the changed
    bindings, their encoding, in µs at the median."""
    from conch.lang import Session

    session = Session()
    session.run(STATE_SETUP)
    session.run("c.inc()")
    encode_ms, (docs, unsaved) = _median_ms(lambda: session.export(raw=True), runs)
    assert not unsaved, unsaved
    size = sum(len(d) for d in docs)

    def resume() -> Session:
        fresh = Session()
        damaged = fresh.restore(docs)
        assert not damaged, damaged
        return fresh

    decode_ms, fresh = _median_ms(resume, runs)
    assert fresh.run("[len(rows), rows[59999].price, c.get(), scaled(10), add(5)]") == [60000, 74998.75, 1, 165, 5]

    small = Session()
    small.run("\n".join(f"let mut v{i} = {i}" for i in range(100)))
    small.export()
    save_us, run_us = [], []
    for i in range(2000):
        t0 = time.perf_counter()
        mark = small.mark()
        t1 = time.perf_counter()
        small.run(f"v5 = {i}")
        t2 = time.perf_counter()
        small.export(small.changed_since(mark).changed)
        t3 = time.perf_counter()
        save_us.append((t1 - t0 + t3 - t2) * 1e6)
        run_us.append((t2 - t1) * 1e6)
    return {"bytes": size, "bindings": len(docs), "encode_ms": encode_ms, "decode_ms": decode_ms,
            "save_us": statistics.median(save_us), "run_us": statistics.median(run_us)}


def print_state(r: dict[str, Any]) -> None:
    print(f"\nsession state as data: {r['bindings']} bindings, {r['bytes'] / 1e6:.1f} MB of JSON")
    print(f"  pause  (encode every binding)      {r['encode_ms']:8.1f} ms  (median)")
    print(f"  resume (decode into a new session) {r['decode_ms']:8.1f} ms  (median)")
    print(f"  save after a small run             {r['save_us']:8.1f} µs  against the run's {r['run_us']:.1f} µs "
          f"({100 * r['save_us'] / r['run_us']:.1f} %)")


if __name__ == "__main__":
    main()
