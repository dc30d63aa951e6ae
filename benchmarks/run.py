"""`make bench`: every benchmark, each comparing conch with its peers side by side.

Pass names to run a subset: ``python benchmarks/run.py lang inference``.

Before the suites run, every peer they compare with is checked (and Nushell installed into
``.bench-cache``); the first table says which peers are ready, and why any is not, so a missing
column in a later table is never a silent dash. ``make bench`` installs the Python peers
through the ``bench`` extra.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SUITES = ["lang", "agent_server", "inference", "models", "providers", "studio", "orchestration", "marketplace"]


def main(argv: list[str]) -> int:
    chosen = argv or SUITES
    check_peers(chosen)
    failed = []
    for name in chosen:
        print(f"\n=== {name} ===", flush=True)
        try:
            importlib.import_module(name).main()
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"\nbenchmarks that failed to run: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
