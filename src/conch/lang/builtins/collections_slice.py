"""Collection builtins that take part of an Array, by position or while a predicate holds:
``first``, ``last``, ``take``, ``skip``, ``take_while``, ``skip_while`` and ``slice``.

Category ``collections``: the category's conventions (the lazy rule, selectors' null on an
empty input) are in :mod:`.collections`.
"""

from __future__ import annotations

import itertools

from conch.lang.builtins.collections import like_input, not_bool
from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Array, Function, Int, String
from conch.lang.errors import check_at_least
from conch.lang.values import LazyList, as_list

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


@builtin(
    "first",
    category="collections",
    description=(
        "The first element, or null for an empty input. With `n`, an Array of the first `n` "
        "elements (like `take`)."
    ),
    examples=[
        Example("[5, 6, 7] | first", 5),
        Example("[] | first", None),
        Example("range(0, 100) | first(3)", [0, 1, 2]),
    ],
)
def first_(items: Array, n: Int | None = None) -> Any:
    if n is not None:
        return take_(items, n)
    t = type(items)
    if t is list or t is tuple or t is range:
        return items[0] if items else None
    return next(iter(items), None)


@builtin(
    "last",
    category="collections",
    description=(
        "The last element, or null for an empty input. With `n`, an Array of the last `n` elements."
    ),
    examples=[
        Example("[5, 6, 7] | last", 7),
        Example("[] | last", None),
        Example("[1, 2, 3, 4] | last(2)", [3, 4]),
    ],
)
def last_(items: Array, n: Int | None = None) -> Any:
    seq = items if type(items) is range else as_list(items)
    if n is not None:
        check_at_least("last", "n", n, 0)
        if n == 0:
            return seq[:0] if type(seq) is range else []
        tail = seq[-n:]
        return tail if type(tail) is range else list(tail)
    return seq[-1] if seq else None


@builtin(
    "take",
    category="collections",
    description=(
        "The first `n` elements (all of them when there are fewer). Lazy: "
        "`range(0, 10**9) | map(f) | take(5)` computes five elements."
    ),
    examples=[
        Example("[1, 2, 3, 4] | take(2)", [1, 2]),
        Example("[1, 2] | take(5)", [1, 2]),
        Example("range(0, 1000000000) | map(fn(x) => x * 2) | take(3)", [0, 2, 4]),
    ],
)
def take_(items: Array, n: Int) -> Array:
    check_at_least("take", "n", n, 0)
    t = type(items)
    if t is list or t is range:
        return items[:n]
    if t is tuple:
        return list(items[:n])
    return LazyList(itertools.islice(items, n))


@builtin(
    "skip",
    category="collections",
    description="Everything after the first `n` elements (empty when there are fewer).",
    examples=[
        Example("[1, 2, 3, 4] | skip(2)", [3, 4]),
        Example("[1, 2] | skip(5)", []),
        Example("range(0, 5) | skip(3)", [3, 4]),
    ],
)
def skip_(items: Array, n: Int) -> Array:
    check_at_least("skip", "n", n, 0)
    t = type(items)
    if t is list or t is range:
        return items[n:]
    if t is tuple:
        return list(items[n:])
    return LazyList(itertools.islice(items, n, None))


@builtin(
    "take_while",
    category="collections",
    description="The leading elements for which the predicate returns true, up to the first false.",
    examples=[
        Example("[1, 2, 5, 1] | take_while(fn(x) => x < 3)", [1, 2]),
        Example("[5, 1] | take_while(fn(x) => x < 3)", []),
    ],
)
def take_while_(items: Array, predicate: Function) -> Array:
    return like_input(items, itertools.takewhile(_bool_test("take_while", predicate), items))


def _bool_test(who: str, predicate: Callable[[Any], Any]) -> Callable[[Any], bool]:
    """The predicate, with a result that is not a Bool an error (for itertools)."""

    def test(x: Any) -> bool:
        r = predicate(x)
        if r is True or r is False:
            return r
        return not_bool(who, r)

    return test


@builtin(
    "skip_while",
    category="collections",
    description="Drop the leading elements for which the predicate returns true; keep the rest.",
    examples=[
        Example("[1, 2, 5, 1] | skip_while(fn(x) => x < 3)", [5, 1]),
        Example("[1, 2] | skip_while(fn(x) => x < 3)", []),
    ],
)
def skip_while_(items: Array, predicate: Function) -> Array:
    return like_input(items, itertools.dropwhile(_bool_test("skip_while", predicate), items))


@builtin(
    "slice",
    category="collections",
    description=(
        "The elements from index `start` up to (not including) `end`; negative indices count "
        "from the end, a missing `end` means to the end. Works on Strings too."
    ),
    examples=[
        Example("[10, 20, 30, 40] | slice(1, 3)", [20, 30]),
        Example("[10, 20, 30, 40] | slice(-2)", [30, 40]),
        Example('"conch" | slice(1, 4)', "onc"),
    ],
)
def slice_(items: Array | String, start: Int, end: Int | None = None) -> Array | String:
    t = type(items)
    if t is list or t is str or t is range:
        return items[start:end]
    if t is LazyList and start >= 0 and (end is None or end >= 0):
        return LazyList(itertools.islice(items, start, end))
    return as_list(items)[start:end]
