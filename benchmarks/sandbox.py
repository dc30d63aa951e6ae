"""What the sandbox's kernel layers cost: worker start-up and ``1 + 1`` throughput, with every
layer this machine offers (``sandbox = "best-effort"``) against none (``"off"``), side by side
in one run.

Layers are applied once per worker, when it starts, so start-up is where they can cost, and
a job should not notice them. Start-up is the time from spawning a worker to its greeting
(median of several pools of one worker, alternating between the two modes). Throughput is
measured on the pool itself (two workers, no HTTP in front: HTTP costs the same in both
modes and would hide a difference), at 1 and 16 concurrent callers, in alternating rounds
with the median reported.

Where the server runs as root, the workspace is put where the sandbox user can reach it, so
that the drop to that user is part of what is measured.

Targets (issue 23): start-up with all layers <= 1.2x without; throughput >= 0.97x.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from conch.config import Settings
from conch.sandbox.pool import Job, SandboxPool

STARTS = int(os.environ.get("CONCH_BENCH_STARTS", "8"))
ROUNDS = int(os.environ.get("CONCH_BENCH_ROUNDS", "9"))
DURATION_S = float(os.environ.get("CONCH_BENCH_SECONDS", "1"))
MODES = ("off", "best-effort")


def _settings(base: Path, mode: str, workers: int) -> Settings:
    return Settings(data_dir=base / f"data-{mode}", workspace=base / f"ws-{mode}",
                    sandbox=mode, workers=workers)  # type: ignore[arg-type]


async def _start_once(base: Path, mode: str) -> float:
    pool = SandboxPool(_settings(base, mode, 1))
    started = time.perf_counter()
    await pool.start()
    elapsed = time.perf_counter() - started
    await pool.close()
    return elapsed


async def _throughput(pool: SandboxPool, callers: int) -> float:
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


async def run(base: Path) -> dict[str, Any]:
    starts: dict[str, list[float]] = {mode: [] for mode in MODES}
    for i in range(STARTS):
        for mode in MODES if i % 2 == 0 else MODES[::-1]:
            starts[mode].append(await _start_once(base, mode))
    results: dict[str, Any] = {f"start/{m}": statistics.median(v) for m, v in starts.items()}
    results["ratio/start"] = statistics.median(
        on / off for on, off in zip(starts["best-effort"], starts["off"], strict=True))
    pools = {mode: SandboxPool(_settings(base, mode, 2)) for mode in MODES}
    for pool in pools.values():
        await pool.start()
    results["layers"] = pools["best-effort"].describe_layers()
    try:
        for callers in (1, 16):
            rounds: dict[str, list[float]] = {mode: [] for mode in MODES}
            for i in range(ROUNDS):
                for mode in MODES if i % 2 == 0 else MODES[::-1]:
                    rounds[mode].append(await _throughput(pools[mode], callers))
            for mode, values in rounds.items():
                results[f"rps/{callers}/{mode}"] = statistics.median(values)
            # Paired by round, so that a burst of other load hits both modes alike.
            results[f"ratio/{callers}"] = statistics.median(
                on / off for on, off in zip(rounds["best-effort"], rounds["off"], strict=True))
    finally:
        for pool in pools.values():
            await pool.close()
    return results


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="conch-bench-sandbox-"))
    base.chmod(0o755)  # reachable by the sandbox user when this runs as root
    try:
        results = asyncio.run(run(base))
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    print(f"layers: {results['layers']}")
    print(f"{'measure':<34}{'off':>12}{'all layers':>12}{'ratio':>10}{'target':>10}")
    off, on = results["start/off"], results["start/best-effort"]
    print(f"{'worker start-up (ms)':<34}{off * 1000:>12.1f}{on * 1000:>12.1f}"
          f"{results['ratio/start']:>9.2f}x{'<= 1.2x':>10}")
    for callers in (1, 16):
        off, on = results[f"rps/{callers}/off"], results[f"rps/{callers}/best-effort"]
        print(f"{f'execute 1 + 1, {callers} callers (runs/s)':<34}{off:>12.0f}{on:>12.0f}"
              f"{results[f'ratio/{callers}']:>9.2f}x{'>= 0.97x':>10}")
    print("(ratios: the median of the rounds' paired ratios)")


if __name__ == "__main__":
    main()
