"""A session's state as data (conch.lang.snapshot): every value encoded as JSON and back,
functions and closures recompiled from their source with what they captured, what cannot be
saved named, and the bindings a run changed found by identity."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from conch.lang import Session, compile_program
from conch.lang.context import Context, Limits
from conch.lang.errors import ConchError
from conch.lang.snapshot import Damaged, decode, encode, function_source
from conch.lang.values import ErrorValue, LazyList, to_json_value

SRC = str(Path(__file__).resolve().parents[2] / "src")


def round_trip(value: Any) -> Any:
    """``value`` encoded, written as JSON bytes, read back and decoded."""
    enc = encode(value).value
    return decode(orjson.loads(orjson.dumps(enc)))


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same Python types all the way down (1 is not 1.0, NaN is NaN)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def moved(session: Session, context: Context | None = None) -> Session:
    """A fresh session given ``session``'s bindings through their JSON documents."""
    docs, unsaved = session.export(raw=True)
    assert unsaved == []
    fresh = Session(context=context)
    assert fresh.restore(docs) == []
    return fresh


# -- data ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None, True, False, 0, -7, 2**53 - 1, -(2**53 - 1), 2**53, -(2**53), 2**64 + 1, -(3**200), 10**5000,
        1.0, -0.0, 0.1, 1e300, 5e-324, math.nan, math.inf, -math.inf,
        "", "plain", "ünïcödé ✓ 😀", "a\x00b", "lone \udce9 surrogate",
        [], [1, 2.0, "x", None, True], [[1, [2, [3, [math.nan]]]]],
        {}, {"b": 1, "a": 2, "c": 3}, {"nested": {"deep": {"list": [1, {"x": math.inf}]}}},
        [{"id": 1, "name": "a", "price": 1.5}, {"id": 2, "name": "b", "price": math.nan}],
        {"$int": "5"}, {"$fn": 0}, [{"$range": [1, 2, 3]}],
        range(0, 10), range(5, -5, -2), range(2**70, 2**70 + 3),
    ],
    ids=lambda v: f"int of {v.bit_length()} bits" if type(v) is int and v.bit_length() > 64 else repr(v)[:40],
)
def test_every_kind_of_data_round_trips_exactly(value: Any) -> None:
    assert same(round_trip(value), value)


def test_plain_data_is_itself_and_a_record_keeps_its_key_order() -> None:
    table = [{"z": i, "a": str(i), "m": i / 2} for i in range(100)]
    enc = encode(table).value
    assert enc == {"conch": 1, "data": table} and "tags" not in enc
    back = round_trip(table)
    assert back == table and [list(r) for r in back] == [["z", "a", "m"]] * 100
    # a Record that looks like a tag is a Record: only the listed paths are tags
    assert round_trip({"$float": "NaN"}) == {"$float": "NaN"}


def test_error_values_tuples_and_materialised_lazy_arrays() -> None:
    err = ErrorValue({"kind": "UserError", "message": "m", "line": 1, "column": 2, "hint": None,
                      "value": {"x": math.nan}})
    back = round_trip(err)
    assert type(back) is ErrorValue and back["kind"] == "UserError" and math.isnan(back["value"]["x"])
    assert round_trip((1, (2, 3))) == [1, [2, 3]]
    lazy = LazyList(iter([1, 2, 3]))
    lazy.materialize()
    assert round_trip(lazy) == [1, 2, 3]


def test_a_big_table_with_one_nan_is_exact() -> None:
    rows = [{"i": i, "f": i / 3, "s": f"row {i}", "n": None} for i in range(5000)]
    rows[4321]["f"] = math.nan
    enc = encode(rows).value
    assert enc["tags"] == [["data", 4321, "f"]]
    back = round_trip(rows)
    assert math.isnan(back[4321]["f"]) and back[:4321] == rows[:4321] and back[4322:] == rows[4322:]


# -- a session's bindings ----------------------------------------------------------------------


def test_bindings_of_every_type_survive_a_restore() -> None:
    s = Session()
    s.run(
        'let n = null\nlet b = true\nlet i = 2 ** 80\nlet f = 2.5\nlet nan = float("nan")\n'
        'let inf = -float("inf")\nlet str = "héllo"\nlet arr = [1, [2, 3], {a: 1}]\n'
        'let tbl = [{name: "a", size: 1}, {name: "b", size: 2}]\nlet rec = {z: 1, y: {x: [1.5]}}\n'
        "let rng = range(0, 10, 3)\nlet err = try { 1 / 0 } catch e { e }\nlet mut m = 1\nfn sq(x) => x * x"
    )
    summary = s.bindings_summary()
    assert {d["name"]: d["type"] for d in summary} == {
        "n": "Null", "b": "Bool", "i": "Int", "f": "Float", "nan": "Float", "inf": "Float", "str": "String",
        "arr": "Array", "tbl": "Table", "rec": "Record", "rng": "Range", "err": "Error", "m": "Int", "sq": "Function",
    }
    docs, unsaved = s.export()
    assert unsaved == []
    by_name = {d["name"]: d for d in docs}
    assert by_name["m"]["mutable"] is True and by_name["m"]["kind"] == "let mut"
    assert by_name["sq"]["kind"] == "fn" and by_name["tbl"]["type"] == "Table"
    t = moved(s)
    assert t.bindings_summary() == summary
    for name in ("n", "b", "i", "f", "nan", "inf", "str", "arr", "tbl", "rec", "rng", "err", "m"):
        assert same(t.run(name), s.run(name)), name
    assert t.run("sq(9)") == 81
    assert t.run("err.kind") == "ZeroDivisionError"


def test_closures_keep_what_they_captured() -> None:
    s = Session()
    s.run("let k = 3\nlet mul = fn(x) => x * k\nlet k = 100")  # the closure keeps 3
    s.run("let add = fn(a, b = k + 1) => a + b")  # a default is evaluated where the fn is made
    s.run("fn adder(n) { let base = n * 2; fn(x) => { let y = x + base; y } }\nlet add10 = adder(5)")
    s.run("let twice = fn(f) => fn(x) => f(f(x))\nlet inc2 = twice(fn(x) => x + 1)")
    s.run('let kind = fn(v) => match v { 0 => "zero", n if n < 0 => "negative", _ => "other" }')
    t = moved(s)
    assert t.run("mul(2)") == 6
    assert t.run("add(1)") == 102 and t.run("add(1, 2)") == 3
    assert t.run("add10(1)") == 11
    assert t.run("inc2(5)") == 7
    assert t.run("[1, 2, 3] | map(mul)") == [3, 6, 9]
    assert t.run("[0, -1, 5] | map(kind)") == ["zero", "negative", "other"]


def test_functions_in_data_defaults_that_are_functions_and_renamed_bindings() -> None:
    s = Session()
    s.run("let ops = [{name: \"double\", f: fn(x) => x * 2}, {name: \"neg\", f: fn(x) => -x}]")
    s.run("let apply = fn(x, g = fn(v) => v + 100) => g(x)")
    # `y` is first a local of a lambda, so the session's `y` gets another Python name
    s.run("let k = fn(x) => { let y = x * 2; y }\nlet y = 5\nfn use_y() => y + k(1)")
    s.run("fn safe(x) => try { 10 // x } catch e { e.kind }")
    s.run("fn layered() { let mut hits = 0; let bump = fn() => { hits += 1; hits }; fn() => [bump(), bump()] }\n"
          "let twice = layered()")
    t = moved(s)
    assert t.run("ops | map(fn(op) => op.f(21))") == [42, -21]
    assert t.run("[apply(1), apply(1, fn(v) => v)]") == [101, 1]
    assert t.run("use_y()") == 7
    assert t.run("[safe(2), safe(0)]") == [5, "ZeroDivisionError"]
    assert t.run("twice()") == [1, 2]
    u = moved(t)  # the cell a closure reaches through another closure, changed on the way
    assert u.run("twice()") == [3, 4]
    assert str(u.run("ops[0].f")).startswith("<function")


def test_functions_made_under_limits_restore_without_them() -> None:
    s = Session(context=Context(limits=Limits(steps=100_000, recursion=100)))
    s.run("fn fact(n) => if n <= 1 { 1 } else { n * fact(n - 1) }\nlet f = fn(x) => fact(x) + 1")
    t = moved(s)  # a REPL: no limits, no step counting in the restored functions
    assert t.run("f(200)") == math.factorial(200) + 1


def test_recursion_and_mutual_recursion_and_later_functions() -> None:
    s = Session()
    s.run("fn fact(n) => if n <= 1 { 1 } else { n * fact(n - 1) }")
    s.run("fn is_even(n) => if n == 0 { true } else { is_odd(n - 1) }\n"
          "fn is_odd(n) => if n == 0 { false } else { is_even(n - 1) }")
    s.run("fn make() { fn down(n) => if n == 0 { \"done\" } else { down(n - 1) }; down }\nlet down = make()")
    s.run("fn uses_later(x) => later(x) * 2")  # `later` does not exist yet
    t = moved(s)
    assert t.run("fact(20)") == math.factorial(20)
    assert t.run("[is_even(10), is_odd(7), is_even(3)]") == [True, True, False]
    assert t.run("down(50)") == "done"
    with pytest.raises(ConchError) as info:
        t.run("uses_later(1)")
    assert info.value.kind == "NameError"
    t.run("fn later(x) => x + 1")
    assert t.run("uses_later(1)") == 4
    # a session function named by another is looked up by name, as before the restore
    t.run("fn fact(n) => 0")
    assert t.run("fact(5)") == 0


def test_closures_sharing_a_let_mut_keep_sharing_it() -> None:
    s = Session()
    s.run("fn counter() { let mut n = 0; {inc: fn() => { n = n + 1; n }, get: fn() => n} }\n"
          "let c = counter()\nlet inc = c.inc\nlet other = counter()")
    s.run("c.inc(); c.inc()")
    t = moved(s)
    assert t.run("c.get()") == 2
    assert t.run("inc()") == 3  # another binding, the same cell
    assert t.run("c.get()") == 3
    assert t.run("other.get()") == 0  # a counter of its own
    # and again after a second move, with the cell changed on the way
    u = moved(t)
    assert u.run("[inc(), c.inc(), c.get(), other.inc()]") == [4, 5, 5, 1]


def test_session_let_mut_and_functions_that_assign_it() -> None:
    s = Session()
    s.run("let mut total = 10\nfn bump(n) { total = total + n; total }\nlet f = fn() => total")
    t = moved(s)
    assert t.run("bump(5)") == 15
    t.run("total = total * 2")  # a restored let mut is reassigned by a later input
    assert t.run("total") == 30 and t.run("f()") == 30
    t.run("total += 1")
    assert t.run("bump(0)") == 31
    with pytest.raises(ConchError) as info:
        t.run("f = 3")
    assert info.value.kind == "SyntaxError"


def test_builtins_by_name_and_a_builtin_shadowed_later() -> None:
    s = Session()
    s.run('let up = upper\nlet shout = fn(x) => upper(x) + "!"')
    s.run("let upper = 5")  # a binding named like a builtin, made after the closure
    t = moved(s)
    assert t.run('up("a")') == "A"
    assert t.run('shout("hi")') == "HI!"
    assert t.run("upper") == 5


def test_restored_functions_obey_the_limits() -> None:
    s = Session()
    s.run("fn spin(n) { let mut i = 0; while i < n { i = i + 1 }; i }\n"
          "fn deep(n) => if n == 0 { 0 } else { 1 + deep(n - 1) }\nlet loop = fn(n) => spin(n)")
    t = moved(s, Context(limits=Limits(steps=10_000, recursion=50)))
    assert t.run("spin(100)") == 100
    for program in ("spin(1000000)", "loop(1000000)", "deep(500)"):
        with pytest.raises(ConchError) as info:
            t.run(program)
        assert info.value.kind == "LimitError", program
    assert t.run("deep(20)") == 20


def test_functions_keep_their_source_and_plain_programs_do_not_pay_for_it() -> None:
    s = Session()
    s.run("fn sq(x) {\n  x * x\n}\nlet f = fn(a, b = 1) =>\n  a + b")
    assert function_source(s.namespace["sq"]) == "fn sq(x) {\n  x * x\n}"
    assert function_source(s.variables["f"]) == "fn(a, b = 1) =>\n  a + b"
    # a program run outside a session makes its functions as before: no source kept
    lam = compile_program("fn(x) => x + 1").run()
    assert lam(1) == 2 and lam.__doc__ is None and function_source(lam) is None


# -- what cannot be saved ----------------------------------------------------------------------


def test_what_cannot_be_saved_is_named_with_a_reason() -> None:
    s = Session()
    s.run("let lazy = range(0, 10) | map(fn(x) => x * 2)\nlet ok = 1\nlet host = 2\nlet big = range(0, 1000) | map(fn(x) => x) | sort")
    assert type(s.variables["lazy"]) is LazyList
    s.namespace[s.bindings["host"].pyname] = object()
    s.namespace[s.bindings["ok"].pyname] = {"rows": [1, {"f": compile_program("fn(x) => x").run()}]}
    docs, unsaved = s.export(max_bytes=2000)
    reasons = {u["name"]: u["reason"] for u in unsaved}
    assert set(reasons) == {"lazy", "host", "ok", "big"} and docs == []
    assert "lazy Array" in reasons["lazy"]
    assert "host object of type object" in reasons["host"]
    assert reasons["ok"].startswith("ok.rows[1].f: a function made outside a session")
    assert "over the limit of 2000" in reasons["big"]
    # once the lazy Array has been computed, it counts as changed and is saved
    mark = s.mark()
    assert s.run("len(lazy)") == 10
    assert s.changed_since(mark).changed == ["lazy"]
    docs, unsaved = s.export(["lazy"])
    assert unsaved == [] and docs[0]["value"]["data"] == list(range(0, 20, 2))
    assert s.export(["nope"])[1] == [{"name": "nope", "reason": "the session has no such binding"}]


# -- which bindings changed ----------------------------------------------------------------------


def test_a_run_changing_one_of_a_hundred_bindings_reports_that_one() -> None:
    s = Session()
    s.run("\n".join(f"let mut v{i} = [{i}, {{k: {i}}}]" for i in range(100)) + "\nfn setv(x) { v42 = x }")
    s.export()
    for program, expected in [
        ("v7 = [7, {k: 7}]", ["v7"]),  # an equal value is still a new value
        ("setv(1)", ["v42"]),  # changed by a function
        ("let fresh = 1", ["fresh"]),
        ("v1 | len", []),
        ("let v3 = v3", ["v3"]),  # the same value, but no longer a let mut
        ("let mut v3 = v3", ["v3"]),
        ("let mut v3 = v3", []),  # the same value, the same kind
        ("let mut other = 0\nv99 = null", ["v99", "other"]),
    ]:
        mark = s.mark()
        s.run(program)
        changes = s.changed_since(mark)
        assert (sorted(changes.changed), changes.removed) == (sorted(expected), []), program
        docs, _ = s.export(changes.changed)
        assert [d["name"] for d in docs] == changes.changed
    assert s.export(["v3"])[0][0]["kind"] == "let mut"


def test_a_closure_changing_its_captured_let_mut_changes_the_binding() -> None:
    s = Session()
    s.run("fn counter() { let mut n = 0; {inc: fn() => { n = n + 1; n }, get: fn() => n} }\n"
          "let c = counter()\nlet get = c.get\nlet d = counter()")
    s.export()
    mark = s.mark()
    s.run("c.inc()")
    assert s.changed_since(mark).changed == ["c", "get"]
    s.export(["c", "get"])
    mark = s.mark()
    s.run("c.get()")
    assert s.changed_since(mark).changed == []
    # a restored session tells the same
    t = Session()
    t.restore(s.export(raw=True)[0])
    mark = t.mark()
    t.run("d.inc()")
    assert t.changed_since(mark).changed == ["d"]


def test_a_failed_run_reports_the_bindings_it_made_before_failing() -> None:
    s = Session()
    mark = s.mark()
    with pytest.raises(ConchError):
        s.run("let a = 1\nlet b = 1 / 0")
    assert s.changed_since(mark).changed == ["a"]


def test_saving_a_small_change_costs_microseconds() -> None:
    s = Session()
    s.run("\n".join(f"let mut v{i} = {i}" for i in range(100)))
    s.export()
    run_times, save_times = [], []
    for i in range(300):
        t0 = time.perf_counter()
        mark = s.mark()
        t1 = time.perf_counter()
        s.run(f"v5 = {i}")
        t2 = time.perf_counter()
        docs, _ = s.export(s.changed_since(mark).changed)
        t3 = time.perf_counter()
        assert [d["name"] for d in docs] == ["v5"]
        run_times.append(t2 - t1)
        save_times.append((t1 - t0) + (t3 - t2))
    # measured at ~20 µs against a ~250 µs run; a loose bound for a busy machine
    assert statistics.median(save_times) < 0.25 * statistics.median(run_times)


# -- restoring ---------------------------------------------------------------------------------


def test_a_restored_session_carries_on() -> None:
    s = Session()
    s.run("let mut count = 0\nlet data = [{n: 1}, {n: 2}]\nfn total() => data | map(fn(r) => r.n) | sum")
    t = moved(s)
    t.run("count = count + total()")
    t.run("let data2 = data + [{n: 10}]\nfn total2() => data2 | map(fn(r) => r.n) | sum")
    assert t.run("[count, total(), total2()]") == [3, 3, 13]
    u = moved(t)
    assert u.run("count += 1; count") == 4


def test_damaged_documents_are_reported_and_the_rest_restored() -> None:
    s = Session()
    s.run("let a = 1\nlet b = [1.5]\nfn f(x) => x + a\nlet c = 3")
    docs = {d["name"]: d for d in s.export()[0]}
    bad_version = {**docs["b"], "value": {**docs["b"]["value"], "conch": 99}}
    bad_fn = json.loads(json.dumps(docs["f"]))
    bad_fn["value"]["fns"][0]["src"] = "fn f(x) => x +"
    damaged = Session()
    report = damaged.restore([docs["a"], b"{not json", bad_version, bad_fn, {"name": "1x", "kind": "let", "value": {}},
                              docs["c"]])
    assert [d["name"] for d in report] == ["?", "b", "f", "1x"]
    assert "encoding version 99" in report[1]["reason"]
    assert "does not parse" in report[2]["reason"]
    assert damaged.run("a + c") == 4
    with pytest.raises(ConchError):
        damaged.run("b")
    with pytest.raises(Damaged):
        decode({"conch": 1, "data": {"$nope": 1}, "tags": [["data"]]})


def test_restore_into_a_session_with_bindings_of_its_own() -> None:
    s = Session()
    s.run("fn counter() { let mut n = 0; fn() => { n = n + 1; n } }\nlet a = counter()\nlet x = 1")
    docs = s.export(raw=True)[0]
    t = Session()
    t.run("fn counter() { let mut n = 100; fn() => { n = n + 1; n } }\nlet b = counter()\nlet x = 2\nlet x2 = x")
    t.export()  # b's cell takes an ID in t
    assert t.restore(docs) == []
    assert t.run("[a(), a(), b(), x, x2]") == [1, 2, 101, 1, 2]
    # the restored cell got an ID of its own: its binding is saved again at the next save
    mark = t.mark()
    assert "a" in t.changed_since(mark).changed
    u = moved(t)
    assert u.run("[a(), b()]") == [3, 102]


def test_a_session_resumes_in_a_fresh_process(tmp_path: Path) -> None:
    s = Session()
    s.run("let mut hits = 0\nfn counter() { let mut n = 10; {inc: fn() => { n = n + 1; n }, get: fn() => n} }\n"
          "let c = counter()\nfn fib(n) => if n < 2 { n } else { fib(n - 1) + fib(n - 2) }\n"
          "let scale = 3\nlet scaled = fn(x) => fib(x) * scale\nlet table = [{a: 1, b: 2.5}, {a: 2, b: float(\"nan\")}]\n"
          "let huge = 7 ** 99")
    s.run("c.inc()")
    docs, unsaved = s.export(raw=True)
    assert unsaved == []
    state = tmp_path / "state.json"
    state.write_bytes(orjson.dumps([d.decode() for d in docs]))
    program = "[hits, c.inc(), c.get(), scaled(10), table | map(fn(r) => r.a) | sum, huge % 1000, str(table[1].b)]"
    script = (
        "import json, sys\n"
        "from conch.lang import Session\n"
        "from conch.lang.values import to_json_value\n"
        "s = Session()\n"
        "damaged = s.restore(d.encode() for d in json.load(open(sys.argv[1])))\n"
        "assert damaged == [], damaged\n"
        "s.run('hits = hits + 1')\n"
        "out = s.run(sys.argv[2])\n"
        "print(json.dumps(to_json_value(out)))\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONHASHSEED": "123"}
    proc = subprocess.run([sys.executable, "-c", script, str(state), program], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    s.run("hits = hits + 1")
    expected = to_json_value(s.run(program))
    assert json.loads(proc.stdout) == expected == [1, 12, 12, 165, 3, 7**99 % 1000, '"NaN"']
