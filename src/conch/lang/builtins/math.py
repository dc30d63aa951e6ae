"""Math builtins: aggregates over Arrays (sum, avg, median, ...) and numeric functions.

Aggregates accept any Array (list, range, LazyList, tuple). ``sum`` and ``product`` of an
empty Array are 0 and 1; the statistics that have no value for an empty Array (``avg``,
``median``, ``mode``, ``min``, ``max``, ``stddev``, ``variance``) raise ``ValueError``.
Int stays Int where the result is exact (``sum``, ``product``, ``min``, ``abs``,
``round`` to 0 digits); ``avg``, ``stddev``, ``variance``, ``sqrt``, ``log``, ``exp`` give
Floats.
"""

from __future__ import annotations

import builtins
import math

from conch.lang.builtins.collections import check_orderable, hash_key, type_name
from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Array, Bool, Float, Int, Number, String
from conch.lang.errors import ConchError
from conch.lang.values import as_list

# random, decimal and collections are imported on first use, and typing only by type
# checkers: each costs up to milliseconds on every start of a program that names a builtin.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_NUMBER_TYPES = frozenset((int, float))
_BIG_INT_BITS = 64_000_000  # about 8 MB: `pow` beyond this is a LimitError, not a hang
# Beyond ~330 decimal places in either direction a float's rounding no longer changes it
# (or gives 0); the context's precision covers every digit in between.
_FLOAT_DIGITS = 400
_decimals: Any = None  # (Decimal, ROUND_HALF_UP, a Context for _FLOAT_DIGITS), made on first use


def _decimal() -> Any:
    global _decimals
    if _decimals is None:
        from decimal import ROUND_HALF_UP, Context, Decimal

        _decimals = (Decimal, ROUND_HALF_UP, Context(prec=2 * _FLOAT_DIGITS + 20))
    return _decimals


def _numbers(items: Any, who: str) -> tuple[list[Any], set[type]]:
    """The elements as a list, checked to be numbers; also their Python types."""
    seq = as_list(items) if type(items) is not range else items
    if type(seq) is range:
        return seq, {int}  # type: ignore[return-value]
    types = set(builtins.map(type, seq))
    if not types <= _NUMBER_TYPES:
        for i, x in enumerate(seq):
            t = type(x)
            if t is not int and t is not float:
                raise ConchError(
                    "TypeError",
                    f"{who}: expects an Array of numbers, element {i} is a {type_name(t)}",
                    hint="convert with int() or float(), or pick a field with map(fn(r) => r.x)",
                )
    return seq, types


def _non_empty(seq: Any, who: str) -> None:
    if len(seq) == 0:
        raise ConchError(
            "ValueError",
            f"{who}: the Array is empty",
            hint="check with is_empty first, or use default()",
        )


def _some_numbers(items: Any, who: str) -> tuple[list[Any], set[type]]:
    """:func:`_numbers`, for the statistics that have no value for an empty Array."""
    seq, types = _numbers(items, who)
    _non_empty(seq, who)
    return seq, types


def _total(seq: Any, types: set[type]) -> int | float:
    if float in types:
        try:
            # fsum avoids accumulated rounding error (0.1 + 0.2 + 0.3 == 0.6).
            return math.fsum(seq)
        except (ValueError, OverflowError):
            return builtins.sum(seq)  # inf - inf and overflow: IEEE semantics instead
    return builtins.sum(seq)


@builtin(
    "sum",
    category="math",
    description=(
        "The sum of an Array of numbers: 0 for an empty Array, an Int when every element is "
        "an Int, otherwise a Float computed without accumulated rounding error."
    ),
    examples=[
        Example("[1, 2, 3] | sum", 6),
        Example("[] | sum", 0),
        Example("[0.1, 0.2, 0.3] | sum", 0.6),
        Example("range(1, 101) | sum", 5050),
    ],
)
def sum_(items: Array) -> Number:
    if type(items) is range:
        n = len(items)
        return n * (items[0] + items[-1]) // 2 if n else 0
    seq, types = _numbers(items, "sum")
    return _total(seq, types)


@builtin(
    "product",
    category="math",
    description="The product of an Array of numbers: 1 for an empty Array.",
    examples=[
        Example("[2, 3, 4] | product", 24),
        Example("[] | product", 1),
        Example("[1.5, 2] | product", 3.0),
    ],
)
def product_(items: Array) -> Number:
    seq, _ = _numbers(items, "product")
    return math.prod(seq)


@builtin(
    "avg",
    category="math",
    description="The arithmetic mean of an Array of numbers, as a Float (ValueError when empty).",
    examples=[
        Example("[1, 2, 3, 4] | avg", 2.5),
        Example("[2, 2] | avg", 2.0),
    ],
)
def avg_(items: Array) -> Float:
    seq, types = _some_numbers(items, "avg")
    return _total(seq, types) / len(seq)


@builtin(
    "median",
    category="math",
    description=(
        "The middle value of the sorted numbers; for an even count, the mean of the two "
        "middle values (a Float). ValueError when empty."
    ),
    examples=[
        Example("[3, 1, 2] | median", 2),
        Example("[4, 1, 3, 2] | median", 2.5),
    ],
)
def median_(items: Array) -> Number:
    seq, _ = _some_numbers(items, "median")
    ordered = sorted(seq)
    n = len(ordered)
    mid = n // 2
    if n % 2:
        return ordered[mid]  # type: ignore[no-any-return]
    return (ordered[mid - 1] + ordered[mid]) / 2


@builtin(
    "mode",
    category="math",
    description=(
        "The most frequent element (any values, compared structurally); on a tie, the one seen "
        "first. ValueError when empty."
    ),
    examples=[
        Example("[1, 2, 2, 3] | mode", 2),
        Example('["a", "b", "b", "a"] | mode', "a"),
    ],
)
def mode_(items: Array) -> Any:
    seq = as_list(items)
    _non_empty(seq, "mode")
    import collections

    counts = collections.Counter(builtins.map(hash_key, seq))
    # Counter keeps first-seen order and most_common sorts stably, so ties go to the first.
    best = counts.most_common(1)[0][0]
    for x in seq:
        if hash_key(x) == best:
            return x
    return None  # unreachable


def _extreme(who: str, first: Any, rest: tuple[Any, ...], pick: Any) -> Any:
    if rest:
        seq: Any = [first, *rest]
    elif isinstance(first, int | float | str) and type(first) is not bool:
        return first
    else:
        seq = first if type(first) is range else as_list(first)
    _non_empty(seq, who)
    if type(seq) is range:
        return pick(seq)
    check_orderable(set(builtins.map(type, seq)), who)
    try:
        return pick(seq)
    except TypeError as exc:
        raise ConchError("TypeError", f"{who}: values cannot be ordered ({exc})") from None


@builtin(
    "min",
    category="math",
    description=(
        "The smallest of an Array, or of several arguments (`min(3, 1, 2)`). Numbers compare "
        "numerically, Strings lexicographically; mixing types is a TypeError, an empty Array "
        "a ValueError."
    ),
    examples=[
        Example("[3, 1, 2] | min", 1),
        Example("min(4, 2.5, 7)", 2.5),
        Example('["pear", "apple"] | min', "apple"),
    ],
)
def min_(values: Array | Number | String, *more: Number | String) -> Any:
    return _extreme("min", values, more, builtins.min)


@builtin(
    "max",
    category="math",
    description=(
        "The largest of an Array, or of several arguments (`max(3, 1, 2)`). Numbers compare "
        "numerically, Strings lexicographically; mixing types is a TypeError, an empty Array "
        "a ValueError."
    ),
    examples=[
        Example("[3, 1, 2] | max", 3),
        Example("max(4, 2.5, 7)", 7),
        Example("range(0, 10) | max", 9),
    ],
)
def max_(values: Array | Number | String, *more: Number | String) -> Any:
    return _extreme("max", values, more, builtins.max)


def _variance(items: Any, sample: bool, who: str) -> float:
    seq, types = _some_numbers(items, who)
    n = len(seq)
    if sample and n < 2:
        raise ConchError("ValueError", f"{who}: the sample variance needs at least 2 values")
    mean = _total(seq, types) / n
    return math.fsum((x - mean) ** 2 for x in seq) / (n - 1 if sample else n)


@builtin(
    "variance",
    category="math",
    description=(
        "The population variance of an Array of numbers (the sample variance with "
        "`sample=true`), as a Float. ValueError when empty."
    ),
    examples=[
        Example("[2, 4, 4, 4, 5, 5, 7, 9] | variance", 4.0),
        Example("[1, 2, 3, 4] | variance(sample=true)", 1.6666666666666667),
    ],
)
def variance_(items: Array, sample: Bool = False) -> Float:
    return _variance(items, sample, "variance")


@builtin(
    "stddev",
    category="math",
    description=(
        "The population standard deviation of an Array of numbers (the sample one with "
        "`sample=true`), as a Float. ValueError when empty."
    ),
    examples=[
        Example("[2, 4, 4, 4, 5, 5, 7, 9] | stddev", 2.0),
        Example("[5] | stddev", 0.0),
    ],
)
def stddev_(items: Array, sample: Bool = False) -> Float:
    return math.sqrt(_variance(items, sample, "stddev"))


# -- numeric functions -----------------------------------------------------------------


@builtin(
    "abs",
    category="math",
    description="The absolute value (an Int stays an Int).",
    examples=[Example("abs(-3)", 3), Example("-2.5 | abs", 2.5)],
)
def abs_(x: Number) -> Number:
    return builtins.abs(x)


def _finite(who: str, x: float) -> None:
    if not math.isfinite(x):
        raise ConchError("ValueError", f"{who}: cannot convert {x} to an Int")


@builtin(
    "round",
    category="math",
    description=(
        "Round half away from zero to `digits` decimal places (negative digits round to tens, "
        "hundreds, ...). With digits <= 0 the result is an Int, otherwise a Float; decimal "
        "literals round as written (`round(2.675, 2)` is 2.68)."
    ),
    examples=[
        Example("round(2.5)", 3),
        Example("round(-2.5)", -3),
        Example("round(3.14159, 2)", 3.14),
        Example("round(1234, -2)", 1200),
    ],
)
def round_(x: Number, digits: Int = 0) -> Number:
    if type(x) is int:
        if digits >= 0:
            return x
        q = 10**-digits
        half_up = (builtins.abs(x) + q // 2) // q * q
        return half_up if x >= 0 else -half_up
    if not math.isfinite(x):
        if digits > 0:
            return x
        _finite("round", x)
    if digits > _FLOAT_DIGITS:
        return x
    if digits < -_FLOAT_DIGITS:
        return 0
    # repr gives the shortest decimal that reads back as x, i.e. what the user wrote.
    Decimal, half_up, context = _decimals or _decimal()
    quantum = Decimal(1).scaleb(-digits)
    rounded = Decimal(repr(x)).quantize(quantum, rounding=half_up, context=context)
    return int(rounded) if digits <= 0 else float(rounded)


@builtin(
    "floor",
    category="math",
    description="The largest Int not greater than x.",
    examples=[Example("floor(2.7)", 2), Example("floor(-2.1)", -3), Example("floor(5)", 5)],
)
def floor_(x: Number) -> Int:
    return _to_int("floor", math.floor, x)


@builtin(
    "ceil",
    category="math",
    description="The smallest Int not less than x.",
    examples=[Example("ceil(2.1)", 3), Example("ceil(-2.7)", -2)],
)
def ceil_(x: Number) -> Int:
    return _to_int("ceil", math.ceil, x)


def _to_int(who: str, rounding: Callable[[Any], int], x: Any) -> int:
    if type(x) is float:
        _finite(who, x)
    return rounding(x)


@builtin(
    "sqrt",
    category="math",
    description="The square root, as a Float (ValueError for a negative number).",
    examples=[Example("sqrt(16)", 4.0), Example("sqrt(2)", 1.4142135623730951)],
)
def sqrt_(x: Number) -> Float:
    if x < 0:
        raise ConchError("ValueError", f"sqrt: cannot take the square root of {x}")
    try:
        return math.sqrt(x)
    except OverflowError:
        raise ConchError("ValueError", "sqrt: the number is too large for a Float") from None


@builtin(
    "pow",
    category="math",
    description=(
        "x raised to the power y, like `x ** y`: an Int for Int x and non-negative Int y, "
        "otherwise a Float. A negative base with a fractional exponent is a ValueError."
    ),
    examples=[
        Example("pow(2, 10)", 1024),
        Example("pow(2, -1)", 0.5),
        Example("pow(9, 0.5)", 3.0),
    ],
)
def pow_(x: Number, y: Number) -> Number:
    if type(x) is int and type(y) is int:
        if y > 0 and builtins.abs(x) > 1 and (builtins.abs(x).bit_length() - 1) * y > _BIG_INT_BITS:
            raise ConchError("LimitError", f"pow: {x} ** {y} is too large")
        if y < 0 and x == 0:
            raise ConchError("ZeroDivisionError", "pow: 0 cannot be raised to a negative power")
        return x**y
    if x < 0 and not float(y).is_integer():
        raise ConchError(
            "ValueError", f"pow: a negative base ({x}) with a fractional exponent ({y})"
        )
    if x == 0 and y < 0:
        raise ConchError("ZeroDivisionError", "pow: 0 cannot be raised to a negative power")
    try:
        return math.pow(x, y)
    except OverflowError:
        raise ConchError("ValueError", f"pow: {x} ** {y} is too large for a Float") from None


@builtin(
    "log",
    category="math",
    description=(
        "The logarithm of x in `base` (natural logarithm by default), as a Float. ValueError "
        "for x <= 0 or an invalid base."
    ),
    examples=[
        Example("log(1)", 0.0),
        Example("log(1000, base=10)", 3.0),
        Example("log(8, 2)", 3.0),
    ],
)
def log_(x: Number, base: Number | None = None) -> Float:
    if x <= 0:
        raise ConchError("ValueError", f"log: the logarithm of {x} is undefined (x must be > 0)")
    if base is None:
        return math.log(x)
    if base <= 0 or base == 1:
        raise ConchError("ValueError", f"log: invalid base {base} (must be > 0 and not 1)")
    if base == 10:
        return math.log10(x)
    if base == 2:
        return math.log2(x)
    return math.log(x, base)


@builtin(
    "exp",
    category="math",
    description="e raised to the power x, as a Float (ValueError when it overflows a Float).",
    examples=[Example("exp(0)", 1.0), Example("exp(1)", 2.718281828459045)],
)
def exp_(x: Number) -> Float:
    try:
        return math.exp(x)
    except OverflowError:
        raise ConchError("ValueError", f"exp: e ** {x} is too large for a Float") from None


@builtin(
    "clamp",
    category="math",
    description="x limited to the interval [lo, hi] (ValueError when lo > hi).",
    examples=[
        Example("clamp(15, 0, 10)", 10),
        Example("clamp(-1, 0, 10)", 0),
        Example("clamp(2.5, 0, 10)", 2.5),
    ],
)
def clamp_(x: Number, lo: Number, hi: Number) -> Number:
    if lo > hi:
        raise ConchError("ValueError", f"clamp: lo ({lo}) is greater than hi ({hi})")
    return lo if x < lo else hi if x > hi else x


@builtin(
    "random",
    category="math",
    description=(
        "A random number. `random()` is a Float in [0, 1); `random(lo, hi)` is an Int in "
        "[lo, hi) when both are Ints (like `range`), otherwise a Float in [lo, hi). With "
        "`seed` (an Int or String) the result is reproducible."
    ),
    examples=[
        Example("random()", type="Float"),
        Example("random(1, 7)", type="Int"),
        Example("random(seed=42)", 0.6394267984578837),
        Example("random(seed=7) == random(seed=7)", True),
    ],
)
def random_(
    lo: Number | None = None, hi: Number | None = None, seed: Int | String | None = None
) -> Number:
    import random

    rng: Any = random if seed is None else random.Random(seed)
    if lo is None and hi is None:
        return rng.random()  # type: ignore[no-any-return]
    if lo is None or hi is None:
        raise ConchError("TypeError", "random: give both 'lo' and 'hi', or neither")
    if lo >= hi:
        raise ConchError("ValueError", f"random: lo ({lo}) must be less than hi ({hi})")
    if type(lo) is int and type(hi) is int:
        return rng.randrange(lo, hi)  # type: ignore[no-any-return]
    return lo + (hi - lo) * rng.random()  # type: ignore[no-any-return]
