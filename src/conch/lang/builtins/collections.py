"""Collection builtins: the category's conventions and the helpers its modules share, with
the builtins that measure, search and build Arrays (``len``, ``count``, ``is_empty``,
``contains``, ``index_of``, ``find``, ``default``, ``compact``, ``range``, ``append``,
``prepend``, ``concat``).

The category's other builtins are in a module per job: ``collections_transform`` (``map``,
``where``, ``reduce``, ...), ``collections_slice`` (``first``, ``take``, ``slice``, ...),
``collections_order`` (``sort``, ``uniq``, ``min_by``, ...), ``collections_reshape``
(``group_by``, ``chunk``, ``zip``, ...) and ``collections_records`` (Records and Tables:
``get``, ``select``, ``merge``, ...). ``_index.py`` says which module defines a name.

Note for the strings category: ``contains`` is registered here once for both Arrays
(membership) and Strings (substring), since a builtin name can be registered only once.

Conventions shared by the collection modules and :mod:`.math`:

- Every Array parameter accepts ``list``, ``tuple``, ``range``, ``LazyList`` and Tables.
- Lazy rule: on a lazy input (``range`` or ``LazyList``) the element-wise builtins return a
  ``LazyList`` over a generator (a ``range`` when slicing a ``range``, which is as lazy and
  O(1)); on a ``list`` they return a ``list``. Inputs are never mutated.
- Selectors (``first``, ``last``, ``find``, ``min_by``, ``max_by``) return ``null`` on an
  empty input; statistics (``avg``, ``min``, ...) raise ``ValueError``.
- Ordering follows docs/language.md: numbers numerically, strings lexicographically, booleans
  ``false < true``, arrays element-wise; other mixes are a ``TypeError``. ``sort`` and
  ``sort_by`` are stable (also with ``desc=true``) and put ``null`` last.
"""

from __future__ import annotations

import builtins
import itertools

from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Array, Bool, Function, Int, Range, Record, String
from conch.lang.errors import ConchError, did_you_mean
from conch.lang.values import (
    ErrorValue,
    LazyList,
    as_list,
    bounded_list,
    equal,
    member,
    render,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from operator import itemgetter
    from typing import Any
else:
    # The C implementations the pure-Python modules re-export: importing collections,
    # functools, operator and typing would cost milliseconds on every start of a program that
    # names a builtin.
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
    """Raise a TypeError unless values of these types can be ordered together (docs/language.md)."""
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


def not_bool(who: str, result: Any) -> bool:
    """Reject a non-Bool predicate result: conch has no truthiness (``if 0`` is an error too)."""
    raise ConchError(
        "TypeError",
        f"{who}: the predicate must return a Bool, got {type_name(type(result))}",
        hint="compare explicitly, e.g. fn(x) => x != null or fn(x) => len(x) > 0",
    )


def empty_reduce() -> None:
    """The error of ``reduce`` over nothing without an initial value (fused code raises it too)."""
    raise ConchError(
        "ValueError",
        "reduce: empty input and no initial value",
        hint="pass an initial value: reduce(fn(acc, x) => ..., 0)",
    )


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


# -- paths (``get``, dotted keys) ------------------------------------------------------


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
