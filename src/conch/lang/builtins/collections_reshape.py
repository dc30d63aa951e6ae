"""Collection builtins that regroup elements into new Arrays or Records: ``group_by``,
``count_by``, ``partition``, ``chunk``, ``window``, ``flatten``, ``zip`` and ``enumerate``.

Category ``collections``: the category's conventions (the lazy rule, keys given as a field
name or a function) are in :mod:`.collections`.
"""

from __future__ import annotations

import builtins
import itertools

from conch.lang.builtins.collections import (
    ARRAYS,
    is_lazy,
    key_function,
    key_values,
    like_input,
    not_bool,
)
from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Array, Function, Int, Record, String
from conch.lang.errors import check_at_least
from conch.lang.values import LazyList, as_list, render

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections import defaultdict, deque
    from collections.abc import Iterable, Iterator
    from typing import Any
else:
    # The C implementations the pure-Python modules re-export: importing collections,
    # functools, operator and typing would cost milliseconds on every start of a program that
    # names a builtin.
    from _collections import defaultdict, deque


@builtin(
    "group_by",
    category="collections",
    description=(
        "Group elements into a Record keyed by the stringified key (field name or function), "
        "in first-seen order; each value is the Array of elements with that key."
    ),
    examples=[
        Example(
            "[1, 2, 3, 4, 5] | group_by(fn(x) => x % 2)",
            {"1": [1, 3, 5], "0": [2, 4]},
        ),
        Example(
            '[{t: "a", v: 1}, {t: "b", v: 2}, {t: "a", v: 3}] | group_by("t")',
            {"a": [{"t": "a", "v": 1}, {"t": "a", "v": 3}], "b": [{"t": "b", "v": 2}]},
        ),
        Example("[] | group_by(fn(x) => x)", {}),
    ],
)
def group_by_(items: Array, key: String | Function) -> Record:
    rows = as_list(items)
    keys = key_values(rows, key, "group_by")
    if set(builtins.map(type, keys)) != {str}:
        keys = [k if type(k) is str else render(k) for k in keys]
    groups: defaultdict[str, list[Any]] = defaultdict(list)
    for k, x in builtins.zip(keys, rows, strict=True):
        groups[k].append(x)
    return dict(groups)


@builtin(
    "count_by",
    category="collections",
    description=(
        "Count elements per stringified key (field name or function; without a key, the "
        "element itself), in first-seen order."
    ),
    examples=[
        Example('["a", "b", "a"] | count_by', {"a": 2, "b": 1}),
        Example("[1, 2, 3, 4] | count_by(fn(x) => x > 2)", {"false": 2, "true": 2}),
    ],
)
def count_by_(items: Array, key: String | Function | None = None) -> Record:
    get = key_function(key, "count_by") if key is not None else None
    counts: dict[str, int] = {}
    for x in items:
        k = get(x) if get is not None else x
        name = k if type(k) is str else render(k)
        counts[name] = counts.get(name, 0) + 1
    return counts


@builtin(
    "partition",
    category="collections",
    description=(
        "Split into two Arrays: `[matching, rest]`, both in input order "
        "(`let [big, small] = xs | partition(fn(x) => x > 10)`)."
    ),
    examples=[
        Example("[1, 2, 3, 4, 5] | partition(fn(x) => x > 3)", [[4, 5], [1, 2, 3]]),
        Example("[] | partition(fn(x) => true)", [[], []]),
    ],
)
def partition_(items: Array, predicate: Function) -> Array:
    yes: list[Any] = []
    no: list[Any] = []
    for x in items:
        r = predicate(x)
        if r is True:
            yes.append(x)
        elif r is False:
            no.append(x)
        else:
            not_bool("partition", r)
    return [yes, no]


@builtin(
    "chunk",
    category="collections",
    description=(
        "Split into consecutive Arrays of `size` elements; the last may be shorter. Lazy on a "
        "range or lazy input."
    ),
    examples=[
        Example("[1, 2, 3, 4, 5] | chunk(2)", [[1, 2], [3, 4], [5]]),
        Example("[] | chunk(3)", []),
        Example("range(0, 6) | chunk(3)", [[0, 1, 2], [3, 4, 5]]),
    ],
)
def chunk_(items: Array, size: Int) -> Array:
    check_at_least("chunk", "size", size, 1)
    if type(items) is list or type(items) is tuple:
        return [list(items[i : i + size]) for i in range(0, len(items), size)]
    it = iter(items)
    return LazyList(iter(lambda: list(itertools.islice(it, size)), []))


def _windows(items: Iterable[Any], size: int, step: int) -> Iterator[list[Any]]:
    window: deque[Any] = deque(maxlen=size)
    pending = size
    for x in items:
        window.append(x)
        pending -= 1
        if pending == 0:
            yield list(window)
            pending = step
    # With step > size, the elements between windows are skipped by the deque's maxlen.


@builtin(
    "window",
    category="collections",
    description=(
        "Sliding windows of `size` consecutive elements, advancing by `step` (default 1); only "
        "full windows are returned. Lazy on a range or lazy input."
    ),
    examples=[
        Example("[1, 2, 3, 4] | window(2)", [[1, 2], [2, 3], [3, 4]]),
        Example("[1, 2, 3, 4, 5] | window(2, step=2)", [[1, 2], [3, 4]]),
        Example("[1] | window(2)", []),
    ],
)
def window_(items: Array, size: Int, step: Int = 1) -> Array:
    check_at_least("window", "size", size, 1)
    check_at_least("window", "step", step, 1)
    if type(items) is list or type(items) is tuple:
        return [list(items[i : i + size]) for i in range(0, len(items) - size + 1, step)]
    return LazyList(_windows(items, size, step))


def _flatten(items: Iterable[Any], depth: int) -> Iterator[Any]:
    for x in items:
        if depth != 0 and isinstance(x, ARRAYS):
            yield from _flatten(x, depth - 1)
        else:
            yield x


@builtin(
    "flatten",
    category="collections",
    description=(
        "Splice nested Arrays into their parent, `depth` levels deep (default 1; a negative "
        "depth flattens completely). Non-Array elements are kept."
    ),
    examples=[
        Example("[[1, 2], [3], 4] | flatten", [1, 2, 3, 4]),
        Example("[[1, [2, [3]]]] | flatten", [1, [2, [3]]]),
        Example("[[1, [2, [3]]]] | flatten(depth=-1)", [1, 2, 3]),
    ],
)
def flatten_(items: Array, depth: Int = 1) -> Array:
    return like_input(items, _flatten(items, depth))


@builtin(
    "zip",
    category="collections",
    description=(
        "Pair up elements by position: `[[a0, b0], [a1, b1], ...]`, as long as the shortest "
        "input. More than two Arrays give longer tuples. Lazy if any input is lazy."
    ),
    examples=[
        Example('[1, 2, 3] | zip(["a", "b", "c"])', [[1, "a"], [2, "b"], [3, "c"]]),
        Example("[1, 2, 3] | zip([10, 20])", [[1, 10], [2, 20]]),
        Example("zip([1], [2], [3])", [[1, 2, 3]]),
    ],
)
def zip_(items: Array, other: Array, *more: Array) -> Array:
    pairs = builtins.map(list, builtins.zip(items, other, *more, strict=False))
    if is_lazy(items) or is_lazy(other) or builtins.any(builtins.map(is_lazy, more)):
        return LazyList(pairs)
    return list(pairs)


@builtin(
    "enumerate",
    category="collections",
    description="Pair each element with its position: `{index, item}` Records, from `start` (0).",
    examples=[
        Example('["a", "b"] | enumerate', [{"index": 0, "item": "a"}, {"index": 1, "item": "b"}]),
        Example('["a"] | enumerate(start=1)', [{"index": 1, "item": "a"}]),
    ],
)
def enumerate_(items: Array, start: Int = 0) -> Array:
    return like_input(items, ({"index": i, "item": x} for i, x in builtins.enumerate(items, start)))
