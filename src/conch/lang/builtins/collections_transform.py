"""Collection builtins that call a function on every element: ``map``, ``where`` (alias
``filter``), ``reduce``, ``each``, ``flat_map``, ``any`` and ``all``.

Category ``collections``: the category's conventions (the lazy rule, predicates that must
return a Bool) are in :mod:`.collections`. Chains of these builtins are usually compiled as
one loop (:mod:`conch.lang.fusion`), which must behave exactly as they do.
"""

from __future__ import annotations

import builtins

from conch.lang.builtins.collections import (
    ARRAYS,
    MISSING,
    empty_reduce,
    is_lazy,
    like_input,
    not_bool,
)
from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Array, Bool, Function
from conch.lang.values import LazyList

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from functools import reduce as _reduce
    from typing import Any
else:
    # The C implementations the pure-Python modules re-export: importing collections,
    # functools, operator and typing would cost milliseconds on every start of a program that
    # names a builtin.
    from _functools import reduce as _reduce


@builtin(
    "map",
    category="collections",
    description=(
        "Apply a function to every element and return the results in order. Lazy on a "
        "range or lazy input: `range(0, 10**9) | map(f) | take(3)` computes three elements."
    ),
    examples=[
        Example("[1, 2, 3] | map(fn(x) => x * 2)", [2, 4, 6]),
        Example("range(1, 4) | map(fn(x) => x * x)", [1, 4, 9]),
        Example("[] | map(fn(x) => x + 1)", []),
        Example('[{name: "a"}, {name: "b"}] | map(fn(r) => r.name)', ["a", "b"]),
    ],
)
def map_(items: Array, fn: Function) -> Array:
    if type(items) is list:
        return list(builtins.map(fn, items))
    return like_input(items, builtins.map(fn, items))


@builtin(
    "where",
    category="collections",
    aliases=("filter",),
    description=(
        "Keep the elements for which the predicate returns true, in order (alias `filter`). "
        "The predicate must return a Bool. Lazy on a range or lazy input."
    ),
    examples=[
        Example("[1, 2, 3, 4] | where(fn(x) => x % 2 == 0)", [2, 4]),
        Example(
            '[{n: "a", size: 5}, {n: "b", size: 50}] | where(fn(f) => f.size > 10)',
            [{"n": "b", "size": 50}],
        ),
        Example("range(0, 10) | filter(fn(x) => x > 7)", [8, 9]),
    ],
)
def where_(items: Array, predicate: Function) -> Array:
    # The Bool check costs one identity test per element when the result is true or false.
    if is_lazy(items):
        return LazyList(
            x
            for x in items
            if (r := predicate(x)) is True or (r is not False and not_bool("where", r))
        )
    return [
        x
        for x in items
        if (r := predicate(x)) is True or (r is not False and not_bool("where", r))
    ]


@builtin(
    "reduce",
    category="collections",
    description=(
        "Fold the elements left to right with `fn(acc, x)`, starting from `initial`. When "
        "`initial` is omitted (or null) the first element is the starting accumulator, and an "
        "empty input is a ValueError."
    ),
    examples=[
        Example("range(1, 11) | reduce(fn(acc, x) => acc + x, 0)", 55),
        Example("[2, 3, 4] | reduce(fn(acc, x) => acc * x)", 24),
        Example("[] | reduce(fn(acc, x) => acc + x, 0)", 0),
        Example('["a", "b"] | reduce(fn(acc, x) => acc + x, ">")', ">ab"),
    ],
)
def reduce_(items: Array, fn: Function, initial: Any = None) -> Any:
    if initial is not None:
        return _reduce(fn, items, initial)
    it = iter(items)
    first = next(it, MISSING)
    if first is MISSING:
        empty_reduce()
    return _reduce(fn, it, first)


@builtin(
    "each",
    category="collections",
    description=(
        "Call a function on every element (for its effects or its result) and return the "
        "results that are not null, like Nushell's `each`: `each(print)` prints every element "
        "and returns []. Lazy on a range or lazy input, so effects happen as elements are "
        "consumed."
    ),
    examples=[
        Example("[1, 2, 3] | each(fn(x) => x * 10)", [10, 20, 30]),
        Example("[1, 2, 3] | each(fn(x) => if x > 1 { x } else { null })", [2, 3]),
    ],
)
def each_(items: Array, fn: Function) -> Array:
    return like_input(items, (r for r in builtins.map(fn, items) if r is not None))


def _flat(results: Iterable[Any]) -> Iterator[Any]:
    for r in results:
        if isinstance(r, ARRAYS):
            yield from r
        else:
            yield r


@builtin(
    "flat_map",
    category="collections",
    description=(
        "Apply a function to every element and concatenate the resulting Arrays (a result "
        "that is not an Array is kept as one element). Lazy on a range or lazy input."
    ),
    examples=[
        Example("[1, 2, 3] | flat_map(fn(x) => [x, x * 10])", [1, 10, 2, 20, 3, 30]),
        Example("[[1, 2], [], [3]] | flat_map(fn(x) => x)", [1, 2, 3]),
        Example("range(1, 4) | flat_map(fn(n) => range(0, n))", [0, 0, 1, 0, 1, 2]),
    ],
)
def flat_map_(items: Array, fn: Function) -> Array:
    return like_input(items, _flat(builtins.map(fn, items)))


@builtin(
    "any",
    category="collections",
    description=(
        "True when the predicate returns true for at least one element (without a "
        "predicate: when an element is true). Stops at the first match; false for an empty "
        "input. Predicate results and elements must be Bools."
    ),
    examples=[
        Example("[1, 2, 3] | any(fn(x) => x > 2)", True),
        Example("[] | any(fn(x) => true)", False),
        Example("[false, true] | any", True),
    ],
)
def any_(items: Array, predicate: Function | None = None) -> Bool:
    return _short_circuit("any", items, predicate, True)


@builtin(
    "all",
    category="collections",
    description=(
        "True when the predicate returns true for every element (without a predicate: when "
        "every element is true). Stops at the first failure; true for an empty input. "
        "Predicate results and elements must be Bools."
    ),
    examples=[
        Example("[2, 4, 6] | all(fn(x) => x % 2 == 0)", True),
        Example("[2, 3] | all(fn(x) => x % 2 == 0)", False),
        Example("[] | all(fn(x) => false)", True),
    ],
)
def all_(items: Array, predicate: Function | None = None) -> Bool:
    return _short_circuit("all", items, predicate, False)


def _short_circuit(
    who: str, items: Any, predicate: Callable[[Any], Any] | None, stop: bool
) -> bool:
    """``stop`` at the first element (or predicate result) that is ``stop``, else the other
    Bool: ``any`` stops at true, ``all`` at false."""
    go_on = not stop
    for r in items if predicate is None else builtins.map(predicate, items):
        if r is stop:
            return stop
        if r is not go_on:
            not_bool(who, r)
    return go_on
