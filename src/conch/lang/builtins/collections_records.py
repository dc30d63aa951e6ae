"""Collection builtins over Records and Tables (Arrays of Records): following a path
(``get``), fields and columns (``keys``, ``values``, ``entries``, ``from_entries``,
``select``, ``reject``), editing (``merge``, ``insert``, ``update``) and ``transpose``.

Category ``collections``: the category's conventions are in :mod:`.collections`, which also
follows dotted paths for the keys of ``sort_by`` and the like (``get_path``).
"""

from __future__ import annotations

import builtins

from conch.lang.builtins.collections import (
    ARRAYS,
    MISSING,
    get_path,
    like_input,
    path_segments,
    type_name,
)
from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Array, Int, Record, String
from conch.lang.errors import ConchError, did_you_mean
from conch.lang.values import as_list, is_array, render

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any


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
