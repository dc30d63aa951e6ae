"""What the sandbox's kernel layers cost, side by side in one run.

Two comparisons:

- **old vs new** (``--baseline REV``, default ``main``): this tree's sandbox against the
  one at ``REV`` (exported with ``git archive`` into a temporary directory and imported
  from there: workers inherit ``PYTHONPATH``), both ``sandbox = "best-effort"`` with their
  defaults. Measured: pool start-up with one worker (the server's decisions and the first
  worker), a worker's own start-up (spawn to greeting, on a started pool: what a
  replacement costs), ``execute 1 + 1`` throughput at 1 and 16 callers, and one
  ``run_process("true")``.
- **off vs all layers** of this tree (start-up and throughput), as before.

Each measurement round runs in a fresh interpreter, alternating the two trees, so that a
burst of other load hits both alike; ratios are the median of the rounds' paired ratios.

Where the server runs as root, the workspace is put where the sandbox user can reach it, so
that the drop to that user is part of what is measured.

Targets (issue 33): worker start-up <= 1.3x the old; ``1 + 1`` throughput >= 0.97x;
``run_process("true")`` <= 1.2x. (Issue 23: all layers vs off, start-up <= 1.2x, throughput
>= 0.97x.)
"""

from __future__ import annotations

import argparse
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

STARTS = int(os.environ.get("CONCH_BENCH_STARTS", "4"))
ROUNDS = int(os.environ.get("CONCH_BENCH_ROUNDS", "5"))
DURATION_S = float(os.environ.get("CONCH_BENCH_SECONDS", "1"))
PROCESS_RUNS = int(os.environ.get("CONCH_BENCH_PROCESS_RUNS", "40"))
ROOT = Path(__file__).resolve().parents[1]


# -- one round, in a fresh interpreter (the tree under test is first on its path) ----------


def _settings(base: Path, name: str, workers: int, mode: str = "best-effort",
              **extra: Any) -> Any:
    from conch.config import Settings

    return Settings(data_dir=base / f"data-{name}", workspace=base / f"ws-{name}",
                    sandbox=mode, workers=workers, **extra)


async def _start_once(base: Path, name: str, mode: str = "best-effort", **extra: Any) -> float:
    from conch.sandbox.pool import SandboxPool

    pool = SandboxPool(_settings(base, name, 1, mode, **extra))
    started = time.perf_counter()
    await pool.start()
    elapsed = time.perf_counter() - started
    await pool.close()
    return elapsed


async def _spawns(base: Path, name: str, count: int, **extra: Any) -> list[float]:
    """A worker's own start-up: spawn to greeting on a started pool (a replacement)."""
    from conch.sandbox.pool import SandboxPool

    pool = SandboxPool(_settings(base, name, 1, **extra))
    await pool.start()
    times = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            worker = await pool._spawn()
            times.append(time.perf_counter() - started)
            pool._replace(worker, "recycle")
            await asyncio.sleep(0.05)  # let the old one be reaped
    finally:
        await pool.close()
    return times


async def _throughput(pool: Any, callers: int) -> float:
    from conch.sandbox.pool import Job

    job = Job(mode="program", source="1 + 1")
    stop = time.perf_counter() + DURATION_S
    done = 0

    async def caller() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await pool.run(job)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return done / (time.perf_counter() - started)


async def _process_ms(base: Path) -> float:
    from conch.sandbox.pool import Job, SandboxPool

    pool = SandboxPool(_settings(base, "process", 1, allow_process=True))
    await pool.start()
    job = Job(mode="program", source='run_process("true")')
    try:
        for _ in range(3):
            await pool.run(job)
        times = []
        for _ in range(PROCESS_RUNS):
            started = time.perf_counter()
            answer = await pool.run(job)
            times.append(time.perf_counter() - started)
            assert answer.success, answer
        return statistics.median(times) * 1000
    finally:
        await pool.close()


async def _round(base: Path, modes: bool) -> dict[str, Any]:
    from conch.sandbox.pool import SandboxPool

    out: dict[str, Any] = {
        "start": statistics.median([await _start_once(base, "start") for _ in range(STARTS)]),
        "spawn": statistics.median(await _spawns(base, "spawn", STARTS)),
        "true_ms": await _process_ms(base),
    }
    pool = SandboxPool(_settings(base, "rps", 2))
    await pool.start()
    out["layers"] = pool.describe_layers()
    try:
        for callers in (1, 16):
            out[f"rps{callers}"] = await _throughput(pool, callers)
    finally:
        await pool.close()
    if modes:
        out["start_off"] = statistics.median(
            [await _start_once(base, "off", "off") for _ in range(STARTS)])
        off = SandboxPool(_settings(base, "rps-off", 2, "off"))
        await off.start()
        try:
            for callers in (1, 16):
                out[f"rps{callers}_off"] = await _throughput(off, callers)
        finally:
            await off.close()
        if "network_stack" in out["layers"] or _has_stack():
            out["spawn_network"] = statistics.median(
                await _spawns(base, "net", STARTS, allow_network=True))
    return out


def _has_stack() -> bool:
    try:
        from conch.sandbox import slirp
    except ImportError:
        return False
    return slirp.find()[0] is not None


def measure(modes: bool) -> None:
    base = Path(tempfile.mkdtemp(prefix="conch-bench-sandbox-"))
    base.chmod(0o755)  # reachable by the sandbox user when this runs as root
    try:
        print(json.dumps(asyncio.run(_round(base, modes))))
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


# -- the driver ------------------------------------------------------------------------------


def _export(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def _child(src: Path, modes: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(src), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure"]
                          + (["--modes"] if modes else []),
                          env=env, capture_output=True, text=True, check=False, cwd=str(ROOT))
    if done.returncode != 0:
        raise SystemExit(f"a measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="main", help="the git revision to compare with")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--modes", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.modes)
        return
    scratch = Path(tempfile.mkdtemp(prefix="conch-bench-baseline-"))
    try:
        old_src = _export(args.baseline, scratch)
        new_src = ROOT / "src"
        rounds: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
        for i in range(ROUNDS):
            order = (("old", old_src), ("new", new_src))
            for name, src in order if i % 2 == 0 else order[::-1]:
                rounds[name].append(_child(src, modes=name == "new"))
                print(f"round {i + 1}/{ROUNDS} {name}: done", file=sys.stderr)
    finally:
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    _report(args.baseline, rounds)


def _paired(rounds: dict[str, list[dict[str, Any]]], key: str) -> float:
    return statistics.median(n[key] / o[key] for o, n in zip(rounds["old"], rounds["new"],
                                                            strict=True))


def _report(baseline: str, rounds: dict[str, list[dict[str, Any]]]) -> None:
    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds[name])

    print(f"old ({baseline}) layers: {rounds['old'][0]['layers']}")
    print(f"new layers: {rounds['new'][0]['layers']}")
    print(f"{'measure':<40}{'old':>12}{'new':>12}{'ratio':>9}{'target':>10}")
    rows = [("pool start-up, 1 worker (ms)", "start", 1000, "", False),
            ("worker start-up (ms)", "spawn", 1000, "<= 1.3x", False),
            ("execute 1 + 1, 1 caller (runs/s)", "rps1", 1, ">= 0.97x", True),
            ("execute 1 + 1, 16 callers (runs/s)", "rps16", 1, ">= 0.97x", True),
            ('run_process("true") (ms)', "true_ms", 1, "<= 1.2x", False)]
    for label, key, scale, target, _higher in rows:
        print(f"{label:<40}{med('old', key) * scale:>12.1f}{med('new', key) * scale:>12.1f}"
              f"{_paired(rounds, key):>8.2f}x{target:>10}")
    new = rounds["new"]
    print("\nthis tree, sandbox off vs all layers:")
    start_ratio = statistics.median(r["start"] / r["start_off"] for r in new)
    print(f"{'pool start-up, 1 worker (ms)':<40}{med('new', 'start_off') * 1000:>12.1f}"
          f"{med('new', 'start') * 1000:>12.1f}{start_ratio:>8.2f}x")
    for callers in (1, 16):
        ratio = statistics.median(r[f"rps{callers}"] / r[f"rps{callers}_off"] for r in new)
        print(f"{f'execute 1 + 1, {callers} callers (runs/s)':<40}"
              f"{med('new', f'rps{callers}_off'):>12.0f}{med('new', f'rps{callers}'):>12.0f}"
              f"{ratio:>8.2f}x")
    if all("spawn_network" in r for r in new):
        print(f"{'worker start-up, allow_network (ms)':<40}{'':>12}"
              f"{med('new', 'spawn_network') * 1000:>12.1f}")
    print("(ratios: the median of the rounds' paired ratios)")


if __name__ == "__main__":
    main()
