"""Collection builtins that order elements or drop repeated ones: ``sort``, ``sort_by``,
``reverse``, ``uniq``, ``uniq_by``, ``min_by`` and ``max_by``.

Category ``collections``: how values are ordered (docs/language.md), keys taken and values compared
for equality is in :mod:`.collections`, shared with the statistics of :mod:`.math`.
"""

from __future__ import annotations

import builtins

from conch.lang.builtins.collections import (
    NONE_TYPE,
    check_orderable,
    field_values,
    hash_key,
    key_function,
    key_values,
    like_input,
    order_error,
    ordered_indices,
)
from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Array, Bool, Function, String
from conch.lang.values import as_list

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from operator import itemgetter
    from typing import Any
else:
    # The C implementations the pure-Python modules re-export: importing collections,
    # functools, operator and typing would cost milliseconds on every start of a program that
    # names a builtin.
    from _operator import itemgetter


_PLAIN_HASHABLE = frozenset((str, int, float, NONE_TYPE))


@builtin(
    "sort",
    category="collections",
    description=(
        "Sort ascending (or descending with `desc=true`), stably. Numbers compare "
        "numerically, Strings lexicographically, Arrays element-wise; nulls go last; mixing "
        "other types (e.g. Int and String) is a TypeError. Sort Records with `sort_by`."
    ),
    examples=[
        Example("[3, 1, 2] | sort", [1, 2, 3]),
        Example("[3, 1.5, 2] | sort(desc=true)", [3, 2, 1.5]),
        Example('["b", "a", "C"] | sort', ["C", "a", "b"]),
        Example("[2, null, 1] | sort", [1, 2, None]),
    ],
)
def sort_(items: Array, desc: Bool = False) -> Array:
    if type(items) is range:
        ascending = items.step > 0
        return as_list(items) if ascending != desc else as_list(items[::-1])
    seq = as_list(items)
    types = set(map(type, seq))
    if NONE_TYPE in types:
        return [seq[i] for i in ordered_indices(seq, desc, "sort")]
    check_orderable(types, "sort")
    try:
        return sorted(seq, reverse=desc)
    except TypeError as exc:
        raise order_error("sort", exc) from None


@builtin(
    "sort_by",
    category="collections",
    description=(
        'Sort by a key: a field name (dotted paths like "a.b" allowed) or a function of the '
        "element. Stable, also with `desc=true` (equal keys keep their input order); null keys "
        "go last; keys are ordered like `sort`."
    ),
    examples=[
        Example(
            '[{name: "a", size: 3}, {name: "b", size: 9}, {name: "c", size: 3}] '
            '| sort_by("size", desc=true) | map(fn(r) => r.name)',
            ["b", "a", "c"],
        ),
        Example('["ccc", "a", "bb"] | sort_by(fn(s) => len(s))', ["a", "bb", "ccc"]),
        Example('[{k: 2}, {k: 1}] | sort_by("k")', [{"k": 1}, {"k": 2}]),
    ],
)
def sort_by_(items: Array, key: String | Function, desc: Bool = False) -> Array:
    rows = as_list(items)
    fast = field_values(rows, key)
    if fast is not None:
        types = set(builtins.map(type, fast))
        if NONE_TYPE not in types:
            check_orderable(types, "sort_by")
            # Sorting the rows by itemgetter beats sorting indices and gathering.
            try:
                return sorted(rows, key=itemgetter(key), reverse=desc)
            except TypeError as exc:
                raise order_error("sort_by", exc) from None
    keys = fast if fast is not None else key_values(rows, key, "sort_by")
    return [rows[i] for i in ordered_indices(keys, desc, "sort_by")]


@builtin(
    "reverse",
    category="collections",
    description="The elements in reverse order (a String's characters reversed).",
    examples=[
        Example("[1, 2, 3] | reverse", [3, 2, 1]),
        Example("range(0, 3) | reverse", [2, 1, 0]),
        Example('"abc" | reverse', "cba"),
    ],
)
def reverse_(items: Array | String) -> Array | String:
    t = type(items)
    if t is range or t is str or t is list:
        return items[::-1]
    return as_list(items)[::-1]


@builtin(
    "uniq",
    category="collections",
    description=(
        "Drop repeated elements, keeping the first occurrence of each (structural equality: "
        "Arrays and Records compare by content; 1 and 1.0 are equal, true and 1 are not)."
    ),
    examples=[
        Example("[1, 2, 1, 3, 2] | uniq", [1, 2, 3]),
        Example("[[1], [1], {a: 1}, {a: 1}] | uniq", [[1], {"a": 1}]),
        Example("[1, true, 1] | uniq", [1, True]),
    ],
)
def uniq_(items: Array) -> Array:
    if type(items) is list and set(map(type, items)) <= _PLAIN_HASHABLE:
        return list(dict.fromkeys(items))
    return like_input(items, _uniq_iter(items, hash_key))


def _uniq_iter(items: Iterable[Any], key: Callable[[Any], Any]) -> Iterator[Any]:
    seen: set[Any] = set()
    add = seen.add
    for x in items:
        k = key(x)
        if k not in seen:
            add(k)
            yield x


@builtin(
    "uniq_by",
    category="collections",
    description=(
        "Keep the first element for each distinct key; the key is a field name or a function "
        "of the element."
    ),
    examples=[
        Example('["apple", "avocado", "banana"] | uniq_by(fn(s) => s[0])', ["apple", "banana"]),
        Example(
            '[{t: "x", n: 1}, {t: "x", n: 2}, {t: "y", n: 3}] | uniq_by("t")',
            [{"t": "x", "n": 1}, {"t": "y", "n": 3}],
        ),
    ],
)
def uniq_by_(items: Array, key: String | Function) -> Array:
    get = key_function(key, "uniq_by")
    return like_input(items, _uniq_iter(items, lambda x: hash_key(get(x))))


def _extreme_by(items: Any, key: Any, who: str, pick: Callable[..., Any]) -> Any:
    rows = as_list(items)
    keys = key_values(rows, key, who)
    present = [i for i, k in builtins.enumerate(keys) if k is not None]
    if not present:
        return None
    check_orderable({type(keys[i]) for i in present}, who)
    try:
        return rows[pick(present, key=keys.__getitem__)]
    except TypeError as exc:
        raise order_error(who, exc) from None


@builtin(
    "min_by",
    category="collections",
    description=(
        "The element with the smallest key (field name or function); the first one on ties. "
        "Null keys are ignored; null for an empty input."
    ),
    examples=[
        Example('[{n: "a", s: 3}, {n: "b", s: 1}] | min_by("s")', {"n": "b", "s": 1}),
        Example('["ccc", "a", "bb"] | min_by(fn(s) => len(s))', "a"),
        Example('[] | min_by("s")', None),
    ],
)
def min_by_(items: Array, key: String | Function) -> Any:
    return _extreme_by(items, key, "min_by", builtins.min)


@builtin(
    "max_by",
    category="collections",
    description=(
        "The element with the largest key (field name or function); the first one on ties. "
        "Null keys are ignored; null for an empty input."
    ),
    examples=[
        Example('[{n: "a", s: 3}, {n: "b", s: 1}] | max_by("s")', {"n": "a", "s": 3}),
        Example('["bb", "a", "cc"] | max_by(fn(s) => len(s))', "bb"),
    ],
)
def max_by_(items: Array, key: String | Function) -> Any:
    return _extreme_by(items, key, "max_by", builtins.max)
