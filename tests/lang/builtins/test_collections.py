"""Unit tests of the collections builtins, called through their checked wrappers."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from conch.lang.builtins.registry import REGISTRY, load_all
from conch.lang.errors import ConchError
from conch.lang.values import LazyList, to_json_value

load_all()


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    return REGISTRY[name].fn(*args, **kwargs)


def fails(kind: str, name: str, *args: Any, **kwargs: Any) -> ConchError:
    with pytest.raises(ConchError) as info:
        call(name, *args, **kwargs)
    assert info.value.kind == kind, info.value
    return info.value


def counting(n: int | None = None) -> tuple[LazyList, list[int]]:
    """A lazy input that records how many elements were produced."""
    produced: list[int] = []

    def gen() -> Any:
        for i in itertools.count() if n is None else range(n):
            produced.append(i)
            yield i

    return LazyList(gen()), produced


def double(x: Any) -> Any:
    return x * 2


def even(x: Any) -> bool:
    return x % 2 == 0


# -- every Array shape is accepted ---------------------------------------------------


ARRAY_SHAPES = [
    pytest.param(lambda: [1, 2, 3, 4], id="list"),
    pytest.param(lambda: (1, 2, 3, 4), id="tuple"),
    pytest.param(lambda: range(1, 5), id="range"),
    pytest.param(lambda: LazyList(iter([1, 2, 3, 4])), id="lazy"),
]


@pytest.mark.parametrize("make", ARRAY_SHAPES)
def test_array_builtins_accept_every_array_shape(make: Any) -> None:
    def j(v: Any) -> Any:
        return to_json_value(v)

    assert j(call("map", make(), double)) == [2, 4, 6, 8]
    assert j(call("where", make(), even)) == [2, 4]
    assert call("reduce", make(), lambda a, x: a + x, 0) == 10
    assert j(call("take", make(), 2)) == [1, 2]
    assert j(call("skip", make(), 3)) == [4]
    assert j(call("reverse", make())) == [4, 3, 2, 1]
    assert j(call("sort", make(), desc=True)) == [4, 3, 2, 1]
    assert j(call("chunk", make(), 3)) == [[1, 2, 3], [4]]
    assert j(call("window", make(), 3)) == [[1, 2, 3], [2, 3, 4]]
    assert call("first", make()) == 1
    assert call("last", make()) == 4
    assert call("len", make()) == 4
    assert call("contains", make(), 3) is True
    assert call("index_of", make(), 3) == 2
    assert j(call("slice", make(), 1, -1)) == [2, 3]
    assert call("sum", make()) == 10
    assert call("max", make()) == 4
    assert j(call("enumerate", make()))[0] == {"index": 0, "item": 1}
    assert j(call("zip", make(), ["a", "b"])) == [[1, "a"], [2, "b"]]


# -- the lazy rule -------------------------------------------------------------------


def test_lazy_input_gives_lazy_output_and_list_gives_list() -> None:
    for name, extra in [
        ("map", (double,)),
        ("where", (even,)),
        ("each", (double,)),
        ("flat_map", (lambda x: [x],)),
        ("take_while", (lambda x: x < 3,)),
        ("skip_while", (lambda x: x < 3,)),
        ("enumerate", ()),
        ("compact", ()),
        ("chunk", (2,)),
        ("window", (2,)),
        ("flatten", ()),
        ("uniq", ()),
        ("append", (9,)),
    ]:
        lazy, _ = counting(5)
        assert type(call(name, lazy, *extra)) is LazyList, name
        assert type(call(name, range(5), *extra)) is LazyList, name
        assert type(call(name, [0, 1, 2, 3, 4], *extra)) is list, name


def test_infinite_pipeline_stops_after_what_is_taken() -> None:
    lazy, produced = counting()
    out = call("take", call("map", call("where", lazy, even), double), 3)
    assert out == [0, 4, 8]
    assert produced == [0, 1, 2, 3, 4]


def test_huge_range_pipeline_is_instant() -> None:
    big = call("range", 0, 10**12)
    out = call("take", call("map", big, double), 3)
    assert list(out) == [0, 2, 4]
    assert call("first", call("where", big, lambda x: x > 10)) == 11
    assert call("any", big, lambda x: x == 5) is True
    assert call("contains", big, 10**11) is True
    assert list(call("take", call("chunk", big, 2), 2)) == [[0, 1], [2, 3]]
    assert list(call("take", call("window", big, 3), 2)) == [[0, 1, 2], [1, 2, 3]]
    assert call("find", call("enumerate", big), lambda r: r["item"] == 3) == {"index": 3, "item": 3}


def test_slicing_a_range_stays_a_range() -> None:
    assert call("take", range(10), 3) == range(3)
    assert call("skip", range(10), 8) == range(8, 10)
    assert call("reverse", range(3)) == range(2, -1, -1)
    assert call("last", range(10), 2) == range(8, 10)


def test_lazy_results_replay() -> None:
    doubled = call("map", range(4), double)
    assert list(doubled) == [0, 2, 4, 6]
    assert list(doubled) == [0, 2, 4, 6]
    assert call("sum", doubled) == 12


def test_each_effects_happen_as_consumed_and_nulls_are_dropped() -> None:
    seen: list[int] = []

    def record(x: int) -> None:
        seen.append(x)

    assert call("each", [1, 2, 3], record) == []
    assert seen == [1, 2, 3]
    assert call("each", [1, 2, 3], lambda x: x if x > 1 else None) == [2, 3]


def test_inputs_are_not_mutated() -> None:
    rec = {"a": 1}
    rows = [{"a": 1}, {"a": 2}]
    items = [3, 1, 2]
    call("insert", rec, "b", 2)
    call("update", rec, "a", 5)
    call("merge", rec, {"z": 0})
    call("insert", rows, "b", 0)
    call("update", rows, "a", 0)
    call("sort", items)
    call("append", items, 4)
    call("insert", items, 0, 9)
    call("update", items, 0, 9)
    assert rec == {"a": 1}
    assert rows == [{"a": 1}, {"a": 2}]
    assert items == [3, 1, 2]


# -- type errors name the parameter --------------------------------------------------


def test_type_errors_name_the_parameter() -> None:
    err = fails("TypeError", "map", 3, double)
    assert "'items'" in err.message and "Int" in err.message
    err = fails("TypeError", "map", [1], "x")
    assert "'fn'" in err.message and "String" in err.message
    err = fails("TypeError", "take", [1], "2")
    assert "'n'" in err.message
    err = fails("TypeError", "sort_by", [{"a": 1}], 3)
    assert "'key'" in err.message
    err = fails("TypeError", "sort", [1], desc="yes")
    assert "'desc'" in err.message
    err = fails("TypeError", "len", 5)
    assert "'value'" in err.message
    err = fails("TypeError", "contains", "abc", 1)
    assert "'needle'" in err.message
    err = fails("TypeError", "range", 1.5)
    assert "'start'" in err.message
    err = fails("TypeError", "zip", [1], [2], 3)
    assert "'more'" in err.message


# -- ordering ------------------------------------------------------------------------


def test_sort_orders_numbers_strings_and_puts_nulls_last() -> None:
    assert call("sort", [3, 1.5, 2, -1]) == [-1, 1.5, 2, 3]
    assert call("sort", ["b", "a", "B"]) == ["B", "a", "b"]
    assert call("sort", [True, False]) == [False, True]
    assert call("sort", [[2, 1], [1, 5], [1]]) == [[1], [1, 5], [2, 1]]
    assert call("sort", [None, 2, None, 1]) == [1, 2, None, None]
    assert call("sort", [None, 2, 1], desc=True) == [2, 1, None]
    assert call("sort", []) == []
    assert call("sort", range(5, 0, -2)) == [1, 3, 5]
    assert call("sort", range(0, 5, 2), desc=True) == [4, 2, 0]


def test_sort_of_mixed_types_is_a_type_error() -> None:
    err = fails("TypeError", "sort", [1, "a"])
    assert "Int" in err.message and "String" in err.message
    fails("TypeError", "sort", [True, 1])
    err = fails("TypeError", "sort", [{"a": 1}, {"a": 2}])
    assert err.hint and "sort_by" in err.hint
    fails("TypeError", "sort", [[1], ["a"]])


def test_sort_is_stable_for_equal_numbers() -> None:
    one, one_f = 1, 1.0
    out = call("sort", [one_f, 0, one])
    assert out == [0, 1, 1] and type(out[1]) is float and type(out[2]) is int
    out = call("sort", [one, 2, one_f], desc=True)
    assert out == [2, 1, 1] and type(out[1]) is int and type(out[2]) is float


def test_sort_by_is_stable_in_both_directions() -> None:
    rows = [{"n": c, "s": s} for c, s in zip("abcdef", [2, 1, 2, 1, 3, 2], strict=True)]
    asc = [r["n"] for r in call("sort_by", rows, "s")]
    desc = [r["n"] for r in call("sort_by", rows, "s", desc=True)]
    assert asc == ["b", "d", "a", "c", "f", "e"]
    assert desc == ["e", "a", "c", "f", "b", "d"]


def test_sort_by_function_path_nulls_and_errors() -> None:
    assert call("sort_by", ["ccc", "a", "bb"], len) == ["a", "bb", "ccc"]
    assert call("sort_by", ["ccc", "a", "bb"], REGISTRY["len"].fn) == ["a", "bb", "ccc"]
    rows = [{"m": {"t": 3}}, {"m": {"t": 1}}]
    assert call("sort_by", rows, "m.t") == [{"m": {"t": 1}}, {"m": {"t": 3}}]
    rows2 = [{"s": None}, {"s": 2}, {"s": 1}]
    assert call("sort_by", rows2, "s", desc=True) == [{"s": 2}, {"s": 1}, {"s": None}]
    err = fails("KeyError", "sort_by", [{"size": 1}, {"sise": 2}], "size")
    assert "size" in err.message
    err = fails("KeyError", "sort_by", [{"size": 1}], "sizee")
    assert err.hint == 'did you mean "size"?'
    fails("TypeError", "sort_by", [1, 2], "size")
    fails("TypeError", "sort_by", [{"s": 1}, {"s": "x"}], "s")


def test_min_by_max_by() -> None:
    rows = [{"n": "a", "s": 3}, {"n": "b", "s": 1}, {"n": "c", "s": 3}]
    assert call("min_by", rows, "s")["n"] == "b"
    assert call("max_by", rows, "s")["n"] == "a"  # first on ties
    assert call("max_by", [], "s") is None
    assert call("min_by", [{"s": None}, {"s": 4}], "s") == {"s": 4}
    fails("TypeError", "min_by", [{"s": 1}, {"s": "a"}], "s")


# -- slicing -------------------------------------------------------------------------


def test_first_last_take_skip_edges() -> None:
    assert call("first", []) is None
    assert call("last", []) is None
    assert call("first", LazyList(iter([]))) is None
    assert call("first", [1, 2, 3], 2) == [1, 2]
    assert call("last", [1, 2, 3], 0) == []
    assert call("last", [1, 2, 3], 5) == [1, 2, 3]
    assert call("take", [1], 0) == []
    assert call("skip", [], 3) == []
    fails("ValueError", "take", [1], -1)
    fails("ValueError", "skip", [1], -1)
    fails("ValueError", "last", [1], -2)


def test_slice() -> None:
    assert call("slice", [1, 2, 3, 4], 1) == [2, 3, 4]
    assert call("slice", [1, 2, 3, 4], -3, -1) == [2, 3]
    assert call("slice", "hello", 1, 3) == "el"
    assert list(call("slice", LazyList(iter(range(10))), 2, 4)) == [2, 3]
    assert call("slice", LazyList(iter(range(10))), -2) == [8, 9]
    assert call("slice", range(10), 3, 5) == range(3, 5)


def test_take_while_skip_while() -> None:
    assert call("take_while", [1, 2, 5, 1], lambda x: x < 3) == [1, 2]
    assert call("skip_while", [1, 2, 5, 1], lambda x: x < 3) == [5, 1]


def test_chunk_window_flatten() -> None:
    assert call("chunk", [1, 2, 3], 1) == [[1], [2], [3]]
    fails("ValueError", "chunk", [1], 0)
    assert call("window", [1, 2, 3, 4, 5, 6, 7], 2, step=3) == [[1, 2], [4, 5]]
    assert list(call("window", range(1, 8), 2, step=3)) == [[1, 2], [4, 5]]
    assert list(call("window", range(1, 6), 3, step=2)) == [[1, 2, 3], [3, 4, 5]]
    assert call("window", [1, 2, 3, 4, 5], 3, step=2) == [[1, 2, 3], [3, 4, 5]]
    fails("ValueError", "window", [1], 2, step=0)
    assert call("flatten", [[1, [2]], 3, range(4, 6)]) == [1, [2], 3, 4, 5]
    assert call("flatten", [[[[1]]]], depth=2) == [[1]]
    assert call("flatten", [[[[1]]], [2]], depth=-1) == [1, 2]
    assert call("flatten", [[1]], depth=0) == [[1]]


# -- grouping and uniqueness ---------------------------------------------------------


def test_uniq_is_structural_and_keeps_bools_apart() -> None:
    assert call("uniq", [1, 1.0, True, "1", None, None]) == [1, True, "1", None]
    assert call("uniq", [{"a": 1, "b": 2}, {"b": 2, "a": 1}, [1], [1]]) == [{"a": 1, "b": 2}, [1]]
    assert list(call("uniq", LazyList(iter([3, 3, 1])))) == [3, 1]
    assert call("uniq_by", [{"t": 1, "n": 1}, {"t": 1, "n": 2}], "t") == [{"t": 1, "n": 1}]


def test_group_by_stringifies_keys_in_first_seen_order() -> None:
    out = call("group_by", [3, 1, 2, None, True], lambda x: x)
    assert list(out) == ["3", "1", "2", "null", "true"]
    out = call("group_by", ["apple", "bob", "avocado"], lambda s: s[0])
    assert out == {"a": ["apple", "avocado"], "b": ["bob"]}
    assert call("group_by", [{"k": [1, 2]}], "k") == {"[1,2]": [{"k": [1, 2]}]}


def test_partition_count_count_by() -> None:
    assert call("partition", range(6), even) == [[0, 2, 4], [1, 3, 5]]
    assert call("count", range(10), even) == 5
    assert call("count", LazyList(iter([1, 2]))) == 2
    assert call("count_by", [{"t": "a"}, {"t": "b"}, {"t": "a"}], "t") == {"a": 2, "b": 1}


# -- membership ----------------------------------------------------------------------


def test_contains_and_index_of() -> None:
    assert call("contains", [1, 2], 2.0) is True
    assert call("contains", [1, 2], True) is False
    assert call("contains", [True], 1) is False
    assert call("contains", [{"a": [1]}], {"a": [1]}) is True
    assert call("contains", "héllo", "él") is True
    assert call("contains", "abc", "") is True
    assert call("contains", {"a": 1}, "a") is True
    assert call("contains", {"a": 1}, 1) is False
    assert call("contains", range(0, 10, 2), 4) is True
    assert call("contains", range(0, 10, 2), 3) is False
    assert call("index_of", [1, 2, 2], 2) == 1
    assert call("index_of", [1, True], True) == 1
    assert call("index_of", "banana", "na") == 2
    assert call("index_of", "banana", "x") == -1
    fails("TypeError", "index_of", "abc", 1)


def test_len_is_empty_default_compact() -> None:
    assert call("length", "héllo") == 5
    assert call("len", {"a": 1}) == 1
    assert call("len", range(0, 10, 3)) == 4
    assert call("is_empty", None) is True
    assert call("is_empty", range(0)) is True
    assert call("is_empty", LazyList(iter([]))) is True
    lazy, produced = counting()
    assert call("is_empty", lazy) is False
    assert produced == [0]
    fails("TypeError", "is_empty", 0)
    assert call("default", None, 1) == 1
    assert call("default", False, 1) is False
    assert call("compact", [0, None, "", False]) == [0, "", False]
    assert call("compact", [0, None, "", [], {}, False], empty=True) == [0, False]


# -- building ------------------------------------------------------------------------


def test_range() -> None:
    assert call("range", 3) == range(3)
    assert call("range", 1, 4) == range(1, 4)
    assert list(call("range", 5, 0, step=-2)) == [5, 3, 1]
    assert list(call("range", 5, 0)) == []
    fails("ValueError", "range", 0, 5, step=0)


def test_append_prepend_concat_zip() -> None:
    assert call("append", [], [1]) == [[1]]
    assert list(call("prepend", range(2, 4), 1)) == [1, 2, 3]
    assert call("concat", [1], [], [2, 3]) == [1, 2, 3]
    assert call("concat", [1]) == [1]
    assert type(call("concat", [1], range(2, 3))) is LazyList
    assert call("zip", [1, 2], ["a"], [True, False]) == [[1, "a", True]]
    assert call("zip", [], [1]) == []


def test_reduce() -> None:
    assert call("reduce", range(1, 11), lambda a, x: a + x, 0) == 55
    assert call("reduce", [5], lambda a, x: a + x) == 5
    assert call("reduce", ["a", "b", "c"], lambda a, x: x + a) == "cba"
    err = fails("ValueError", "reduce", [], lambda a, x: a)
    assert err.hint and "initial" in err.hint


def test_any_all_find() -> None:
    assert call("any", [], even) is False
    assert call("all", [], even) is True
    assert call("any", [False, False]) is False
    assert call("all", [True, True]) is True
    assert call("find", [1, 3, 4, 6], even) == 4
    assert call("find", [], even) is None


# -- Records and Tables --------------------------------------------------------------


def test_get_paths() -> None:
    data = {"a": {"b": [10, {"c": "deep"}]}, "1": "one"}
    assert call("get", data, "a.b.1.c") == "deep"
    assert call("get", data, "a.b.-2") == 10
    assert call("get", data, ["a", "b", 0]) == 10
    assert call("get", data, 1) == "one"
    assert call("get", data, "a.b.9") is None
    assert call("get", data, "a.x", default="d") == "d"
    assert call("get", data, "") is data
    assert call("get", [{"n": 1}, {"n": 2}], "n") == [1, 2]
    assert call("get", [{"n": 1}, {"m": 2}], "n", default=0) == 0
    assert call("get", "abc", 1) == "b"
    assert call("get", range(5), -1) == 4
    assert call("get", {"a.b": 1, "a": {"b": 2}}, "a.b") == 1


def test_select_reject() -> None:
    table = [{"n": "a", "s": 1, "t": 2}, {"n": "b", "s": 3, "t": 4}]
    assert call("select", table, "t", "n") == [{"t": 2, "n": "a"}, {"t": 4, "n": "b"}]
    assert call("select", {"a": 1, "b": 2}, ["b"]) == {"b": 2}
    err = fails("KeyError", "select", {"name": 1}, "nme")
    assert err.hint == 'did you mean "name"?'
    fails("TypeError", "select", [1, 2], "a")
    assert call("reject", table, "s", "t") == [{"n": "a"}, {"n": "b"}]
    assert call("reject", {"a": 1}, "zz") == {"a": 1}


def test_merge_insert_update() -> None:
    assert call("merge", {"a": 1}, {"a": 2}, {"b": 3}) == {"a": 2, "b": 3}
    fails("TypeError", "merge", {"a": 1}, [{"b": 1}])
    assert call("merge", [{"a": 1}], [{"b": 2}, {"b": 3}]) == [{"a": 1, "b": 2}]
    assert call("insert", {"a": 1}, "b", lambda r: r["a"] + 1) == {"a": 1, "b": 2}
    err = fails("ValueError", "insert", {"a": 1}, "a", 2)
    assert err.hint and "update" in err.hint
    assert call("insert", [1, 2], 2, 3) == [1, 2, 3]
    assert call("insert", [1, 2], -1, 9) == [1, 9, 2]
    fails("IndexError", "insert", [1, 2], 5, 3)
    assert call("update", {"a": 1}, "a", lambda v: v + 1) == {"a": 2}
    err = fails("KeyError", "update", {"abc": 1}, "abd", 2)
    assert err.hint == 'did you mean "abc"?'
    fails("IndexError", "update", [1], 1, 0)
    fails("TypeError", "insert", {"a": 1}, 0, 1)


def test_keys_values_entries() -> None:
    assert call("keys", {"b": 1, "a": 2}) == ["b", "a"]
    assert call("keys", [{"x": 1, "y": 2}]) == ["x", "y"]
    assert call("keys", []) == []
    fails("TypeError", "keys", [1, 2])
    assert call("values", [{"x": 1, "y": 2}, {"x": 3, "y": 4}]) == [[1, 3], [2, 4]]
    rec = {"a": 1, "b": [2]}
    assert call("from_entries", call("entries", rec)) == rec
    assert call("from_entries", [[1, "x"]]) == {"1": "x"}
    fails("TypeError", "from_entries", [[1, 2, 3]])


def test_transpose_round_trips() -> None:
    assert call("transpose", [[1, 2], [3, 4], [5, 6]]) == [[1, 3, 5], [2, 4, 6]]
    table = [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    cols = call("transpose", table)
    assert cols == {"a": [1, 3], "b": [2, 4]}
    assert call("transpose", cols) == table
    assert call("transpose", []) == []
    fails("ValueError", "transpose", [[1, 2], [3]])
    fails("ValueError", "transpose", {"a": [1], "b": [1, 2]})
    fails("TypeError", "transpose", {"a": 1})


def test_predicates_must_return_bools() -> None:
    def ident(x: Any) -> Any:
        return x

    for name in ("where", "any", "all", "find", "take_while", "skip_while", "partition", "count"):
        err = fails("TypeError", name, [1, 2], ident)
        assert err.message.startswith(f"{name}: the predicate must return a Bool, got Int")
        assert err.hint
    fails("TypeError", "any", [0, 1])
    fails("TypeError", "all", [True, None])
    with pytest.raises(ConchError):
        list(call("where", range(3), ident))
    # Short-circuiting stops before a bad result is seen.
    assert call("any", [True, 5]) is True
    assert call("all", [False, 5]) is False
    assert call("take_while", [1, 2, "x"], lambda x: x == 1) == [1]
    assert call("skip_while", [1, 2, "x"], lambda x: x == 1) == [2, "x"]
    assert list(call("skip_while", range(5), lambda x: x < 3)) == [3, 4]
