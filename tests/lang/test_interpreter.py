"""The language API: programs, stages, sessions, hooks, limits, cancellation, laziness."""

from __future__ import annotations

import threading
import time

import pytest

from conch.lang import Session, compile_program, compile_stage, run, values
from conch.lang.context import Context, Limits
from conch.lang.errors import ConchError
from conch.lang.values import LazyList


def error_of(source: str, **kwargs: object) -> ConchError:
    with pytest.raises(ConchError) as info:
        values.to_json_value(run(source, **kwargs))  # type: ignore[arg-type]
    return info.value


def test_compile_once_run_many() -> None:
    program = compile_program("let x = 2\nx * 21")
    assert program.statement_count == 2
    assert program.run() == 42
    assert program.run() == 42


def test_syntax_error_at_compile_time_with_caret() -> None:
    with pytest.raises(ConchError) as info:
        compile_program("let a = 1\nlet b = 2\nlet x = (1 + )")
    err = info.value
    assert (err.kind, err.line, err.column) == ("SyntaxError", 3, 14)
    assert err.message == "unexpected ')'"
    assert err.hint == "an expression is missing before ')'"
    assert err.render("let a = 1\nlet b = 2\nlet x = (1 + )") == (
        "SyntaxError: unexpected ')' at line 3, column 14\n"
        "  3 | let x = (1 + )\n"
        "    |              ^\n"
        "hint: an expression is missing before ')'"
    )


def test_name_error_hint() -> None:
    err = error_of("let items = [1]\nlen(itemz)")
    assert (err.kind, err.line, err.column) == ("NameError", 2, 5)
    assert err.hint == 'did you mean "items"?'
    err = error_of("lenght([1])")
    assert err.hint == 'did you mean "length"?'


def test_variables_are_supplied_at_run_time() -> None:
    program = compile_program("x + y", variables={"x", "y"})
    assert program.run(variables={"x": 1, "y": 2}) == 3
    assert run("name | upper", variables={"name": "ab"}) == "AB"
    with pytest.raises(ConchError) as info:
        compile_program("x + 1").run()
    assert info.value.kind == "NameError"


def test_on_statement_hook() -> None:
    calls: list[tuple[int, int, str]] = []
    program = compile_program("let a = 1\nlet b = a + 1\n\n[a,\n b]")
    assert program.run(on_statement=lambda i, n, text: calls.append((i, n, text))) == [1, 2]
    assert calls == [(0, 3, "let a = 1"), (1, 3, "let b = a + 1"), (2, 3, "[a,\n b]")]


def test_print_goes_to_the_context_output() -> None:
    lines: list[str] = []
    ctx = Context(output=lines.append)
    assert run('print("a")\nfor i in 1..=2 { print("n=${i}") }\n7', context=ctx) == 7
    assert lines == ["a", "n=1", "n=2"]


def test_compile_stage() -> None:
    assert compile_stage("map(fn(x) => x*2)")([1, 2]) == [2, 4]
    assert compile_stage(".name")({"name": "a"}) == "a"
    assert compile_stage(".name")([{"name": "a"}, {"name": "b"}]) == ["a", "b"]
    assert compile_stage("sum")([1, 2, 3]) == 6
    assert compile_stage("fn(v) => v + 1")(1) == 2
    assert compile_stage("where(fn(r) => r.n > 1) | len")([{"n": 1}, {"n": 2}]) == 1
    stage = compile_stage("map(fn(x) => 10 / x)")
    assert stage([1, 2]) == [10.0, 5.0]
    with pytest.raises(ConchError) as info:
        stage([0])
    assert (info.value.kind, info.value.line, info.value.column) == ("ZeroDivisionError", 1, 17)
    with pytest.raises(ConchError) as info:
        compile_stage("map(fn(x) => )")
    assert (info.value.kind, info.value.column) == ("SyntaxError", 14)


def test_session_keeps_state() -> None:
    session = Session()
    assert session.run("let x = 1") is None
    assert session.run("x + 1") == 2
    session.run("fn sq(n) => n * n")
    assert session.run("sq(x + 2)") == 9
    session.run("let mut count = 0")
    session.run("fn bump() { count = count + 1 }")
    session.run("bump(); bump()")
    assert session.run("count") == 2
    session.run("let x = 10")
    assert session.run("x") == 10
    assert session.variables["x"] == 10
    with pytest.raises(ConchError) as info:
        session.run("x = 3")
    assert info.value.kind == "SyntaxError"
    with pytest.raises(ConchError):
        session.run("let y = 5\n1 / 0")
    assert session.run("y") == 5
    with pytest.raises(ConchError) as info:
        session.run("nope")
    assert info.value.kind == "NameError"


def test_session_reassigns_a_let_mut_of_an_earlier_input() -> None:
    session = Session()
    session.run("let mut c = 0")
    assert session.run("c = c + 1") is None
    assert session.run("c") == 1
    session.run("c += 5")
    session.run("if c > 0 { c = c * 2 }")
    session.run("for i in 1..=3 { c = c + i }")
    assert session.run("c") == 18
    session.run("let bump = fn() => { c = c + 1; c }")
    assert session.run("bump()") == 19
    assert session.run("c") == 19
    # A plain `let` stays immutable, whichever input made it; a later `let mut` of the same
    # name makes a new, mutable binding.
    session.run("let k = 1")
    with pytest.raises(ConchError) as info:
        session.run("k = 2")
    assert info.value.kind == "SyntaxError" and "immutable 'k'" in info.value.message
    assert session.run("k") == 1
    session.run("let mut k = 5")
    session.run("k = k + 1")
    assert session.run("k") == 6
    session.run("let k = 7")
    with pytest.raises(ConchError) as info:
        session.run("k = 8")
    assert info.value.kind == "SyntaxError"
    assert session.run("k") == 7


def test_session_reassigns_under_limits() -> None:
    session = Session(context=Context(limits=Limits(steps=1000)))
    session.run("let mut n = 0")
    session.run("while n < 10 { n = n + 1 }")
    assert session.run("n") == 10


def test_session_closures_capture_values() -> None:
    session = Session()
    session.run("let k = 3\nlet f = fn(x) => x * k")
    session.run("let k = 100")
    assert session.run("f(2)") == 6


def test_step_limit() -> None:
    ctx = Context(limits=Limits(steps=1000))
    err = error_of("let mut n = 0\nwhile true { n = n + 1 }", context=ctx)
    assert err.kind == "LimitError"
    assert (err.line, err.column) == (2, 1)
    err = error_of("range(0, 100000) | map(fn(x) => x) | len", context=ctx)
    assert err.kind == "LimitError"
    # the same program without limits runs freely
    assert run("range(0, 100000) | map(fn(x) => x) | len") == 100000


def test_limit_errors_cannot_be_caught() -> None:
    ctx = Context(limits=Limits(steps=100))
    err = error_of("try { for i in 0..1000 { i } } catch e { 0 }", context=ctx)
    assert err.kind == "LimitError"


def test_recursion_limit() -> None:
    ctx = Context(limits=Limits(recursion=50))
    src = "fn d(n) => if n == 0 { 0 } else { 1 + d(n - 1) }\nd(N)"
    assert run(src.replace("N", "40"), context=ctx) == 40
    err = error_of(src.replace("N", "60"), context=ctx)
    assert err.kind == "LimitError"
    # without limits conch recursion goes well past 1000 levels
    assert run(src.replace("N", "3000")) == 3000
    err = error_of("fn f(n) => f(n + 1)\nf(0)")
    assert err.kind == "LimitError"


def test_wall_time_limit() -> None:
    ctx = Context(limits=Limits(wall_time_s=0.2))
    start = time.monotonic()
    err = error_of("while true { }", context=ctx)
    assert err.kind == "TimeoutError"
    assert time.monotonic() - start < 5


def test_cancellation() -> None:
    ctx = Context(limits=Limits(wall_time_s=60))
    timer = threading.Timer(0.2, ctx.cancelled.set)
    timer.start()
    try:
        err = error_of("let mut n = 0\nwhile true { n = n + 1 }", context=ctx)
    finally:
        timer.cancel()
    assert err.kind == "CancelledError"


def test_lazy_results_stay_lazy() -> None:
    seen: list[int] = []
    result = run("range(0, 1000000000) | map(fn(x) => x * 2)")
    assert isinstance(result, LazyList)
    assert list(__import__("itertools").islice(result, 3)) == [0, 2, 4]
    assert run("range(0, 1000000000) | map(fn(x) => x + 1) | take(3)") == [1, 2, 3]
    lines: list[str] = []
    ctx = Context(output=lines.append)
    lazy = run("range(0, 10) | map(fn(x) => { print(str(x)); x })", context=ctx)
    assert lines == []
    for item in lazy:
        seen.append(item)
        if item == 1:
            break
    assert lines == ["0", "1"]


def test_lazy_errors_are_translated() -> None:
    lazy = run("range(0, 5) | map(fn(x) => 10 / (x - 2))")
    with pytest.raises(ConchError) as info:
        list(lazy)
    assert (info.value.kind, info.value.line, info.value.column) == ("ZeroDivisionError", 1, 31)


def test_functions_are_python_callables() -> None:
    double = run("fn(x) => x * 2")
    assert double(21) == 42
    assert values.type_of(double) == "Function"


def test_pipeline_over_a_range_matches_python() -> None:
    # Speed against plain Python is measured by benchmarks/lang.py, never asserted here.
    program = compile_program(
        "range(0, 300000) | map(fn(x) => x * 2) | where(fn(x) => x % 3 == 0) | sum"
    )
    assert program.run() == sum(y for y in (x * 2 for x in range(0, 300000)) if y % 3 == 0)


def test_session_functions_may_name_later_functions() -> None:
    session = Session()
    session.run("fn f(x) => g(x) + 1")
    with pytest.raises(ConchError) as info:
        session.run("f(1)")
    assert (info.value.kind, info.value.line, info.value.column) == ("NameError", 1, 12)
    session.run("fn g(x) => x * 10")
    assert session.run("f(1)") == 11
    # top-level code still reports unknown names before it runs
    with pytest.raises(ConchError) as info:
        session.run("let z = 1\nnope()")
    assert info.value.kind == "NameError"
    assert "z" not in session.variables


def test_sleep_stops_at_the_run_deadline() -> None:
    ctx = Context(limits=Limits(wall_time_s=0.3))
    start = time.monotonic()
    err = error_of("sleep(200)\nsleep(200)\nsleep(200)", context=ctx)
    elapsed = time.monotonic() - start
    assert (err.kind, err.line) == ("TimeoutError", 2)
    assert 0.25 < elapsed < 0.45
    # the deadline belongs to the run: the next run on the same context starts afresh
    assert ctx.deadline is None
    assert run("sleep(100)\n1", context=ctx) == 1
