"""Fused pipelines (``conch.lang.fusion``) against the same programs compiled as written.

Every corpus case and every builtin example runs twice, fused and with ``fuse=False``, in a
plain run and in a checked one (with limits, as the server runs): the values, the printed
output and the errors (kind, message, hint, line, column) must be the same. Then each fused
shape on its own: that it is fused, what it gives, and where its errors are.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import pytest

from conch.lang import compile_program, run, values
from conch.lang.builtins.registry import all_builtins
from conch.lang.context import Context, Limits
from conch.lang.errors import ConchError
from conch.lang.values import LazyList

from .test_cases import ALL_CASES, Case, case_limits

# -- fused and unfused agree ---------------------------------------------------------------


def outcome(source: str, fuse: bool, workspace: Path, limits: Limits) -> tuple[Any, ...]:
    """What a run shows: its value (as JSON) or its error, and what it printed."""
    workspace.mkdir(parents=True)
    printed: list[str] = []
    ctx = Context(workspace=workspace, output=printed.append, limits=limits)
    try:
        value = run(source, context=ctx, fuse=fuse)
        if isinstance(value, LazyList):
            value = value.materialize()
        result: tuple[Any, ...] = ("value", values.to_json_value(value))
    except ConchError as err:
        result = ("error", err.kind, err.message, err.hint, err.line, err.column)
    return result, printed


def checked_limits(limits: Limits) -> Limits:
    """The case's limits, or a generous step limit: a checked compile either way."""
    if limits.steps is None and limits.wall_time_s is None and limits.collection_size is None:
        return Limits(steps=10_000_000)
    return limits


_NONDETERMINISTIC = ("uuid", "now", "random", "time", "date", "env", "shuffle", "sample", "pid")


def _agree(source: str, limits: Limits, tmp_path: Path, deterministic: bool = True) -> None:
    fused = outcome(source, True, tmp_path / "fused", limits)
    plain = outcome(source, False, tmp_path / "unfused", limits)
    if not deterministic:
        assert fused[0][0] == plain[0][0], source
        return
    assert fused == plain, source


@pytest.mark.parametrize("checked", [False, True], ids=["plain", "checked"])
@pytest.mark.parametrize("case", ALL_CASES, ids=[f"{c.file}:{c.line}:{c.name}" for c in ALL_CASES])
def test_corpus_case_fused_and_unfused_agree(case: Case, checked: bool, tmp_path: Path) -> None:
    limits = case_limits(case.program)
    if checked:
        limits = checked_limits(limits)
    elif limits != Limits():
        pytest.skip("the case runs with limits: its checked run is the one compared")
    _agree(case.program, limits, tmp_path,
           deterministic=not any(w in case.program for w in _NONDETERMINISTIC))


EXAMPLES = [(b.name, i, e) for b in all_builtins() for i, e in enumerate(b.examples)]


@pytest.mark.parametrize("checked", [False, True], ids=["plain", "checked"])
@pytest.mark.parametrize(("name", "index", "example"), EXAMPLES, ids=[f"{n}[{i}]" for n, i, _ in EXAMPLES])
def test_builtin_example_fused_and_unfused_agree(name: str, index: int, example: Any, checked: bool,
                                                 tmp_path: Path) -> None:
    if name in ("ai", "embed", "agent", "sleep") or name.startswith("http"):
        pytest.skip("needs a model, the network or time; no pipeline to fuse")
    limits = checked_limits(Limits()) if checked else Limits()
    _agree(example.code, limits, tmp_path, deterministic=example.has_result)


# -- the shapes that are fused -------------------------------------------------------------


def is_fused(source: str) -> bool:
    """Whether the program's code holds a fused loop (a generated function or comprehension)."""
    code = compile_program(source)._plain.code

    def names(co: Any) -> list[str]:
        out = [co.co_name]
        for const in co.co_consts:
            if hasattr(const, "co_name"):
                out += names(const)
        return out

    return any(n.startswith("$fused") or n in ("<listcomp>", "<genexpr>") for n in names(code))


def both(source: str, **kwargs: Any) -> Any:
    """The fused result, after checking the unfused one is the same."""
    fused = run(source, fuse=True, **kwargs)
    unfused = run(source, fuse=False, **kwargs)
    if isinstance(fused, LazyList):
        assert isinstance(unfused, LazyList)
        fused, unfused = fused.materialize(), unfused.materialize()
    assert values.to_json_value(fused) == values.to_json_value(unfused)
    assert type(fused) is type(unfused)
    return fused


def error(source: str, fuse: bool = True, **kwargs: Any) -> ConchError:
    with pytest.raises(ConchError) as info:
        value = run(source, fuse=fuse, **kwargs)
        if isinstance(value, LazyList):
            value.materialize()
    return info.value


def same_error(source: str, **kwargs: Any) -> ConchError:
    """The fused error, after checking the unfused one is the same (kind, text, position)."""
    a, b = error(source, True, **kwargs), error(source, False, **kwargs)
    assert (a.kind, a.message, a.hint, a.line, a.column) == (b.kind, b.message, b.hint, b.line, b.column)
    return a


SHAPES = [
    # (program, value): lists (one comprehension per stage) ...
    ("[1, 2, 3] | map(fn(x) => x * 2)", [2, 4, 6]),
    ("[1, 2, 3, 4] | where(fn(x) => x % 2 == 0)", [2, 4]),
    ("[1, 2, 3, 4] | filter(fn(x) => x > 2)", [3, 4]),
    ("[1, 2, 3] | each(fn(x) => if x > 1 { x } else { null })", [2, 3]),
    ("[1, 2, 5, 1] | take_while(fn(x) => x < 3)", [1, 2]),
    ("[1, 2, 3, 4] | map(fn(x) => x * 10) | take(2)", [10, 20]),
    ("[1, 2, 3, 4] | map(fn(x) => x * 10) | skip(3)", [40]),
    ("[1, 2, 3] | map(fn(x) => x + 1) | reduce(fn(a, b) => a * b)", 24),
    ("[1, 2, 3] | reduce(fn(a, b) => a + b, 10)", 16),
    ("[] | reduce(fn(a, b) => a + b, 0)", 0),
    ("[1, 2, 3] | map(fn(x) => x * 2) | sum", 12),
    ("map([1, 2], fn(x) => x + 1)", [2, 3]),
    ("sum(where(map([1, 2, 3], fn(x) => x * 3), fn(x) => x > 3))", 15),
    ('["a b", "c"] | map(fn(s) => s | upper | split(" ") | join("-"))', ["A-B", "C"]),
    ('let xs = ["x", "yy"]\nxs | map(fn(s) => len(s))', [1, 2]),
    # ... and Ranges (one generator for the chain)
    ("range(0, 10) | map(fn(x) => x * 2) | where(fn(x) => x % 3 == 0) | sum", 36),
    ("range(0, 10**9) | map(fn(x) => x * 2) | take(3)", [0, 2, 4]),
    ("0..10 | where(fn(x) => x > 6)", [7, 8, 9]),
    ("range(0, 10) | skip(7) | map(fn(x) => x)", [7, 8, 9]),
    ("range(0, 10) | map(fn(x) => x) | skip(2) | take(2)", [2, 3]),
    ("range(0, 10) | map(fn(x) => x) | take(0)", []),
    ("range(0, 10) | take_while(fn(x) => x < 3) | map(fn(x) => -x)", [0, -1, -2]),
    ("range(0, 5) | each(fn(x) => if x % 2 == 0 { x } else { null }) | sum", 6),
    ("range(1, 5) | map(fn(x) => x * 1.5) | sum", 15.0),
    ("range(1, 6) | map(fn(x) => x) | reduce(fn(a, b) => a * b)", 120),
    ("range(0, 0) | map(fn(x) => x) | reduce(fn(a, b) => a + b, 7)", 7),
    ("range(0, 10) | where(fn(x) => x > 5) | take(2) | where(fn(x) => x > 6) | map(fn(x) => x * 100)", [700]),
    ("[1, 2, 3, 4] | map(fn(x) => x * 2) | count(fn(x) => x > 4)", 2),
    ("range(0, 10) | map(fn(x) => x * 2) | count(fn(x) => x % 4 == 0)", 5),
    ("range(0, 10**9) | map(fn(x) => x * 2) | any(fn(x) => x > 5)", True),
    ("[1, 2] | any(fn(x) => x > 5)", False),
    ("range(0, 10**9) | all(fn(x) => x < 3)", False),
    ("[2, 4] | map(fn(x) => x + 1) | all(fn(x) => x % 2 == 1)", True),
]


@pytest.mark.parametrize(("source", "expected"), SHAPES, ids=[s for s, _ in SHAPES])
def test_fused_shapes(source: str, expected: Any) -> None:
    assert is_fused(source), source
    assert values.to_json_value(both(source)) == expected


@pytest.mark.parametrize("source", [
    "let mut k = 1\n[1, 2] | map(fn(x) => x + k)",  # a mutable binding: left as written
    "[1, 2] | map(fn(x) => { let y = x; y })",  # a block body
    "[1, 2] | map(fn(x, y) => x)",  # not the arity the builtin calls with
    "let map = fn(xs, f) => 1\n[1] | map(fn(x) => x)",  # not the builtin
    "[1, 2] | map(len)",  # not a lambda
])
def test_not_fused(source: str, tmp_path: Path) -> None:
    assert not is_fused(source)
    _agree(source, Limits(), tmp_path)


def test_lazy_chain_stays_lazy_and_streams() -> None:
    printed: list[str] = []
    ctx = Context(output=printed.append)
    lazy = run("range(0, 10**9) | map(fn(x) => { print(str(x)); x }) | where(fn(x) => x > 0)", context=ctx)
    # a block body is not inlined, but a lazy chain of simple ones is one generator:
    assert isinstance(lazy, LazyList)
    lazy = run("range(0, 10**9) | map(fn(x) => x * 2) | where(fn(x) => x % 3 == 0)", context=ctx)
    assert isinstance(lazy, LazyList)
    assert list(itertools.islice(lazy, 3)) == [0, 6, 12]
    assert list(itertools.islice(lazy, 4)) == [0, 6, 12, 18]  # memoised, and continues


def test_effects_keep_their_order() -> None:
    """Stage by stage on a list, element by element on a Range, as the builtins do."""
    for source in (
        '[1, 2] | map(fn(x) => print("m${x}")) | map(fn(x) => print("n"))',
        'range(1, 3) | map(fn(x) => print("m${x}")) | map(fn(x) => print("n")) | len',
        'range(0, 100) | each(fn(x) => print("e${x}")) | take(2) | len',
        'range(0, 100) | map(fn(x) => print("e${x}")) | skip(2) | take(1) | len',
        'range(0, 100) | map(fn(x) => { print("a${x}"); x }) | any(fn(x) => print("t${x}") == null && x > 1)',
        '[1, 2, 3] | map(fn(x) => print("m${x}")) | all(fn(x) => print("t") != null)',
    ):
        assert is_fused(source), source
        out: dict[bool, list[str]] = {}
        for fuse in (True, False):
            printed: list[str] = []
            run(source, context=Context(output=printed.append), fuse=fuse)
            out[fuse] = printed
        assert out[True] == out[False], source


def test_generators_capture_values_like_lambdas() -> None:
    source = """
let mut gens = []
for i in 0..3 {
  let k = i * 10
  gens = gens + [range(0, 2) | map(fn(x) => x + k)]
}
gens | map(fn(g) => g | sum)
"""
    assert both(source) == [1, 21, 41]


# -- errors: the same kind, message and position ----------------------------------------------

ERRORS = [
    # (program, kind, line, column): inside an inlined body ...
    ('[1, "a"] | map(fn(x) => x * 2 + 1)', "TypeError", 1, 31),
    ("range(0, 5) | map(fn(x) => 10 / (x - 2)) | sum", "ZeroDivisionError", 1, 31),
    ("range(0, 5) | map(fn(x) => 10 / (x - 2))", "ZeroDivisionError", 1, 31),
    ('[1, 2] |\n  map(fn(x) => x)\n  | where(fn(x) => x.name == "a")', "TypeError", 3, 22),
    ("[true] | map(fn(x) => x * 2)", "TypeError", 1, 25),
    ('["a", 1] | map(fn(s) => upper(s))', "TypeError", 1, 25),
    ('["a", 1] | map(fn(s) => s | upper)', "TypeError", 1, 29),
    ('[[1], 2] | map(fn(s) => len(s))', "TypeError", 1, 25),
    ("[1, 2] | reduce(fn(a, b) => a + b + true)", "TypeError", 1, 35),
    # ... and the builtins' own checks, at the stage
    ("[1, 2] | where(fn(x) => x)", "TypeError", 1, 10),
    ("[1, 2] | map(fn(x) => x) | where(fn(x) => 1)", "TypeError", 1, 28),
    ("[1, 2] | take_while(fn(x) => null)", "TypeError", 1, 10),
    ("range(0, 3) | where(fn(x) => x) | sum", "TypeError", 1, 35),
    ("[] | map(fn(x) => x) | reduce(fn(a, b) => a)", "ValueError", 1, 24),
    ("range(0, 0) | map(fn(x) => x) | reduce(fn(a, b) => a)", "ValueError", 1, 33),
    ("5 | map(fn(x) => x)", "TypeError", 1, 5),
    ('"abc" | map(fn(x) => x) | where(fn(x) => true)', "TypeError", 1, 9),
    ("[1] | map(fn(x) => x) | take(-1)", "ValueError", 1, 25),
    ('range(0, 9) | map(fn(x) => x) | take("2")', "TypeError", 1, 33),
    ("range(0, 9) | map(fn(x) => x) | skip(-1) | sum", "ValueError", 1, 33),
    ("[1, 2] | map(fn(x) => x) | sum(3)", "TypeError", 1, 28),
    ("[1, 2] | map(fn(x) => x) | count(fn(x) => x)", "TypeError", 1, 28),
    ("range(0, 3) | map(fn(x) => x) | any(fn(x) => null)", "TypeError", 1, 33),
    ("range(0, 3) | all(fn(x) => x + 1)", "TypeError", 1, 15),
    ('[1, "a"] | map(fn(x) => x) | sum', "TypeError", 1, 30),
]


@pytest.mark.parametrize(("source", "kind", "line", "col"), ERRORS, ids=[s for s, *_ in ERRORS])
def test_fused_errors_match(source: str, kind: str, line: int, col: int) -> None:
    err = same_error(source)
    assert (err.kind, err.line, err.column) == (kind, line, col), err.render(source)


def test_lazy_error_is_reported_where_consumed() -> None:
    lazy = run("range(0, 5) | map(fn(x) => 10 / (x - 2))")
    with pytest.raises(ConchError) as info:
        list(lazy)
    assert (info.value.kind, info.value.line, info.value.column) == ("ZeroDivisionError", 1, 31)


# -- limits and cancellation ---------------------------------------------------------------


@pytest.mark.parametrize("steps", [1, 5, 9, 10, 11, 30, 31])
def test_step_limit_counts_the_same(steps: int) -> None:
    for source in (
        "[1, 2, 3] | map(fn(x) => x * 2) | where(fn(x) => x > 2) | reduce(fn(a, b) => a + b)",
        "range(0, 10) | map(fn(x) => x * 2) | where(fn(x) => x > 2) | take(3) | sum",
        "range(0, 10) | each(fn(x) => x) | take_while(fn(x) => x < 5) | reduce(fn(a, b) => a + b, 0)",
    ):
        ctx = Context(limits=Limits(steps=steps))
        fused = outcome_of(source, ctx, True)
        unfused = outcome_of(source, Context(limits=Limits(steps=steps)), False)
        assert fused == unfused, (source, steps)


def outcome_of(source: str, ctx: Context, fuse: bool) -> Any:
    try:
        value = run(source, context=ctx, fuse=fuse)
        return values.to_json_value(value.materialize() if isinstance(value, LazyList) else value)
    except ConchError as err:
        return (err.kind, err.message, err.line, err.column)


def test_collection_limit_applies_to_fused_sums() -> None:
    source = "range(0, 1000) | map(fn(x) => x * 2) | sum"
    assert is_fused(source)
    limits = Limits(collection_size=100)
    a = outcome_of(source, Context(limits=limits), True)
    assert a == outcome_of(source, Context(limits=Limits(collection_size=100)), False)
    assert a[0] == "LimitError"


def test_cancellation_reaches_a_fused_loop() -> None:
    ctx = Context(limits=Limits(wall_time_s=60))
    timer = threading.Timer(0.2, ctx.cancelled.set)
    timer.start()
    try:
        err = error("range(0, 10**12) | map(fn(x) => x + 1) | where(fn(x) => x < 0) | sum", context=ctx)
    finally:
        timer.cancel()
    assert err.kind == "CancelledError"
    assert (err.line, err.column) in ((1, 24), (1, 48))  # the lambda entered when it was noticed


# -- many chains, generated: fused and unfused agree -----------------------------------------

SOURCES = ["[1, 2, 3, 4, 5]", '[1, "a", 3]', "[true, 2]", "[]", "range(0, 6)", "0..4", "xs", "rs", "lz",
           "5", '"abc"', "[{a: 1}, {a: 2}]", "[null, 1, 2]", "range(0, 10**9) | take(7)"]
STAGES = [
    "map(fn(x) => x * 2)", "map(fn(x) => x + 1)", "map(fn(x) => x.a)", 'map(fn(x) => print("m${x}"))',
    "map(fn(x) => 10 / (x - 2))", "map(fn(x) => str(x) | upper)", "map(fn(x) => -x)",
    "where(fn(x) => x > 1)", "where(fn(x) => x % 2 == 0)", "where(fn(x) => x)", "filter(fn(x) => x != null)",
    "each(fn(x) => if x > 2 { x } else { null })", 'each(fn(x) => print("e${x}"))',
    "take(2)", "skip(1)", "take(0)", "take_while(fn(x) => x < 3)", "take_while(fn(x) => x)",
]
ENDS = ["", "| reduce(fn(a, b) => a + b)", "| reduce(fn(a, b) => a + b, 100)", "| sum", "| len",
        "| take(3)", "| count(fn(x) => x > 1)", "| any(fn(x) => x > 2)", "| all(fn(x) => x)"]
PRELUDE = "let xs = [3, 1, 2]\nlet rs = range(0, 4)\nlet lz = range(0, 4) | map(fn(v) => v * 3)\n"


def _generated(count: int) -> list[str]:
    import random

    rng = random.Random(22)
    out = []
    for _ in range(count):
        stages = rng.sample(STAGES, rng.randint(1, 3))
        src = rng.choice(SOURCES)
        end = rng.choice(ENDS)
        if rng.random() < 0.25:  # the call form: map(xs, f)
            expr = src
            for s in stages:
                name, _, rest = s.partition("(")
                expr = f"{name}({expr}, {rest}" if rest != ")" else f"{name}({expr})"
                expr = expr.replace(", )", ")")
            out.append(PRELUDE + expr + (" " + end if end else ""))
        else:
            out.append(PRELUDE + " | ".join([src, *stages]) + (" " + end if end else ""))
    return out


GENERATED = _generated(300)


@pytest.mark.parametrize("checked", [False, True], ids=["plain", "checked"])
@pytest.mark.parametrize("source", GENERATED, ids=[s.splitlines()[-1] for s in GENERATED])
def test_generated_chains_agree(source: str, checked: bool, tmp_path: Path) -> None:
    limits = Limits(steps=10_000, collection_size=50) if checked else Limits()
    _agree(source, limits, tmp_path)


def test_the_compiler_knows_every_name_fusion_looks_at() -> None:
    """The compiler imports fusion.py (and inline.py) only for these names: aliases included."""
    from conch.lang import fusion, inline
    from conch.lang.builtins.registry import REGISTRY, load_all
    from conch.lang.compiler import _FUSION_NAMES

    load_all()
    wanted = fusion._STAGES | set(inline._METHODS) | {"split", "join", "len"}
    names = {key for key, b in dict.items(REGISTRY) if b.name in wanted}
    assert names == _FUSION_NAMES


def test_a_range_chain_of_arithmetic_needs_no_checks() -> None:
    """Over a Range the elements are Ints: no Bool check per element, and the sum of Ints
    is added up as it comes (the shape of benchmark (a))."""
    program = compile_program("range(0, 1000) | map(fn(x) => x * 2) | where(fn(x) => x % 3 == 0) | sum")
    compiled = program._plain
    assert "$f:sum_ints" in compiled.builtins
    fused = [c for c in compiled.code.co_consts[0].co_consts if hasattr(c, "co_name") and c.co_name.startswith("$fused")]
    assert fused and "$boolop" not in fused[0].co_names
    assert program.run() == sum(x * 2 for x in range(1000) if x * 2 % 3 == 0)


@pytest.mark.parametrize("source", [
    "let xs = range(0, 10)\nxs | map(fn(x) => x * 2) | where(fn(x) => x > 4) | sum",
    "let xs = range(0, 10) | map(fn(x) => x + 1)\nxs | map(fn(x) => x * 2) | take(3)",
    "let xs = range(0, 10)\nxs | take(4) | map(fn(x) => x * 2) | reduce(fn(a, b) => a + b)",
    "fn f(xs) => xs | map(fn(x) => x + 1) | sum\n[f([1, 2]), f(range(0, 3)), f(range(0, 3) | map(fn(x) => x))]",
])
def test_lazy_inputs_known_at_run_time(source: str, tmp_path: Path) -> None:
    assert is_fused(source)
    _agree(source, Limits(), tmp_path)
    _agree(source, Limits(steps=1000), tmp_path / "checked")


def test_statement_progress_is_reported_the_same() -> None:
    source = ("let xs = range(0, 100) | map(fn(x) => x * 2)\n"
              "let n = xs | where(fn(x) => x % 3 == 0) | count(fn(x) => x > 10)\n"
              "[1, 2, 3] | map(fn(x) => x + n) | sum")
    seen: dict[bool, list[tuple[int, int, str]]] = {}
    for fuse in (True, False):
        events: list[tuple[int, int, str]] = []
        program = compile_program(source, fuse=fuse)
        value = program.run(context=Context(limits=Limits(steps=100_000)),
                            on_statement=lambda i, total, text, events=events: events.append((i, total, text)))
        seen[fuse] = events
        assert value == 6 + 3 * 32
    assert seen[True] == seen[False]
    assert [e[0] for e in seen[True]] == [0, 1, 2]


def test_compiling_nested_chains_stays_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain in a fused chain's body or count compiles as written: each part is compiled a
    bounded number of times, however deep the nesting (the server compiles what it is sent)."""
    from conch.lang.compiler import Compiler

    def nested(depth: int) -> str:
        body = f"x{depth} + 1"
        for k in range(depth, 1, -1):
            body = f"x{k - 1} | map(fn(x{k}) => {body}) | take(xs | map(fn(y) => y) | sum)"
        return f"let xs = [1]\nlet x0 = [[1]]\nx0 | map(fn(x1) => {body})"

    calls = 0
    real = Compiler.expr

    def counting(self: Compiler, node: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(self, node)

    monkeypatch.setattr(Compiler, "expr", counting)
    work = {}
    for fuse in (True, False):
        for depth in (6, 12):
            calls = 0
            compile_program(nested(depth), fuse=fuse)
            work[fuse, depth] = calls
    assert work[True, 12] <= 4 * work[False, 12]
    assert work[True, 12] / work[True, 6] <= 1.2 * work[False, 12] / work[False, 6]


# -- a checked stage over a list takes its steps in batches ----------------------------------


def checked_code_names(source: str) -> set[str]:
    """The names the checked compile of ``source`` uses, in all its code objects."""
    def names(co: Any) -> set[str]:
        out = set(co.co_names)
        for const in co.co_consts:
            if hasattr(const, "co_names"):
                out |= names(const)
        return out

    return names(compile_program(source, frozenset({"xs"}))._compiled(True).code)


def outcome_with(source: str, xs: list[Any], limits: Limits, fuse: bool) -> Any:
    printed: list[str] = []
    ctx = Context(limits=limits, output=printed.append)
    try:
        value = run(source, context=ctx, variables={"xs": xs}, fuse=fuse)
        result = values.to_json_value(value.materialize() if isinstance(value, LazyList) else value)
    except ConchError as err:
        result = (err.kind, err.message, err.hint, err.line, err.column)
    return result, printed


def limited(outcome: Any) -> bool:
    result = outcome[0]
    return isinstance(result, tuple) and result[0] == "LimitError"


def least_steps(source: str, xs: list[Any]) -> int:
    """The smallest step limit the unfused program runs within (bisection)."""
    lo, hi = 1, 1
    while limited(outcome_with(source, xs, Limits(steps=hi), False)):
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if limited(outcome_with(source, xs, Limits(steps=mid), False)):
            lo = mid + 1
        else:
            hi = mid
    return hi


BATCHED = [
    "xs | map(fn(x) => x * 2) | where(fn(x) => x % 3 == 0) | sum",
    "xs | where(fn(x) => x) | len",
    'print("a")\nlet r = try { xs | map(fn(x) => 10 / (x - 4100)) | len } catch e { e.message }\n'
    'print("b")\n[r, xs | map(fn(x) => x + 1) | where(fn(x) => x > 5) | len]',
    'let r = try { xs | where(fn(x) => x.a) } catch e { e.message }\n[r, xs | map(fn(x) => -x) | sum]',
]


def _steps_count_the_same(source: str, n: int) -> None:
    """Around the least step limit that runs ``source`` over ``n`` Ints, and where its steps
    would stop in each stage, the batched fused program fails (or runs) as the unfused one."""
    assert "$batch" in checked_code_names(source)
    xs: list[Any] = list(range(n))
    least = least_steps(source, xs)
    limits = {1, 2, 3, 17, least - 2, least - 1, least, least + 1}
    limits |= {least * k // 7 + d for k in range(1, 7) for d in (-1, 0, 1)}
    for steps in sorted(s for s in limits if s > 0):
        fused = outcome_with(source, xs, Limits(steps=steps), True)
        assert fused == outcome_with(source, xs, Limits(steps=steps), False), (n, steps)
    assert not limited(outcome_with(source, xs, Limits(steps=least), True))
    assert least == 1 or limited(outcome_with(source, xs, Limits(steps=least - 1), True))


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 4095, 4096, 4097, 4101, 9000])
@pytest.mark.parametrize("source", BATCHED)
def test_batched_steps_count_the_same(source: str, n: int) -> None:
    """Around the least step limit that runs the program, and where its steps would stop in
    each stage, the fused program fails (or runs) as the unfused one: at the same element,
    with the same error, after the same output."""
    _steps_count_the_same(source, n)


@pytest.mark.parametrize("xs", [[1, True, 3], [1, "a", 3], [1, 2, None], [{"a": 1}], [*range(5000), "x"]])
@pytest.mark.parametrize("source", [
    "xs | map(fn(x) => x * 2)", "xs | map(fn(x) => 3 * x) | where(fn(x) => x > 2)",
    "xs | where(fn(x) => x * 1.5 > 2)", "xs | map(fn(x) => x - 1)",
])
def test_batched_errors_match(source: str, xs: list[Any]) -> None:
    """An element that fails in a batch fails as it does unbatched (kind, message, position),
    and after the same steps: the step limits around the element agree too."""
    for steps in (None, 10, len(xs), len(xs) + 1, 2 * len(xs), 10_000_000):
        limits = Limits(steps=steps, collection_size=100)
        assert outcome_with(source, xs, limits, True) == outcome_with(source, xs, limits, False), steps


def test_a_body_that_steps_or_prints_is_not_batched() -> None:
    for source in ('xs | map(fn(x) => print(x))', "fn f(v) => v\nxs | map(fn(x) => f(x))",
                   "xs | map(fn(x) => x ** 2)", 'xs | where(fn(x) => x =~ "a")'):
        assert "$batch" not in checked_code_names(source), source
    assert "$batch" in checked_code_names("xs | map(fn(x) => x * 2)")


def test_cancellation_reaches_a_batched_stage() -> None:
    ctx = Context(limits=Limits(wall_time_s=60))
    ctx.cancelled.set()
    err = error("xs | map(fn(x) => x + 1) | len", context=ctx, variables={"xs": list(range(100))})
    assert err.kind == "CancelledError"
    assert (err.line, err.column) == (1, 10)


@pytest.mark.parametrize("source", [
    'let s = "ab"\n[3, 4] | map(fn(x) => s * x)', 'let s = "ab"\n[3, 4] | map(fn(x) => x * s)',
    'xs | map(fn(x) => x * 100)', 'xs | map(fn(x) => 100 * x)', 'xs | map(fn(x) => x * 2.5)',
    'xs | map(fn(x) => x * x)', 'range(0, 5) | map(fn(x) => x * 3 * x) | sum', '"ab" * 60', '2 * [1, 2]',
    'xs | map(fn(x) => [x] * 60)', "let n = 7\nxs | map(fn(x) => n * x * 2)", "xs | map(fn(x) => (x + x) * 2)",
])
@pytest.mark.parametrize("xs", [[1, 2], ["ab", "c"], [[1], [2, 3]], [True], [1.5, None], [{"a": 1}]])
def test_checked_multiply_stays_bounded(source: str, xs: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """``*`` without ``$mul`` only where no String or Array can be repeated: the same values and
    errors (the collection limit among them) as where every ``*`` is ``$mul``, fused or not."""
    from conch.lang.compiler import Compiler

    limits = Limits(steps=1000, collection_size=100)
    fused, unfused = outcome_with(source, xs, limits, True), outcome_with(source, xs, limits, False)
    monkeypatch.setattr(Compiler, "bare_mul", False)
    assert fused == unfused == outcome_with(source, xs, limits, True) == outcome_with(source, xs, limits, False)


RANGE_BATCHED = [
    "range(0, N) | map(fn(x) => x * 2) | where(fn(x) => x % 3 == 0) | sum",
    "range(0, N) | map(fn(x) => x + 1) | where(fn(x) => x > 5) | take(4100) | sum",
    "range(0, N) | where(fn(x) => x % 2 == 0) | reduce(fn(a, b) => a + b)",
    "range(0, N) | map(fn(x) => x * 3) | reduce(fn(a, b) => a + b, 7)",
    "xs | map(fn(x) => x - 1) | count(fn(x) => x % 5 == 1)",
    "range(0, N) | any(fn(x) => x == 4097)",
    "xs | all(fn(x) => x < 4500)",
    'let r = try { range(0, N) | map(fn(x) => 10 / (x - 4100)) | sum } catch e { e.message }\n'
    'print(r)\n[r, range(0, N) | where(fn(x) => x > 3) | count(fn(x) => x > 4)]',
    'let r = try { xs | reduce(fn(a, b) => a + b.c) } catch e { e.message }\n[r, xs | map(fn(x) => -x) | sum]',
]


@pytest.mark.parametrize("n", [0, 1, 16, 17, 4095, 4096, 4097, 4101, 9000])
@pytest.mark.parametrize("template", RANGE_BATCHED)
def test_batched_loops_count_the_same(template: str, n: int) -> None:
    """A fold, a test or a summed chain (one loop) over a Range or a list takes its steps in
    batches: the step limit is met, and errors come, as unbatched."""
    source = template.replace("N", str(n))
    _steps_count_the_same(source, n)


def test_a_lazy_result_is_not_batched() -> None:
    """A generator whose elements go to the program (a LazyList) ticks per element: the
    program's own steps come between them."""
    assert "$batch" not in checked_code_names("range(0, 10) | map(fn(x) => x * 2)")
    assert "$batch" not in checked_code_names("range(0, 10) | map(fn(x) => f(x)) | sum")


def test_a_batched_loop_over_a_huge_range() -> None:
    for source in ("range(0, 10**20) | map(fn(x) => x + 1) | any(fn(x) => x > 5000)",
                   "range(0, 10**20) | map(fn(x) => x * 2) | take(5000) | sum"):
        assert "$batch" in checked_code_names(source)
        both(source, context=Context(limits=Limits(steps=100_000)))
        assert same_error(source, context=Context(limits=Limits(steps=4000))).kind == "LimitError"
