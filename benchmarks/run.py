"""`make bench`: every benchmark, each comparing conch with its peers side by side.

Pass names to run a subset: ``python benchmarks/run.py lang inference``.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SUITES = ["lang", "agent_server", "inference", "models", "providers"]


def main(argv: list[str]) -> int:
    chosen = argv or SUITES
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
