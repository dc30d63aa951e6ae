"""The language server's latency on a 1,000-line document (docs/lsp.md): the first analysis
with empty caches, then the median and worst analysis after a one-line edit in the middle
(what the server does on each ``didChange``) and a completion at the edited position.

Run with ``make bench`` or ``python benchmarks/lsp.py [LINES]``. Timings only; what the
analysis finds is tested in tests/lsp.
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from pathlib import Path

TOUR = Path(__file__).resolve().parent.parent / "examples" / "tour.conch"
EDITS = 20

# The tour's bindings, renamed per copy so that the copies do not shadow one another.
_NAMES = re.compile(r"\b(name|n|square|clamp|double|rec|fields|indexing|total|big|joined|summed|value|"
                    r"bumped|table|column|file_count|first_notes|kind|kinds|r|thrown)\b")


def document(lines: int = 1000) -> str:
    """A realistic document: the tour's statements, copied until ``lines`` lines."""
    tour = TOUR.read_text().splitlines()[3:41]
    out: list[str] = []
    copy = 0
    while len(out) < lines:
        suffix = str(copy)
        out += [_NAMES.sub(lambda m, s=suffix: m.group(1) + s, line) for line in tour]
        copy += 1
    return "\n".join(out[:lines]) + "\n"


def latencies(text: str, edits: int = EDITS) -> dict[str, float]:
    """Milliseconds on ``text``: cold analysis, then analysis and completion per edit."""
    from conch.lsp import analysis, queries

    analysis.clear_cache()
    lines = text.split("\n")
    t0 = time.perf_counter()
    first = analysis.analyse(text)
    cold = (time.perf_counter() - t0) * 1000
    if first.diagnostics:
        raise RuntimeError(f"the document is not clean: {first.diagnostics[:3]}")
    middle = next(i for i in range(len(lines) // 2, len(lines)) if lines[i].startswith("let "))
    original = lines[middle]
    after_edit, completion = [], []
    for k in range(edits):
        lines[middle] = original.replace("let ", f"let edit{k}_", 1)
        t0 = time.perf_counter()
        a = analysis.analyse("\n".join(lines))
        t1 = time.perf_counter()
        queries.completions(a, middle, len(lines[middle]))
        t2 = time.perf_counter()
        after_edit.append((t1 - t0) * 1000)
        completion.append((t2 - t1) * 1000)
    return {
        "lines": float(len(lines)),
        "cold_ms": round(cold, 1),
        "edit_ms_median": round(statistics.median(after_edit), 1),
        "edit_ms_max": round(max(after_edit), 1),
        "completion_ms_median": round(statistics.median(completion), 1),
        "completion_ms_max": round(max(completion), 1),
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = sys.argv[1:] if argv is None else argv
    # run.py calls main() with the suite names on the command line: only a number is ours.
    lines = int(args[0]) if args and args[0].isdigit() else 1000
    result = latencies(document(lines))
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key:<{width}}  {value:g}")
    return result


if __name__ == "__main__":
    main()
