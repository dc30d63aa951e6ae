"""Runtime values of conch and their type names.

Conch values are plain Python objects so that compiled code and builtins run at Python speed:

=========  ==========================================================
conch      Python
=========  ==========================================================
Null       ``None``
Bool       ``bool``
Int        ``int``
Float      ``float``
String     ``str``
Array      ``list`` (also :class:`LazyList`, produced lazily by pipelines)
Table      ``list`` of ``dict`` that all share the same keys in the same order
Record     ``dict`` with ``str`` keys
Range      ``range`` (lazy; behaves as an Array of Int)
Function   any Python callable (compiled lambdas, named functions, builtins)
Error      :class:`ErrorValue`
=========  ==========================================================
"""

from __future__ import annotations

import itertools
import math

from conch.lang import context as _context
from conch.lang.errors import ConchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

TYPE_NAMES = (
    "Null",
    "Bool",
    "Int",
    "Float",
    "String",
    "Array",
    "Table",
    "Record",
    "Range",
    "Function",
    "Error",
)


class LazyList:
    """An Array whose elements are produced on demand and remembered.

    Pipelines over ranges and other lazy inputs return these, so that
    ``range(0, 10**9) | map(f) | take(5)`` computes five elements, and a server can stream
    elements as they are produced. Iterating twice replays the cache and continues the source,
    so a LazyList bound to a variable behaves like an ordinary Array.
    """

    __slots__ = ("_cache", "_source")

    def __init__(self, source: Iterable[Any]) -> None:
        # A tee kept at the start and never advanced: each iteration walks a copy of it, so
        # elements are produced once, remembered in the tee's shared buffer, and replayed at
        # C speed (a Python-level caching generator cost a pipeline stage ~2x).
        self._source: Iterator[Any] | None = itertools.tee(iter(source), 1)[0]
        self._cache: list[Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        if self._cache is not None:
            return iter(self._cache)
        return self._source.__copy__()  # type: ignore[union-attr]

    def materialize(self) -> list[Any]:
        """All elements as a list (consumes the source)."""
        if self._cache is None:
            self._cache = bounded_list(self._source.__copy__())  # type: ignore[union-attr]
            self._source = None
        return self._cache

    def __len__(self) -> int:
        return len(self.materialize())

    def __getitem__(self, index: Any) -> Any:
        return self.materialize()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyList):
            other = other.materialize()
        if isinstance(other, list | range):
            return self.materialize() == list(other)
        return NotImplemented

    def __hash__(self) -> int:  # pragma: no cover - lists are unhashable too
        raise TypeError("unhashable type: 'Array'")

    def __repr__(self) -> str:
        return f"LazyList({self._cache!r})" if self._cache is not None else "LazyList(...)"


class ErrorValue(dict):  # type: ignore[type-arg]
    """A caught error: a Record with ``kind``, ``message``, ``line``, ``column``, ``hint``.

    It is a dict so that field access, ``keys`` and JSON rendering work as for Records;
    ``type_of`` tells it apart.
    """

    @classmethod
    def from_error(cls, err: ConchError) -> ErrorValue:
        value = cls(err.to_dict())
        if err.value is not None:
            value["value"] = err.value
        return value


ARRAY_TYPES = (list, range, LazyList, tuple)


def as_list(value: Any) -> list[Any]:
    """The elements of an Array-like value as a list (no copy for lists)."""
    if type(value) is list:
        return value
    if isinstance(value, LazyList):
        return value.materialize()
    if type(value) is range:
        check_size(len(value))
    return list(value)


def check_size(n: int, what: str = "Array") -> None:
    """Refuse to build ``what`` (an Array, or a String counted in characters) of ``n``
    elements beyond the run's collection limit."""
    limit = _context.current().limits.collection_size
    if limit is not None and n > limit:
        raise size_error(limit, n, what)


def size_error(limit: int, n: int | None = None, what: str = "Array") -> ConchError:
    unit = "characters" if what == "String" else "elements"
    size = f": a {what} of {n} {unit}" if n is not None else ""
    return ConchError("LimitError", f"collection size limit of {limit} exceeded{size}",
                      hint="work on the elements lazily (take, where) or raise the limit")


def bounded_list(items: Iterable[Any]) -> list[Any]:
    """``list(items)``, stopping with a LimitError past the run's collection limit."""
    limit = _context.current().limits.collection_size
    if limit is None:
        return list(items)
    out = list(itertools.islice(items, limit + 1))
    if len(out) > limit:
        raise size_error(limit)
    return out


def equal(a: Any, b: Any) -> bool:
    """Conch ``==``: structural, numbers by value (``1 == 1.0``), a Bool equal only to a Bool
    at any depth (Python's ``True == 1`` must not leak into ``==``, ``in`` or ``contains``),
    and any two Arrays (list, Range, lazy) equal when their elements are."""
    if a is b:
        return True
    ta = type(a)
    tb = type(b)
    if ta is tb:
        if ta is list or ta is tuple:
            return len(a) == len(b) and all(map(equal, a, b))
        if ta is dict or ta is ErrorValue:
            return len(a) == len(b) and all(k in b and equal(v, b[k]) for k, v in a.items())
        if ta is LazyList:
            return equal(a.materialize(), b.materialize())
        return bool(a == b)
    if ta is bool or tb is bool:
        return False
    if (ta is int or ta is float) and (tb is int or tb is float):
        return bool(a == b)
    if isinstance(a, ARRAY_TYPES) and isinstance(b, ARRAY_TYPES):
        return equal(as_list(a), as_list(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return equal(dict(a), dict(b))
    return bool(a == b)


def member(item: Any, items: Iterable[Any]) -> bool:
    """Whether an Array holds an element ``equal`` to ``item``."""
    t = type(item)
    if type(items) is range:
        return (t is int or t is float) and item in items
    if t is str or item is None:
        return item in items  # type: ignore[operator]
    if t is int or t is float:
        if item != 0 and item != 1:
            # only 0 and 1 are equal to a Bool in Python: its C-speed ``in`` is exact here
            return item in items  # type: ignore[operator]
        return any(x == item and x is not True and x is not False for x in items)
    if t is bool:
        return any(x is item for x in items)
    return any(equal(x, item) for x in items)


def is_array(value: Any) -> bool:
    return isinstance(value, ARRAY_TYPES)


def is_table(value: Any) -> bool:
    """A non-empty list of Records that all have the same keys in the same order."""
    if isinstance(value, LazyList):
        value = value.materialize()
    if type(value) is not list or not value:
        return False
    first = value[0]
    if type(first) is not dict:
        return False
    keys = list(first)
    for row in value:
        if type(row) is not dict or len(row) != len(keys) or list(row) != keys:
            return False
    return True


def type_of(value: Any) -> str:
    """The conch type name of a value (docs/language.md)."""
    if value is None:
        return "Null"
    t = type(value)
    if t is bool:
        return "Bool"
    if t is int:
        return "Int"
    if t is float:
        return "Float"
    if t is str:
        return "String"
    if t is dict:
        return "Record"
    if t is ErrorValue:
        return "Error"
    if t is range:
        return "Range"
    if t is list or t is LazyList or t is tuple:
        return "Table" if is_table(value) else "Array"
    if callable(value):
        return "Function"
    for base, name in _BASE_TYPES:  # subclasses, from Python code (a str enum, ...)
        if isinstance(value, base):
            return name
    return "String"  # unreachable for values produced by conch itself


_BASE_TYPES = ((int, "Int"), (float, "Float"), (str, "String"), (dict, "Record"))


def describe(value: Any) -> str:
    """The full type of a value, e.g. ``Table<name: String, size: Int>`` or ``Array<Int>``."""
    name = type_of(value)
    if name == "Table":
        rows = as_list(value)
        cols = ", ".join(f"{k}: {_column_type(rows, k)}" for k in rows[0])
        return f"Table<{cols}>"
    if name == "Array":
        items = as_list(value)
        if not items:
            return "Array"
        kinds = {describe(v) for v in items}
        return f"Array<{kinds.pop()}>" if len(kinds) == 1 else "Array<Any>"
    if name == "Range":
        return "Range<Int>"
    if name == "Record":
        fields = ", ".join(f"{k}: {describe(v)}" for k, v in value.items())
        return f"Record<{fields}>"
    return name


def _column_type(rows: list[dict[str, Any]], key: str) -> str:
    kinds = {describe(row[key]) for row in rows}
    return kinds.pop() if len(kinds) == 1 else "Any"


def to_json_value(value: Any) -> Any:
    """The value as plain JSON data (lists, dicts, str, numbers, bool, None).

    Ranges and lazy arrays are materialised; functions become their name; non-finite floats
    become the strings ``"Infinity"``, ``"-Infinity"`` and ``"NaN"`` (docs/language.md).
    """
    if value is None or value is True or value is False:
        return value
    t = type(value)
    if t is int or t is str:
        return value
    if t is float:
        if math.isfinite(value):
            return value
        if math.isnan(value):
            return "NaN"
        return "Infinity" if value > 0 else "-Infinity"
    if t is dict or t is ErrorValue:
        return {str(k): to_json_value(v) for k, v in value.items()}
    if t is list or t is tuple or t is range or t is LazyList:
        return [to_json_value(v) for v in value]
    if callable(value):
        return f"<function {function_name(value)}>"
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, int | str | float):
        return to_json_value(t.__mro__[1](value) if not isinstance(value, bool) else value)
    return str(value)


def function_name(fn: Callable[..., Any]) -> str:
    # a compiled function's Python name is its conch name, or that and a $ suffix
    return str(getattr(fn, "conch_name", None) or getattr(fn, "__name__", "lambda")).split("$")[0] or "lambda"


def render(value: Any) -> str:
    """The string rendering of a value: a String as its raw text, anything else compact JSON."""
    t = type(value)
    if t is str:
        return value
    # scalars without the json module (its import is felt by a one-line ``conch -c``)
    if t is int:
        return str(value)
    if value is None:
        return "null"
    if t is bool:
        return "true" if value else "false"
    return _compact_json(to_json_value(value))


def _not_serializable(o: Any) -> Any:
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


def _compact_json(data: Any) -> str:
    """``json.dumps(data, ensure_ascii=False, separators=(",", ":"))``, by the C encoder that
    json.dumps itself uses: importing json (which imports re) would add ~4 ms to every
    ``conch -c`` whose result is an Array or a Record."""
    try:
        from _json import encode_basestring, make_encoder
    except ImportError:  # a Python without the accelerator
        import json

        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    if type(data) is str:
        return str(encode_basestring(data))
    # a fresh markers dict per call, as json.dumps does (check_circular)
    encode = make_encoder({}, _not_serializable, encode_basestring, None, ":", ",", False, False, True)
    return "".join(encode(data, 0))


def render_pretty(value: Any) -> str:
    """A readable multi-line rendering for people (the REPL uses rich tables for Tables)."""
    if type(value) is str:
        return value
    import json

    return json.dumps(to_json_value(value), ensure_ascii=False, indent=2)
