"""The conformance corpus: every case in ``tests/lang/cases/*.txt`` runs as a conch program.

Format (see docs/architecture.md)::

    === name
    program lines
    --> JSON value | !Kind | !Kind@line:col

Each case runs in a fresh temporary workspace, with printed output collected. A program line
``#! limits collection_size=10 wall_time_s=0.5`` (a conch comment) runs the case with those
limits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from conch.lang import run, values
from conch.lang.context import Context, Limits
from conch.lang.errors import ConchError

CASES_DIR = Path(__file__).parent / "cases"


@dataclass
class Case:
    file: str
    line: int
    name: str
    program: str
    expected: str


def parse_cases(path: Path) -> list[Case]:
    cases: list[Case] = []
    name: str | None = None
    start = 0
    body: list[str] = []
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if raw.startswith("=== "):
            if name is not None:
                raise ValueError(f"{path.name}:{start}: case {name!r} has no '-->' line")
            name, start, body = raw[4:].strip(), lineno, []
        elif raw.startswith("--> ") or raw == "-->":
            if name is None:
                raise ValueError(f"{path.name}:{lineno}: '-->' outside a case")
            cases.append(Case(path.name, start, name, "\n".join(body), raw[4:].strip()))
            name = None
        elif name is not None:
            body.append(raw)
        elif raw.strip() and not raw.lstrip().startswith("#"):
            raise ValueError(f"{path.name}:{lineno}: text outside a case: {raw!r}")
    if name is not None:
        raise ValueError(f"{path.name}:{start}: case {name!r} has no '-->' line")
    return cases


def case_limits(program: str) -> Limits:
    limits = Limits()
    for line in program.splitlines():
        if line.startswith("#! limits "):
            for pair in line.removeprefix("#! limits ").split():
                key, _, value = pair.partition("=")
                setattr(limits, key, float(value) if "." in value else int(value))
    return limits


ALL_CASES = [c for f in sorted(CASES_DIR.glob("*.txt")) for c in parse_cases(f)]


def test_corpus_is_large_and_names_are_unique() -> None:
    syntax = [c for c in ALL_CASES if c.file.startswith("syntax_")]
    assert len(syntax) >= 250
    seen: set[tuple[str, str]] = set()
    for c in ALL_CASES:
        key = (c.file, c.name)
        assert key not in seen, f"duplicate case name {c.name!r} in {c.file}"
        seen.add(key)


@pytest.mark.parametrize("case", ALL_CASES, ids=[f"{c.file}:{c.line}:{c.name}" for c in ALL_CASES])
def test_case(case: Case, tmp_path: Path) -> None:
    printed: list[str] = []
    ctx = Context(workspace=tmp_path, output=printed.append, limits=case_limits(case.program))
    expected = case.expected
    try:
        result = values.to_json_value(run(case.program, context=ctx))
    except ConchError as err:
        if not expected.startswith("!"):
            pytest.fail(f"{case.name}: expected {expected}, got error\n{err.render(case.program)}")
        kind, _, where = expected[1:].partition("@")
        assert err.kind == kind, f"{case.name}: expected {kind}, got\n{err.render(case.program)}"
        if where:
            line, col = (int(x) for x in where.split(":"))
            assert (err.line, err.column) == (line, col), (
                f"{case.name}: expected position {line}:{col}, got {err.line}:{err.column}\n"
                f"{err.render(case.program)}"
            )
        return
    if expected.startswith("!"):
        pytest.fail(f"{case.name}: expected error {expected}, got value {result!r}")
    assert result == json.loads(expected), case.name
