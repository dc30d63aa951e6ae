"""Unit tests of the math builtins, called through their checked wrappers."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from conch.lang.builtins.registry import REGISTRY, load_all
from conch.lang.errors import ConchError
from conch.lang.values import LazyList

load_all()


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    return REGISTRY[name].fn(*args, **kwargs)


def fails(kind: str, name: str, *args: Any, **kwargs: Any) -> ConchError:
    with pytest.raises(ConchError) as info:
        call(name, *args, **kwargs)
    assert info.value.kind == kind, info.value
    return info.value


def test_sum_keeps_ints_exact_and_floats_accurate() -> None:
    assert call("sum", []) == 0
    assert call("sum", [10**30, 1]) == 10**30 + 1
    total = call("sum", [1, 2, 3])
    assert total == 6 and type(total) is int
    assert call("sum", [0.1] * 10) == 1.0
    assert call("sum", [1, 0.5]) == 1.5
    assert call("sum", range(0, 10, 3)) == 18
    assert call("sum", range(10, 0, -3)) == 22
    assert call("sum", range(5, 5)) == 0
    assert call("sum", LazyList(iter([1, 2]))) == 3
    assert call("sum", [math.inf, -math.inf]) != call("sum", [math.inf, -math.inf])  # NaN


def test_sum_of_non_numbers_is_a_type_error_naming_the_element() -> None:
    err = fails("TypeError", "sum", [1, "2"])
    assert "element 1" in err.message and "String" in err.message
    fails("TypeError", "sum", [True, 1])
    fails("TypeError", "sum", 5)
    fails("TypeError", "avg", [None])


def test_product() -> None:
    assert call("product", []) == 1
    assert call("product", range(1, 6)) == 120
    assert call("product", [2, 0.5]) == 1.0


def test_empty_statistics_are_value_errors() -> None:
    for name in ("avg", "median", "mode", "min", "max", "stddev", "variance"):
        err = fails("ValueError", name, [])
        assert "empty" in err.message
    fails("ValueError", "variance", [1], sample=True)


def test_avg_median_mode() -> None:
    assert call("avg", [1, 2]) == 1.5
    assert type(call("avg", [2, 2])) is float
    assert call("avg", range(1, 101)) == 50.5
    assert call("median", [5]) == 5
    assert call("median", [1, 3, 2, 4]) == 2.5
    assert call("median", [1.5, 0.5, 10]) == 1.5
    assert call("mode", [3, 1, 1, 3]) == 3
    assert call("mode", [[1], [2], [2]]) == [2]
    assert call("mode", [True, 1, 1]) == 1


def test_variance_and_stddev() -> None:
    data = [2, 4, 4, 4, 5, 5, 7, 9]
    assert call("variance", data) == 4.0
    assert call("stddev", data) == 2.0
    assert call("variance", data, sample=True) == pytest.approx(32 / 7)
    assert call("stddev", data, sample=True) == pytest.approx(math.sqrt(32 / 7))


def test_min_max_arrays_and_arguments() -> None:
    assert call("min", [3, 1.5, 2]) == 1.5
    assert call("max", 1, 9, 3) == 9
    assert call("max", 7) == 7
    assert call("min", "b", "a") == "a"
    assert call("max", range(10, 0, -1)) == 10
    assert call("min", LazyList(iter([4, 2]))) == 2
    err = fails("TypeError", "min", [1, "a"])
    assert "Int" in err.message and "String" in err.message
    fails("TypeError", "max", [[1], 2])
    err = fails("TypeError", "max", 1, None)
    assert "'more'" in err.message


def test_round_half_away_from_zero() -> None:
    assert call("round", 0.5) == 1
    assert call("round", 1.5) == 2
    assert call("round", 2.5) == 3
    assert call("round", -0.5) == -1
    r = call("round", 2.7)
    assert r == 3 and type(r) is int
    assert call("round", 2.675, 2) == 2.68
    assert call("round", 1.005, 2) == 1.01
    assert call("round", 7, 2) == 7
    assert call("round", 1250, -2) == 1300
    assert call("round", -1250, -2) == -1300
    assert call("round", 1249.9, -2) == 1200
    assert call("round", 1e300) == int(1e300) or call("round", 1e300) == 10**300
    assert call("round", 1.23e-30, 32) == 1.23e-30
    assert call("round", math.inf, 2) == math.inf
    fails("ValueError", "round", math.nan)
    fails("ValueError", "round", math.inf)
    err = fails("TypeError", "round", 1.5, 1.0)
    assert "'digits'" in err.message


def test_floor_ceil_abs_clamp() -> None:
    assert call("floor", -0.5) == -1 and type(call("floor", 2.5)) is int
    assert call("ceil", 10**20) == 10**20
    fails("ValueError", "ceil", math.inf)
    assert call("abs", -(10**30)) == 10**30
    assert call("clamp", 5, 0, 10) == 5
    assert call("clamp", 5, 5, 5) == 5
    fails("ValueError", "clamp", 5, 10, 0)
    err = fails("TypeError", "abs", "3")
    assert "'x'" in err.message


def test_sqrt_pow_log_exp() -> None:
    assert call("sqrt", 0) == 0.0
    fails("ValueError", "sqrt", -1)
    fails("ValueError", "sqrt", 10**400)
    assert call("pow", 3, 0) == 1
    assert call("pow", 2.0, 3) == 8.0
    assert call("pow", -8, 1.0) == -8.0
    fails("ValueError", "pow", -8, 0.5)
    fails("ZeroDivisionError", "pow", 0, -1)
    fails("ZeroDivisionError", "pow", 0.0, -1.5)
    fails("ValueError", "pow", 10.0, 400)
    start = time.perf_counter()
    fails("LimitError", "pow", 10, 10**9)
    assert time.perf_counter() - start < 1
    assert call("log", math.e) == 1.0
    assert call("log", 8, base=2) == 3.0
    assert call("log", 100, 10) == 2.0
    assert call("log", 27, 3) == pytest.approx(3.0)
    assert call("log", 10**400, 10) == pytest.approx(400)
    fails("ValueError", "log", 0)
    fails("ValueError", "log", -1)
    fails("ValueError", "log", 4, base=1)
    assert call("exp", 0) == 1.0
    fails("ValueError", "exp", 1000)


def test_random() -> None:
    for _ in range(100):
        x = call("random")
        assert type(x) is float and 0 <= x < 1
        n = call("random", 1, 3)
        assert type(n) is int and n in (1, 2)
        f = call("random", 1.0, 2)
        assert type(f) is float and 1 <= f < 2
    assert call("random", seed=1) == call("random", seed=1)
    assert call("random", 0, 100, seed="abc") == call("random", 0, 100, seed="abc")
    assert call("random", seed=1) != call("random", seed=2)
    fails("ValueError", "random", 3, 3)
    fails("TypeError", "random", 3)
    err = fails("TypeError", "random", seed=1.5)
    assert "'seed'" in err.message
