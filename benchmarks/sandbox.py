"""What the sandbox's kernel layers cost, side by side in one run.

Two comparisons:

- **old vs new** (``--baseline REV``, default ``main``): this tree's sandbox against the
  one at ``REV`` (exported with ``git archive`` into a temporary directory and imported
  from there: workers inherit ``PYTHONPATH``), both ``sandbox = "best-effort"`` with their
  defaults. Measured: pool start-up with one worker (the server's decisions and the first
  worker), a worker's own start-up (spawn to greeting, on a started pool: what a
  replacement costs), ``execute 1 + 1`` throughput at 1 and 16 callers (and the CPU time,
  server's and workers', each run costs: on a busy machine the steadier measure), and one
  ``run_process("true")``.
- **off vs all layers** of this tree (start-up and throughput), as before.

Each tree runs in a measuring process of its own, kept for the whole run; the driver asks
them in turn for one short window of each measure (a start-up, a second of throughput,
twenty ``run_process`` calls), alternating which goes first, so that other load on the
machine hits both alike; ratios are the median of the windows' paired ratios.

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
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROUNDS = int(os.environ.get("CONCH_BENCH_ROUNDS", "12"))
DURATION_S = float(os.environ.get("CONCH_BENCH_SECONDS", "1"))
PROCESS_RUNS = int(os.environ.get("CONCH_BENCH_PROCESS_RUNS", "20"))
ROOT = Path(__file__).resolve().parents[1]


# -- a measuring process (the tree under test first on its path), driven over stdin ------


def _settings(base: Path, name: str, workers: int, mode: str = "best-effort",
              **extra: Any) -> Any:
    from conch.config import Settings

    return Settings(data_dir=base / f"data-{name}", workspace=base / f"ws-{name}",
                    sandbox=mode, workers=workers, **extra)


class Bench:
    """The pools one tree's measurements use, kept between the driver's requests so that
    each request measures one short window."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.pools: dict[str, Any] = {}
        self.count = 0

    async def pool(self, name: str, workers: int, mode: str = "best-effort",
                   **extra: Any) -> Any:
        from conch.sandbox.pool import SandboxPool

        if name not in self.pools:
            pool = SandboxPool(_settings(self.base, name, workers, mode, **extra))
            await pool.start()
            self.pools[name] = pool
        return self.pools[name]

    async def start(self, mode: str = "best-effort") -> float:
        """Pool start-up with one worker: the server's decisions and its first worker."""
        from conch.sandbox.pool import SandboxPool

        self.count += 1
        pool = SandboxPool(_settings(self.base, f"start-{self.count}", 1, mode))
        started = time.perf_counter()
        await pool.start()
        elapsed = time.perf_counter() - started
        await pool.close()
        return elapsed * 1000

    async def spawn(self, **extra: Any) -> float:
        """A worker's own start-up: spawn to greeting on a started pool (a replacement)."""
        pool = await self.pool("spawn-" + "-".join(extra), 1, **extra)
        started = time.perf_counter()
        worker = await pool._spawn()
        elapsed = time.perf_counter() - started
        # Ended without a replacement (which would start in the background, during the
        # next window), and what it held given back (where the tree keeps such things).
        worker.kill()
        pool._workers.discard(worker)
        await asyncio.to_thread(worker.process.wait)
        gone = getattr(pool, "_gone", None)
        if gone is not None:
            await asyncio.to_thread(gone, worker)
        return elapsed * 1000

    async def rps(self, callers: int, mode: str = "best-effort") -> float:
        from conch.sandbox.jobs import Job

        pool = await self.pool(f"rps-{mode}", 2, mode)
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

    async def cpu(self, callers: int, runs: int = 4000) -> float:
        """CPU time (server and workers, from the kernel's accounting) per ``1 + 1``, in
        microseconds: what throughput costs, which other load on the machine does not
        change the way it changes runs per second."""
        import resource

        from conch.sandbox.jobs import Job

        pool = await self.pool("rps-best-effort", 2)
        job = Job(mode="program", source="1 + 1")
        each = max(1, runs // callers)

        def used() -> float:
            own = resource.getrusage(resource.RUSAGE_SELF)
            total = own.ru_utime + own.ru_stime
            for pid in pool.worker_pids():
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            return total

        async def caller() -> None:
            for _ in range(each):
                await pool.run(job)

        before = used()
        await asyncio.gather(*(caller() for _ in range(callers)))
        return (used() - before) / (each * callers) * 1e6

    async def process(self) -> float:
        """The lower quartile of a window's ``run_process("true")`` runs, in milliseconds:
        on a machine others share, the slower runs of a window time their load."""
        from conch.sandbox.jobs import Job

        pool = await self.pool("process", 1, allow_process=True)
        job = Job(mode="program", source='run_process("true")')
        times = []
        for _ in range(PROCESS_RUNS):
            started = time.perf_counter()
            answer = await pool.run(job)
            times.append(time.perf_counter() - started)
            assert answer.success, answer
        return statistics.quantiles(times, n=4)[0] * 1000

    async def close(self) -> None:
        for pool in self.pools.values():
            await pool.close()


async def _serve(base: Path) -> None:
    bench = Bench(base)
    loop = asyncio.get_running_loop()
    try:
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            request = json.loads(line)
            if request["do"] == "layers":
                pool = await bench.pool("rps-best-effort", 2)
                answer: Any = pool.describe_layers()
            else:
                answer = await getattr(bench, request["do"])(*request.get("args", []),
                                                            **request.get("kwargs", {}))
            print(json.dumps(answer), flush=True)
    finally:
        await bench.close()


def measure() -> None:
    base = Path(tempfile.mkdtemp(prefix="conch-bench-sandbox-"))
    base.chmod(0o755)  # reachable by the sandbox user when this runs as root
    try:
        asyncio.run(_serve(base))
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


# -- the driver ------------------------------------------------------------------------------


def _export(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


class Tree:
    """A measuring process importing one tree."""

    def __init__(self, src: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(src), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--measure"], env=env, cwd=str(ROOT),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, do: str, *args: Any, **kwargs: Any) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"do": do, "args": args, "kwargs": kwargs}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"a measuring process ended (status {self.process.wait()})")
        return json.loads(line)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(60)


# (label, request, arguments, scale, target): each measured in windows alternating between
# the two trees, paired window by window.
MEASURES = [
    ("pool start-up, 1 worker (ms)", "start", (), ""),
    ("worker start-up (ms)", "spawn", (), "<= 1.3x"),
    ("execute 1 + 1, 1 caller (runs/s)", "rps", (1,), ">= 0.97x"),
    ("execute 1 + 1, 16 callers (runs/s)", "rps", (16,), ">= 0.97x"),
    ("execute 1 + 1, 1 caller (CPU us/run)", "cpu", (1,), "<= 1.03x"),
    ("execute 1 + 1, 16 callers (CPU us/run)", "cpu", (16,), "<= 1.03x"),
    ('run_process("true"), lower quartile (ms)', "process", (), "<= 1.2x"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="main", help="the git revision to compare with")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure()
        return
    scratch = Path(tempfile.mkdtemp(prefix="conch-bench-baseline-"))
    trees: dict[str, Tree] = {}
    try:
        trees = {"old": Tree(_export(args.baseline, scratch)), "new": Tree(ROOT / "src")}
        layers = {name: tree.ask("layers") for name, tree in trees.items()}
        results: dict[str, dict[str, list[float]]] = {}
        for label, do, call, _target in MEASURES:
            results[label] = {"old": [], "new": []}
            for i in range(ROUNDS):
                for name in ("old", "new") if i % 2 == 0 else ("new", "old"):
                    results[label][name].append(trees[name].ask(do, *call))
            print(f"{label}: done", file=sys.stderr)
        new = trees["new"]
        modes: dict[str, dict[str, list[float]]] = {}
        for label, do, call in (("pool start-up, 1 worker (ms)", "start", ()),
                                ("execute 1 + 1, 1 caller (runs/s)", "rps", (1,)),
                                ("execute 1 + 1, 16 callers (runs/s)", "rps", (16,))):
            modes[label] = {"off": [], "best-effort": []}
            for i in range(ROUNDS):
                for mode in ("off", "best-effort") if i % 2 == 0 else ("best-effort", "off"):
                    modes[label][mode].append(new.ask(do, *call, mode=mode))
        network = None
        if shutil.which("slirp4netns"):
            network = [new.ask("spawn", allow_network=True) for _ in range(ROUNDS)]
    finally:
        for tree in trees.values():
            tree.close()
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    _report(args.baseline, layers, results, modes, network)


def _ratio(a: list[float], b: list[float]) -> float:
    """The median of the windows' paired ratios ``b / a``."""
    return statistics.median(y / x for x, y in zip(a, b, strict=True))


def _report(baseline: str, layers: dict[str, str], results: dict[str, dict[str, list[float]]],
            modes: dict[str, dict[str, list[float]]], network: list[float] | None) -> None:
    print(f"old ({baseline}) layers: {layers['old']}")
    print(f"new layers: {layers['new']}")
    print(f"{'measure':<40}{'old':>12}{'new':>12}{'ratio':>9}{'target':>10}")
    for label, _do, _call, target in MEASURES:
        old, new = results[label]["old"], results[label]["new"]
        print(f"{label:<40}{statistics.median(old):>12.1f}{statistics.median(new):>12.1f}"
              f"{_ratio(old, new):>8.2f}x{target:>10}")
    print("\nthis tree, sandbox off vs all layers:")
    for label, values in modes.items():
        off, on = values["off"], values["best-effort"]
        print(f"{label:<40}{statistics.median(off):>12.1f}{statistics.median(on):>12.1f}"
              f"{_ratio(off, on):>8.2f}x")
    if network:
        print(f"{'worker start-up, allow_network (ms)':<40}{'':>12}"
              f"{statistics.median(network):>12.1f}")
    print(f"(medians of {ROUNDS} windows each, alternating between the trees; ratios: the "
          "median of the windows' paired ratios)")


if __name__ == "__main__":
    main()
