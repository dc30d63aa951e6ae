"""Collection builtins: building, slicing, ordering and querying Arrays, Tables and Records.

Note for the strings category: ``contains`` is registered here once for both Arrays
(membership) and Strings (substring), since a builtin name can be registered only once.

Conventions shared by this module and :mod:`.math`:

- Every Array parameter accepts ``list``, ``tuple``, ``range``, ``LazyList`` and Tables.
- Lazy rule: on a lazy input (``range`` or ``LazyList``) the element-wise builtins return a
  ``LazyList`` over a generator (a ``range`` when slicing a ``range``, which is as lazy and
  O(1)); on a ``list`` they return a ``list``. Inputs are never mutated.
- Selectors (``first``, ``last``, ``find``, ``min_by``, ``max_by``) return ``null`` on an
  empty input; statistics (``avg``, ``min``, ...) raise ``ValueError``.
- Ordering follows SPEC §1.2: numbers numerically, strings lexicographically, booleans
  ``false < true``, arrays element-wise; other mixes are a ``TypeError``. ``sort`` and
  ``sort_by`` are stable (also with ``desc=true``) and put ``null`` last.
"""

from __future__ import annotations

import builtins
import itertools

from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Array, Bool, Function, Int, Range, Record, String
from conch.lang.errors import ConchError, check_at_least, did_you_mean
from conch.lang.values import (
    ErrorValue,
    LazyList,
    as_list,
    bounded_list,
    equal,
    is_array,
    member,
    render,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections import defaultdict, deque
    from collections.abc import Callable, Iterable, Iterator
    from functools import reduce as _reduce
    from operator import itemgetter
    from typing import Any
else:
    # The C implementations the pure-Python modules re-export: importing collections,
    # functools, operator and typing would cost milliseconds on every start of a program that
    # names a builtin.
    from _collections import defaultdict, deque
    from _functools import reduce as _reduce
    from _operator import itemgetter

ARRAYS = (list, tuple, range, LazyList)  # what an Array is in Python (a Table is a list)
NONE_TYPE = type(None)
MISSING: Any = object()  # no value there (a path that does not exist, an iterator run dry)


def is_lazy(items: Any) -> Bool:
    """Whether the lazy rule applies to ``items``: a ``range`` or a ``LazyList``."""
    t = type(items)
    return t is range or t is LazyList


def like_input(items: Any, result: Iterable[Any]) -> Any:
    """A list for a list input, a LazyList for a lazy one (the lazy rule)."""
    if is_lazy(items):
        return LazyList(result)
    return bounded_list(result)


# -- type names and ordering -----------------------------------------------------------

_TYPE_NAMES: dict[type, str] = {
    type(None): "Null",
    bool: "Bool",
    int: "Int",
    float: "Float",
    str: "String",
    list: "Array",
    tuple: "Array",
    LazyList: "Array",
    range: "Range",
    dict: "Record",
    ErrorValue: "Error",
}


def type_name(t: type) -> str:
    """The conch name of a Python value type (callables are Functions)."""
    return _TYPE_NAMES.get(t, "Function")


_NUMBERS = frozenset((int, float))


def check_orderable(types: set[type], who: str) -> None:
    """Raise a TypeError unless values of these types can be ordered together (SPEC §1.2)."""
    if not types or types <= _NUMBERS:
        return
    if len(types) == 1 and next(iter(types)) in (str, bool, list, tuple):
        return
    names = sorted({type_name(t) for t in types})
    if len(names) == 1:
        raise ConchError(
            "TypeError",
            f"{who}: {names[0]} values cannot be ordered",
            hint="order by a field or a computed key with sort_by / min_by / max_by"
            if names[0] == "Record"
            else None,
        )
    raise ConchError(
        "TypeError",
        f"{who}: cannot order {' and '.join(names)} values together",
        hint="convert the values to one type first (int, float, str)",
    )


def order_error(who: str, exc: TypeError) -> ConchError:
    # Python reports mismatches inside arrays ("'<' not supported between ..."); say it in
    # conch terms.
    return ConchError("TypeError", f"{who}: values cannot be ordered ({exc})")


def ordered_indices(keys: list[Any], desc: bool, who: str) -> list[int]:
    """Indices of ``keys`` in stable sorted order, nulls last."""
    types = set(map(type, keys))
    nulls: list[int] = []
    present: Iterable[int] = range(len(keys))
    if NONE_TYPE in types:
        types.discard(NONE_TYPE)
        present = [i for i, k in enumerate(keys) if k is not None]
        nulls = [i for i, k in enumerate(keys) if k is None]
    check_orderable(types, who)
    try:
        order = sorted(present, key=keys.__getitem__, reverse=desc)
    except TypeError as exc:
        raise order_error(who, exc) from None
    if nulls:
        order.extend(nulls)
    return order


# -- keys and structural equality ------------------------------------------------------


def _field_getter(name: str, who: str) -> Callable[[Any], Any]:
    dotted = "." in name

    def get(row: Any) -> Any:
        if isinstance(row, dict):
            if name in row:
                return row[name]
            if dotted:
                found = get_path(row, path_segments(name))
                if found is not MISSING:
                    return found
            raise ConchError("KeyError", f"{who}: no field '{name}'", hint=did_you_mean(name, row))
        raise ConchError(
            "TypeError",
            f"{who}: cannot take field '{name}' of a {type_name(type(row))}",
            hint="pass a function as the key for Arrays of non-Records",
        )

    return get


def key_function(key: Any, who: str) -> Callable[[Any], Any]:
    """A key given as a field name (or dotted path) or as a function, as a callable."""
    if type(key) is str:
        return _field_getter(key, who)
    return key  # type: ignore[no-any-return]


def field_values(rows: list[Any], key: Any) -> list[Any] | None:
    """Every row's field ``key`` at C speed, or None when some row lacks it (or the key is
    a function): only Records can be indexed by a String, so success means a Table."""
    if type(key) is str:
        try:
            return list(builtins.map(itemgetter(key), rows))
        except (KeyError, TypeError, IndexError):
            pass
    return None


def key_values(rows: list[Any], key: Any, who: str) -> list[Any]:
    """The key of every row; a field name falls back to the checked getter only to follow a
    dotted path or to report a missing field or a non-Record row."""
    fast = field_values(rows, key)
    if fast is not None:
        return fast
    return list(builtins.map(key_function(key, who), rows))


def hash_key(value: Any) -> Any:
    """A hashable stand-in for a value with conch's structural equality.

    Numbers equal numerically (``1`` and ``1.0`` are one key) but Bools stay distinct from
    numbers; Records compare regardless of key order, like ``==``.
    """
    t = type(value)
    if t is str or t is int or t is float or value is None:
        return value
    if t is bool:
        return ("b", value)
    if isinstance(value, dict):
        return ("r", frozenset((k, hash_key(v)) for k, v in value.items()))
    if isinstance(value, ARRAYS):
        return ("a", tuple(hash_key(v) for v in value))
    return ("f", id(value))


def same(a: Any, b: Any) -> Bool:
    """Equality as conch ``==`` has it: structural, and a Bool never equals a number."""
    return equal(a, b)


_PLAIN_HASHABLE = frozenset((str, int, float, NONE_TYPE))


def not_bool(who: str, result: Any) -> bool:
    """Reject a non-Bool predicate result: conch has no truthiness (``if 0`` is an error too)."""
    raise ConchError(
        "TypeError",
        f"{who}: the predicate must return a Bool, got {type_name(type(result))}",
        hint="compare explicitly, e.g. fn(x) => x != null or fn(x) => len(x) > 0",
    )


# -- transforming ----------------------------------------------------------------------


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


def empty_reduce() -> None:
    """The error of ``reduce`` over nothing without an initial value (fused code raises it too)."""
    raise ConchError(
        "ValueError",
        "reduce: empty input and no initial value",
        hint="pass an initial value: reduce(fn(acc, x) => ..., 0)",
    )


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


# -- slicing ---------------------------------------------------------------------------


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


# -- ordering --------------------------------------------------------------------------


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


# -- sizes and membership --------------------------------------------------------------


@builtin(
    "len",
    category="collections",
    aliases=("length",),
    description=(
        "The number of elements of an Array or Range, characters of a String, or fields of a "
        "Record (alias `length`)."
    ),
    examples=[
        Example("[1, 2, 3] | len", 3),
        Example('"héllo" | length', 5),
        Example("{a: 1, b: 2} | len", 2),
        Example("range(0, 10, 3) | len", 4),
    ],
)
def len_(value: String | Array | Record | Range) -> Int:
    return len(value)


@builtin(
    "count",
    category="collections",
    description=(
        "How many elements satisfy the predicate; without a predicate, how many elements there are."
    ),
    examples=[
        Example("[1, 2, 3, 4] | count(fn(x) => x > 1)", 3),
        Example("[1, 2] | count", 2),
        Example("[] | count(fn(x) => true)", 0),
    ],
)
def count_(items: Array, predicate: Function | None = None) -> Int:
    if predicate is None:
        return len(items)
    n = 0
    for r in builtins.map(predicate, items):
        if r is True:
            n += 1
        elif r is not False:
            not_bool("count", r)
    return n


@builtin(
    "is_empty",
    category="collections",
    description="True for null, an empty String, Array, Range or Record.",
    examples=[
        Example("[] | is_empty", True),
        Example('"" | is_empty', True),
        Example("{a: 1} | is_empty", False),
        Example("null | is_empty", True),
    ],
)
def is_empty_(value: String | Array | Record | Range | None) -> Bool:
    if value is None:
        return True
    if type(value) is LazyList:
        return next(iter(value), MISSING) is MISSING
    return len(value) == 0


@builtin(
    "contains",
    category="collections",
    description=(
        "Membership: whether an Array or Range has an element equal to `needle` "
        "(structurally), a String contains `needle` as a substring, or a Record has the field "
        "`needle`."
    ),
    examples=[
        Example("[1, 2, 3] | contains(2)", True),
        Example('"conch shell" | contains("sh")', True),
        Example('{a: 1} | contains("b")', False),
        Example("[[1, 2], [3]] | contains([3])", True),
    ],
)
def contains_(haystack: Array | String | Record, needle: Any) -> Bool:
    t = type(haystack)
    if t is str:
        if type(needle) is not str:
            raise ConchError(
                "TypeError",
                f"contains: parameter 'needle' expects String when searching a String, "
                f"got {type_name(type(needle))}",
            )
        return needle in haystack
    if isinstance(haystack, dict):
        return needle in haystack if type(needle) is str else False
    return member(needle, haystack)


@builtin(
    "index_of",
    category="collections",
    description=(
        "The position of the first element equal to `value` (or of the first occurrence of a "
        "substring in a String), or -1 when absent."
    ),
    examples=[
        Example('["a", "b", "c"] | index_of("b")', 1),
        Example("[1, 2] | index_of(5)", -1),
        Example('"hello" | index_of("l")', 2),
    ],
)
def index_of_(items: Array | String, value: Any) -> Int:
    if type(items) is str:
        if type(value) is not str:
            raise ConchError(
                "TypeError",
                f"index_of: parameter 'value' expects String when searching a String, "
                f"got {type_name(type(value))}",
            )
        return items.find(value)
    for i, x in builtins.enumerate(items):
        if same(x, value):
            return i
    return -1


@builtin(
    "find",
    category="collections",
    description="The first element satisfying the predicate, or null when none does.",
    examples=[
        Example("[1, 5, 10] | find(fn(x) => x > 3)", 5),
        Example("[1, 2] | find(fn(x) => x > 3)", None),
        Example("[{id: 1}, {id: 2}] | find(fn(r) => r.id == 2)", {"id": 2}),
    ],
)
def find_(items: Array, predicate: Function) -> Any:
    for x in items:
        r = predicate(x)
        if r is True:
            return x
        if r is not False:
            not_bool("find", r)
    return None


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


@builtin(
    "default",
    category="collections",
    description="The value itself, or `fallback` when the value is null.",
    examples=[
        Example('null | default("none")', "none"),
        Example("0 | default(5)", 0),
    ],
)
def default_(value: Any, fallback: Any) -> Any:
    return fallback if value is None else value


def _is_blank(x: Any) -> Bool:
    if x is None:
        return True
    t = type(x)
    if t is str or t is list or t is dict or t is tuple or t is range:
        return len(x) == 0
    return False


@builtin(
    "compact",
    category="collections",
    description=(
        "Drop the null elements; with `empty=true` also empty Strings, Arrays and Records. "
        "Lazy on a range or lazy input."
    ),
    examples=[
        Example("[1, null, 2, null] | compact", [1, 2]),
        Example('[1, "", [], null, 0] | compact(empty=true)', [1, 0]),
    ],
)
def compact_(items: Array, empty: Bool = False) -> Array:
    if empty:
        return like_input(items, itertools.filterfalse(_is_blank, items))
    return like_input(items, (x for x in items if x is not None))


# -- building --------------------------------------------------------------------------


@builtin(
    "range",
    category="collections",
    description=(
        "The Integers from `start` up to (not including) `end`, by `step` (may be negative). "
        "With one argument, from 0 to it. Lazy: `range(0, 10**12) | take(2)` is instant."
    ),
    examples=[
        Example("range(1, 5)", [1, 2, 3, 4]),
        Example("range(3)", [0, 1, 2]),
        Example("range(10, 0, step=-3)", [10, 7, 4, 1]),
        Example("range(0, 10**12) | take(2)", [0, 1]),
    ],
)
def range_(start: Int, end: Int | None = None, step: Int = 1) -> Range:
    if step == 0:
        raise ConchError("ValueError", "range: 'step' must not be 0")
    if end is None:
        return range(0, start, step)
    return range(start, end, step)


@builtin(
    "append",
    category="collections",
    description="A new Array with `value` added at the end (as one element; see `concat`).",
    examples=[
        Example("[1, 2] | append(3)", [1, 2, 3]),
        Example("[1] | append([2, 3])", [1, [2, 3]]),
    ],
)
def append_(items: Array, value: Any) -> Array:
    if is_lazy(items):
        return LazyList(itertools.chain(items, (value,)))
    return [*items, value]


@builtin(
    "prepend",
    category="collections",
    description="A new Array with `value` added at the start (as one element).",
    examples=[Example("[2, 3] | prepend(1)", [1, 2, 3])],
)
def prepend_(items: Array, value: Any) -> Array:
    if is_lazy(items):
        return LazyList(itertools.chain((value,), items))
    return [value, *items]


@builtin(
    "concat",
    category="collections",
    description="The elements of every Array in order, as one Array. Lazy if any input is lazy.",
    examples=[
        Example("[1, 2] | concat([3], [4, 5])", [1, 2, 3, 4, 5]),
        Example("concat([], [1])", [1]),
        Example("range(0, 2) | concat(range(5, 7))", [0, 1, 5, 6]),
    ],
)
def concat_(items: Array, *others: Array) -> Array:
    if is_lazy(items) or builtins.any(builtins.map(is_lazy, others)):
        return LazyList(itertools.chain(items, *others))
    return list(itertools.chain(items, *others))


# -- Records and Tables ----------------------------------------------------------------


def path_segments(path: Any) -> list[Any]:
    """The parts of a path given as a dotted String, an Int or an Array of parts."""
    if type(path) is int:
        return [path]
    if type(path) is str:
        if path == "":
            return []
        out: list[Any] = []
        for part in path.split("."):
            digits = part[1:] if part.startswith("-") else part
            out.append(int(part) if digits.isdigit() else part)
        return out
    return as_list(path)


def get_path(value: Any, segments: list[Any]) -> Any:
    """What the path of ``segments`` leads to from ``value``, or ``MISSING``."""
    cur = value
    for seg in segments:
        if isinstance(cur, dict):
            name = seg if type(seg) is str else render(seg)
            if name not in cur:
                return MISSING
            cur = cur[name]
        elif isinstance(cur, ARRAYS) or type(cur) is str:
            if type(seg) is int:
                seq = cur if type(cur) is not LazyList else cur.materialize()
                if not -len(seq) <= seg < len(seq):
                    return MISSING
                cur = seq[seg]
            elif type(seg) is str and type(cur) is not str:
                rows = as_list(cur)
                if not builtins.all(isinstance(r, dict) and seg in r for r in rows):
                    return MISSING
                cur = [r[seg] for r in rows]
            else:
                return MISSING
        else:
            return MISSING
    return cur


@builtin(
    "get",
    category="collections",
    description=(
        'Follow a path of fields and indices: a dotted String like "a.b.0" (integer parts '
        "index Arrays, negative from the end), an Int, or an Array of parts. A field name on "
        "a Table gives that column. Returns `default` (null) when the path does not exist."
    ),
    examples=[
        Example('{a: {b: [10, 20]}} | get("a.b.1")', 20),
        Example('{a: 1} | get("x.y", default=0)', 0),
        Example('[{n: "a"}, {n: "b"}] | get("n")', ["a", "b"]),
        Example("[1, 2, 3] | get(-1)", 3),
    ],
)
def get_(value: Any, path: String | Int | Array, default: Any = None) -> Any:
    if type(path) is str and isinstance(value, dict) and path in value:
        return value[path]  # a field whose name contains a dot
    found = get_path(value, path_segments(path))
    return default if found is MISSING else found


def _columns(columns: tuple[Any, ...], who: str) -> list[str]:
    names: list[str] = []
    for c in columns:
        for name in as_list(c) if is_array(c) else (c,):
            if type(name) is not str:
                raise ConchError(
                    "TypeError",
                    f"{who}: parameter 'columns' expects String, got {type_name(type(name))}",
                )
            names.append(name)
    return names


def _select_row(row: Any, names: list[str], who: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ConchError("TypeError", f"{who}: expects Records, got {type_name(type(row))}")
    try:
        return {n: row[n] for n in names}
    except KeyError as exc:
        name = exc.args[0]
        raise ConchError(
            "KeyError", f"{who}: no field '{name}'", hint=did_you_mean(name, row)
        ) from None


@builtin(
    "select",
    category="collections",
    params={"columns": "String | Array"},
    description=(
        "Keep only the given fields of a Record, or columns of a Table, in the order given "
        "(names as separate arguments or one Array). A missing field is a KeyError."
    ),
    examples=[
        Example('{a: 1, b: 2, c: 3} | select("c", "a")', {"c": 3, "a": 1}),
        Example('[{n: "x", s: 1, t: 2}] | select(["n", "s"])', [{"n": "x", "s": 1}]),
    ],
)
def select_(value: Record | Array, *columns: String) -> Record | Array:
    names = _columns(columns, "select")
    if isinstance(value, dict):
        return _select_row(value, names, "select")
    return like_input(value, (_select_row(r, names, "select") for r in value))


def _reject_row(row: Any, names: set[str]) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ConchError("TypeError", f"reject: expects Records, got {type_name(type(row))}")
    return {k: v for k, v in row.items() if k not in names}


@builtin(
    "reject",
    category="collections",
    params={"columns": "String | Array"},
    description=(
        "Drop the given fields of a Record, or columns of a Table (missing ones are ignored)."
    ),
    examples=[
        Example('{a: 1, b: 2, c: 3} | reject("b")', {"a": 1, "c": 3}),
        Example('[{n: "x", s: 1}] | reject(["s", "zzz"])', [{"n": "x"}]),
    ],
)
def reject_(value: Record | Array, *columns: String) -> Record | Array:
    names = set(_columns(columns, "reject"))
    if isinstance(value, dict):
        return _reject_row(value, names)
    return like_input(value, (_reject_row(r, names) for r in value))


@builtin(
    "merge",
    category="collections",
    params={"others": "Record | Array"},
    description=(
        "Combine Records; fields of later ones win. On a Table, merge a Record into every "
        "row, or another Table row by row."
    ),
    examples=[
        Example("{a: 1, b: 2} | merge({b: 3, c: 4})", {"a": 1, "b": 3, "c": 4}),
        Example("[{a: 1}, {a: 2}] | merge({b: 0})", [{"a": 1, "b": 0}, {"a": 2, "b": 0}]),
        Example("[{a: 1}, {a: 2}] | merge([{b: 5}, {b: 6}])", [{"a": 1, "b": 5}, {"a": 2, "b": 6}]),
    ],
)
def merge_(value: Record | Array, *others: Record | Array) -> Record | Array:
    if isinstance(value, dict):
        out = dict(value)
        for other in others:
            if not isinstance(other, dict):
                raise ConchError(
                    "TypeError",
                    f"merge: parameter 'others' expects Record when merging a Record, "
                    f"got {type_name(type(other))}",
                )
            out.update(other)
        return out
    rows: Any = value
    for other in others:
        if isinstance(other, dict):
            rows = [{**r, **other} for r in _records(rows, "merge")]
        else:
            rows = [
                {**a, **b}
                for a, b in builtins.zip(
                    _records(rows, "merge"), _records(other, "merge"), strict=False
                )
            ]
    return as_list(rows) if not others else rows


def _records(rows: Any, who: str) -> Iterator[dict[str, Any]]:
    for r in rows:
        if not isinstance(r, dict):
            raise ConchError("TypeError", f"{who}: expects Records, got {type_name(type(r))}")
        yield r


def _index_in(who: str, seq: list[Any], index: int, allow_end: bool) -> int:
    n = len(seq)
    pos = index + n if index < 0 else index
    if not 0 <= pos < n + (1 if allow_end else 0):
        raise ConchError("IndexError", f"{who}: index {index} out of range for {n} elements")
    return pos


@builtin(
    "insert",
    category="collections",
    params={"key": "String | Int"},
    description=(
        "Add a field to a Record (a ValueError if it exists: use `update`), or a column to "
        "every row of a Table; a function value is called with the row. On an Array, with an "
        "Int key, insert the value at that index."
    ),
    examples=[
        Example('{a: 1} | insert("b", 2)', {"a": 1, "b": 2}),
        Example(
            '[{a: 1}, {a: 2}] | insert("b", fn(r) => r.a * 10)',
            [{"a": 1, "b": 10}, {"a": 2, "b": 20}],
        ),
        Example("[1, 3] | insert(1, 2)", [1, 2, 3]),
    ],
)
def insert_(target: Record | Array, key: String | Int, value: Any) -> Record | Array:
    return _edit("insert", target, key, value, _insert_row, _insert_at)


def _edit(
    who: str,
    target: Any,
    key: Any,
    value: Any,
    edit_row: Callable[[dict[str, Any], str, Any], dict[str, Any]],
    edit_at: Callable[[list[Any], int, Any], None],
) -> Any:
    """What ``insert`` and ``update`` share: a Record is edited by field, an Array with an
    Int key at that index, a Table row by row (a new value each time: inputs are never
    mutated)."""
    if isinstance(target, dict):
        if type(key) is not str:
            raise ConchError("TypeError", f"{who}: parameter 'key' expects String for a Record")
        return edit_row(target, key, value)
    if type(key) is int:
        seq = list(target)
        edit_at(seq, key, value)
        return seq
    return like_input(target, (edit_row(r, key, value) for r in _records(target, who)))


def _insert_at(seq: list[Any], index: int, value: Any) -> None:
    seq.insert(_index_in("insert", seq, index, allow_end=True), value)


def _insert_row(row: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    if key in row:
        raise ConchError(
            "ValueError", f"insert: field '{key}' already exists", hint="use update to change it"
        )
    out = dict(row)
    out[key] = value(row) if callable(value) else value
    return out


@builtin(
    "update",
    category="collections",
    params={"key": "String | Int"},
    description=(
        "Replace an existing field of a Record (a KeyError if missing: use `insert`), or of "
        "every row of a Table; a function value is called with the current field value. On an "
        "Array, with an Int key, replace the element at that index."
    ),
    examples=[
        Example('{a: 1, b: 2} | update("a", 5)', {"a": 5, "b": 2}),
        Example('[{s: 1}, {s: 2}] | update("s", fn(v) => v * 100)', [{"s": 100}, {"s": 200}]),
        Example("[1, 2, 3] | update(-1, 30)", [1, 2, 30]),
    ],
)
def update_(target: Record | Array, key: String | Int, value: Any) -> Record | Array:
    return _edit("update", target, key, value, _update_row, _update_at)


def _update_at(seq: list[Any], index: int, value: Any) -> None:
    pos = _index_in("update", seq, index, allow_end=False)
    seq[pos] = value(seq[pos]) if callable(value) else value


def _update_row(row: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    if key not in row:
        raise ConchError(
            "KeyError",
            f"update: no field '{key}'",
            hint=did_you_mean(key, row) or "use insert to add a field",
        )
    out = dict(row)
    out[key] = value(row[key]) if callable(value) else value
    return out


@builtin(
    "keys",
    category="collections",
    description="The field names of a Record, or the column names of a Table.",
    examples=[
        Example("{b: 1, a: 2} | keys", ["b", "a"]),
        Example("[{x: 1, y: 2}] | keys", ["x", "y"]),
        Example("{} | keys", []),
    ],
)
def keys_(value: Record | Array) -> Array:
    if isinstance(value, dict):
        return list(value)
    rows = as_list(value)
    if not rows:
        return []
    first = rows[0]
    if not isinstance(first, dict):
        raise ConchError(
            "TypeError",
            f"keys: expects a Record or a Table, got an Array of {type_name(type(first))}",
        )
    return list(first)


@builtin(
    "values",
    category="collections",
    description="The field values of a Record, or the columns of a Table as Arrays.",
    examples=[
        Example("{b: 1, a: 2} | values", [1, 2]),
        Example("[{x: 1, y: 2}, {x: 3, y: 4}] | values", [[1, 3], [2, 4]]),
    ],
)
def values_(value: Record | Array) -> Array:
    if isinstance(value, dict):
        return list(value.values())
    rows = list(_records(value, "values"))
    return [[r.get(k) for r in rows] for k in keys_(rows)]


@builtin(
    "entries",
    category="collections",
    description="The fields of a Record as `{key, value}` Records, in order.",
    examples=[
        Example("{a: 1, b: 2} | entries", [{"key": "a", "value": 1}, {"key": "b", "value": 2}]),
        Example("{} | entries", []),
    ],
)
def entries_(value: Record) -> Array:
    return [{"key": k, "value": v} for k, v in value.items()]


@builtin(
    "from_entries",
    category="collections",
    description=(
        "Build a Record from `{key, value}` Records or `[key, value]` pairs (the inverse of "
        "`entries`); non-String keys are stringified, later duplicates win."
    ),
    examples=[
        Example('[{key: "a", value: 1}] | from_entries', {"a": 1}),
        Example('[["x", 1], ["y", 2]] | from_entries', {"x": 1, "y": 2}),
        Example("{a: 1, b: 2} | entries | from_entries", {"a": 1, "b": 2}),
    ],
)
def from_entries_(items: Array) -> Record:
    out: dict[str, Any] = {}
    for i, e in builtins.enumerate(items):
        if isinstance(e, dict) and "key" in e and "value" in e:
            k, v = e["key"], e["value"]
        elif isinstance(e, ARRAYS) and len(e) == 2:
            k, v = e[0], e[1]
        else:
            raise ConchError(
                "TypeError",
                f"from_entries: element {i} is not a {{key, value}} Record or a [key, value] pair",
            )
        out[k if type(k) is str else render(k)] = v
    return out


@builtin(
    "transpose",
    category="collections",
    description=(
        "Swap rows and columns: an Array of equal-length Arrays becomes its transpose; a "
        "Table becomes a Record of column Arrays; a Record of equal-length Arrays becomes a "
        "Table."
    ),
    examples=[
        Example("[[1, 2, 3], [4, 5, 6]] | transpose", [[1, 4], [2, 5], [3, 6]]),
        Example("[{a: 1, b: 2}, {a: 3, b: 4}] | transpose", {"a": [1, 3], "b": [2, 4]}),
        Example("{a: [1, 3], b: [2, 4]} | transpose", [{"a": 1, "b": 2}, {"a": 3, "b": 4}]),
    ],
)
def transpose_(value: Array | Record) -> Array | Record:
    if isinstance(value, dict):
        cols = {k: as_list(v) if is_array(v) else None for k, v in value.items()}
        bad = [k for k, v in cols.items() if v is None]
        if bad:
            raise ConchError("TypeError", f"transpose: field '{bad[0]}' is not an Array")
        lengths = {len(v) for v in cols.values() if v is not None}
        if len(lengths) > 1:
            raise ConchError("ValueError", "transpose: the columns have different lengths")
        n = lengths.pop() if lengths else 0
        return [{k: v[i] for k, v in cols.items() if v is not None} for i in range(n)]
    rows = as_list(value)
    if not rows:
        return []
    if builtins.all(isinstance(r, dict) for r in rows):
        return {k: [r.get(k) for r in rows] for k in rows[0]}
    if not builtins.all(isinstance(r, ARRAYS) for r in rows):
        raise ConchError(
            "TypeError", "transpose: expects an Array of Arrays, a Table or a Record of Arrays"
        )
    seqs = [as_list(r) for r in rows]
    if len({len(s) for s in seqs}) > 1:
        raise ConchError("ValueError", "transpose: the rows have different lengths")
    return [list(col) for col in builtins.zip(*seqs, strict=True)]
