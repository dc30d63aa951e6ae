"""Data builtins: JSON, CSV, YAML and TOML in and out, conversions, types, hashing, base64.

Decoders return plain conch values: dates and times that YAML and TOML know about come back
as ISO-8601 strings, since conch has no date type. Every failure is a ValueError that says
what was wrong and where (line and column when the format reports them).

The codec modules (and json, re and datetime) are imported where used: a program that names
one builtin of this module should not pay milliseconds of start-up for the others.
"""

from __future__ import annotations

import math

from conch.lang import values
from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Bool, Float, Int, Record, String, Table
from conch.lang.errors import ConchError, did_you_mean

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from typing import Any


def _value_error(message: str, hint: str | None = None) -> ConchError:
    return ConchError("ValueError", message, hint=hint)


def _plain(value: Any, fmt: str, path: str = "") -> Any:
    """The value as plain data for an encoder: arrays materialised, floats kept as floats.

    Functions cannot be encoded; ``fmt`` and ``path`` make the error point at the culprit.
    """
    t = type(value)
    if value is None or t is bool or t is int or t is float or t is str:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v, fmt, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if values.is_array(value):
        return [_plain(v, fmt, f"{path}[{i}]") for i, v in enumerate(value)]
    where = f" (at {path})" if path else ""
    raise ConchError("TypeError", f"to_{fmt}: cannot encode a {values.type_of(value)}{where}")


def _from_decoded(value: Any) -> Any:
    """Decoded YAML/TOML data as conch values (dates become ISO-8601 strings)."""
    import datetime as _dt

    if isinstance(value, dict):
        return {str(k): _from_decoded(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_from_decoded(v) for v in value]
    if isinstance(value, _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        import base64

        return base64.b64encode(value).decode("ascii")
    return value


# -- JSON ---------------------------------------------------------------------------------


@builtin(
    "to_json",
    category="data",
    description="Encode a value as JSON text: compact by default, indented by `indent` spaces "
    "when given. Non-ASCII text is kept as is; non-finite floats become the strings "
    '"Infinity", "-Infinity" and "NaN" (as everywhere in conch).',
    examples=[
        Example("to_json({a: 1, b: [true, null]})", '{"a":1,"b":[true,null]}'),
        Example("to_json([1, 2], indent=2)", "[\n  1,\n  2\n]"),
        Example('to_json("héllo")', '"héllo"'),
    ],
)
def to_json(value: Any, indent: Int | None = None) -> String:
    import json

    data = _plain(value, "json")
    data = values.to_json_value(data)
    if indent is None:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    if indent < 0:
        raise _value_error(f"to_json: indent must not be negative, got {indent}")
    return json.dumps(data, ensure_ascii=False, indent=indent)


@builtin(
    "from_json",
    category="data",
    description="Decode JSON text into conch values (objects become Records, arrays Arrays).",
    examples=[
        Example('from_json("{\\"a\\": [1, 2.5, null]}")', {"a": [1, 2.5, None]}),
        Example("from_json('\"ok\"')", "ok"),
    ],
)
def from_json(text: String) -> Any:
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _value_error(
            f"from_json: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise _value_error("from_json: JSON nested too deeply") from None


# -- CSV ----------------------------------------------------------------------------------


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    return value if type(value) is str else values.render(value)


@builtin(
    "to_csv",
    category="data",
    description="Encode a Table (an array of Records) as CSV text with a header row; columns "
    "are the keys in first-seen order, a missing field or null is an empty cell, nested "
    "values are written as JSON. An array of arrays is written as rows without a header. "
    "Every row ends with a newline.",
    examples=[
        Example('to_csv([{name: "a", n: 1}, {name: "b, c", n: 2}])', 'name,n\na,1\n"b, c",2\n'),
        Example("to_csv([[1, 2], [3, null]])", "1,2\n3,\n"),
        Example("to_csv([])", ""),
    ],
)
def to_csv(table: Table, separator: String = ",") -> String:
    if len(separator) != 1:
        raise _value_error(f"to_csv: separator must be one character, got {separator!r}")
    import csv
    import io

    rows = values.as_list(table)
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter=separator, lineterminator="\n")
    if not rows:
        return ""
    if all(isinstance(r, dict) for r in rows):
        columns: dict[str, None] = {}
        for r in rows:
            for k in r:
                columns.setdefault(k, None)
        header = list(columns)
        writer.writerow(header)
        for r in rows:
            writer.writerow([_csv_cell(r.get(k)) for k in header])
    elif all(values.is_array(r) for r in rows):
        for r in rows:
            writer.writerow([_csv_cell(v) for v in r])
    else:
        bad = next(r for r in rows if not isinstance(r, dict))
        raise ConchError(
            "TypeError",
            f"to_csv: parameter 'table' expects an array of Records (or of arrays), "
            f"found a {values.type_of(bad)} row",
        )
    return buf.getvalue()


# set by from_csv before inferring cells (re's cache makes that cheap after the first time)
_CSV_INT: re.Pattern[str]
_CSV_FLOAT: re.Pattern[str]


def _compile_csv_patterns() -> None:
    global _CSV_INT, _CSV_FLOAT
    import re

    _CSV_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
    _CSV_FLOAT = re.compile(
        r"[-+]?(?:0|[1-9][0-9]*)(?:\.[0-9]+(?:[eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+)|[-+]?0?\.[0-9]+"
    )


def _infer(cell: str) -> Any:
    if cell == "":
        return None
    first = cell[0]
    if first.isdigit() or first in "-+.":
        if _CSV_INT.fullmatch(cell):
            return int(cell)
        if _CSV_FLOAT.fullmatch(cell):
            return float(cell)
        return cell
    if cell == "true":
        return True
    if cell == "false":
        return False
    return cell


@builtin(
    "from_csv",
    category="data",
    description="Decode CSV text into a Table. The first row is the header (with "
    "`header=false` the columns are named column0, column1, ...). With `infer=true` "
    "(default) cells that are plain decimal numbers become Int or Float, `true`/`false` "
    "become Bool and empty cells null; numbers with leading zeros (`007`) stay strings so "
    "that codes are not damaged. Short rows are padded with null; a row longer than the "
    "header is a ValueError.",
    examples=[
        Example(
            'from_csv("name,n\\na,1\\nb,2.5\\n")', [{"name": "a", "n": 1}, {"name": "b", "n": 2.5}]
        ),
        Example('from_csv("a,b\\n007,\\n", infer=false)', [{"a": "007", "b": ""}]),
        Example('from_csv("x;y\\n1;true", separator=";")', [{"x": 1, "y": True}]),
        Example(
            'from_csv("1,2\\n3,4", header=false)',
            [{"column0": 1, "column1": 2}, {"column0": 3, "column1": 4}],
        ),
    ],
)
def from_csv(
    text: String, header: Bool = True, infer: Bool = True, separator: String = ","
) -> Table:
    if len(separator) != 1:
        raise _value_error(f"from_csv: separator must be one character, got {separator!r}")
    import csv
    import io

    reader = csv.reader(io.StringIO(text), delimiter=separator, strict=True)
    try:
        rows = [r for r in reader if r]
    except csv.Error as exc:
        raise _value_error(f"from_csv: invalid CSV at line {reader.line_num}: {exc}") from None
    if not rows:
        return []
    if header:
        names = [name if name else f"column{i}" for i, name in enumerate(rows[0])]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise _value_error(f"from_csv: duplicate column {dup!r} in the header")
        body = rows[1:]
    else:
        width = max(len(r) for r in rows)
        names = [f"column{i}" for i in range(width)]
        body = rows
    if infer:
        _compile_csv_patterns()
    convert = _infer if infer else None
    width = len(names)
    out: list[dict[str, Any]] = []
    for number, row in enumerate(body, start=2 if header else 1):
        if len(row) > width:
            raise _value_error(
                f"from_csv: row {number} has {len(row)} fields but the header has {width}"
            )
        cells: list[Any] = [convert(c) for c in row] if convert else list(row)
        if len(cells) < width:
            cells.extend([None] * (width - len(cells)))
        out.append(dict(zip(names, cells, strict=True)))
    return out


# -- YAML and TOML ------------------------------------------------------------------------


@builtin(
    "to_yaml",
    category="data",
    description="Encode a value as YAML text (block style, keys in insertion order, Unicode kept).",
    examples=[
        Example('to_yaml({name: "conch", tags: ["a", "b"]})', "name: conch\ntags:\n- a\n- b\n"),
        Example("to_yaml([1, null])", "- 1\n- null\n"),
    ],
)
def to_yaml(value: Any) -> String:
    import yaml

    data = _plain(value, "yaml")
    return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False))


@builtin(
    "from_yaml",
    category="data",
    description="Decode YAML text (one document, safe loader: no arbitrary objects). Dates and "
    "timestamps become ISO-8601 strings.",
    examples=[
        Example(
            'from_yaml("name: conch\\nn: 3\\nok: true")', {"name": "conch", "n": 3, "ok": True}
        ),
        Example('from_yaml("- 1\\n- day: 2024-05-01")', [1, {"day": "2024-05-01"}]),
    ],
)
def from_yaml(text: String) -> Any:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise _value_error(f"from_yaml: invalid YAML{where}: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise _value_error(f"from_yaml: invalid YAML: {exc}") from None
    return _from_decoded(data)


def _check_toml(value: Any, path: str) -> None:
    if value is None:
        raise _value_error(
            f"to_toml: TOML cannot represent null (at {path})",
            hint="remove the field or use a default",
        )
    if isinstance(value, dict):
        for k, v in value.items():
            _check_toml(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_toml(v, f"{path}[{i}]")


@builtin(
    "to_toml",
    category="data",
    description="Encode a Record as TOML text (nested Records become tables). TOML has no null: "
    "a null anywhere is a ValueError naming its path.",
    examples=[
        Example(
            'to_toml({name: "conch", server: {port: 3000}})',
            'name = "conch"\n\n[server]\nport = 3000\n',
        ),
        Example("to_toml({xs: [1, 2]})", "xs = [\n    1,\n    2,\n]\n"),
    ],
)
def to_toml(value: Record) -> String:
    import tomli_w

    data = _plain(value, "toml")
    _check_toml(data, "")
    return tomli_w.dumps(data)


@builtin(
    "from_toml",
    category="data",
    description="Decode TOML text into a Record. Dates and times become ISO-8601 strings.",
    examples=[
        Example(
            'from_toml("title = \\"x\\"\\n[owner]\\nage = 3")', {"title": "x", "owner": {"age": 3}}
        ),
        Example('from_toml("when = 2024-05-01T10:00:00Z")', {"when": "2024-05-01T10:00:00+00:00"}),
    ],
)
def from_toml(text: String) -> Record:
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _value_error(f"from_toml: invalid TOML: {exc}") from None
    return dict(_from_decoded(data))


# -- conversions --------------------------------------------------------------------------


_DIGITS_OF_PREFIXED = frozenset("0123456789abcdefABCDEF_")


def _prefixed(text: str) -> bool:
    """Whether ``text`` is a 0x/0o/0b literal (regex ``\\s*[-+]?0[xXoObB][0-9a-fA-F_]+\\s*``),
    without importing re: ``int("42")`` is common in short programs."""
    t = text.strip()
    if t[:1] in ("-", "+"):
        t = t[1:]
    return len(t) > 2 and t[0] == "0" and t[1] in "xXoObB" and _DIGITS_OF_PREFIXED.issuperset(t[2:])


@builtin(
    "int",
    category="data",
    description="Convert to Int: a String holding a decimal integer (or a 0x/0o/0b literal), a "
    'Float truncated toward zero, a Bool as 0 or 1. Anything else fails: `int("abc")` and '
    '`int("1.5")` are ValueErrors, `int(null)` a TypeError.',
    examples=[
        Example('int("42")', 42),
        Example("int(-3.9)", -3),
        Example('int(" 0x1f ")', 31),
        Example("int(true)", 1),
    ],
)
def int_(value: String | Int | Float | Bool) -> Int:
    if isinstance(value, bool):
        return 1 if value else 0
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _value_error(f"int: cannot convert {values.render(value)} to Int")
        return int(value)
    try:
        return int(value, 0 if _prefixed(value) else 10)
    except ValueError:
        hint = "round it first: int(round(float(x)))" if _looks_float(value) else None
        raise _value_error(f"int: {value!r} is not an integer", hint=hint) from None


def _looks_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@builtin(
    "float",
    category="data",
    description='Convert to Float: a String holding a number (`"1.5"`, `"1e3"`, `"inf"`), '
    'an Int, a Bool as 0.0 or 1.0. `float("abc")` is a ValueError.',
    examples=[
        Example('float("1.5")', 1.5),
        Example("float(2)", 2.0),
        Example('float("1e3")', 1000.0),
    ],
)
def float_(value: String | Int | Float | Bool) -> Float:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise _value_error(f"float: {value!r} is not a number") from None
    try:
        return float(value)
    except OverflowError:
        raise _value_error("float: integer too large for a Float") from None


_TRUE = frozenset({"true", "yes", "on", "1", "y"})
_FALSE = frozenset({"false", "no", "off", "0", "n", ""})


@builtin(
    "bool",
    category="data",
    description="Convert to Bool. Strings are parsed (case-insensitive): true/yes/on/y/1 are "
    "true, false/no/off/n/0 and the empty string false, anything else a ValueError. Other "
    "values by truthiness: null, 0, 0.0 and empty arrays and records are false.",
    examples=[
        Example('bool("yes")', True),
        Example('bool("False")', False),
        Example("bool(0)", False),
        Example("bool([1])", True),
    ],
)
def bool_(value: Any) -> Bool:
    if type(value) is str:
        key = value.strip().lower()
        if key in _TRUE:
            return True
        if key in _FALSE:
            return False
        raise _value_error(
            f"bool: {value!r} is not a boolean", hint="use true/false, yes/no, on/off or 1/0"
        )
    if value is None or value is True or value is False:
        return bool(value)
    if type(value) in (int, float):
        return value != 0
    if isinstance(value, dict):
        return bool(value)
    if values.is_array(value):
        return next(iter(value), _EMPTY) is not _EMPTY
    return True


_EMPTY = object()


@builtin(
    "type_of",
    category="data",
    description="The conch type name of a value: Null, Bool, Int, Float, String, Array, Table, "
    "Record, Range, Function or Error.",
    examples=[
        Example("type_of(1)", "Int"),
        Example("type_of([{a: 1}, {a: 2}])", "Table"),
        Example("type_of(1..3)", "Range"),
        Example("type_of(upper)", "Function"),
    ],
)
def type_of(value: Any) -> String:
    return values.type_of(value)


@builtin(
    "describe",
    category="data",
    description="The full type of a value, e.g. `Table<name: String, size: Int>`, "
    "`Array<Int>` or `Record<a: Int>`.",
    examples=[
        Example('describe([{name: "a", size: 1}])', "Table<name: String, size: Int>"),
        Example("describe([1, 2])", "Array<Int>"),
        Example('describe({a: 1, b: "x"})', "Record<a: Int, b: String>"),
    ],
)
def describe(value: Any) -> String:
    return values.describe(value)


# -- hashing, encoding, identifiers -------------------------------------------------------

_HASHES = (
    "md5",
    "sha1",
    "sha224",
    "sha256",
    "sha384",
    "sha512",
    "sha3_256",
    "sha3_512",
    "blake2b",
    "blake2s",
)
_HASH_KEYS = {h.replace("_", ""): h for h in _HASHES}


@builtin(
    "hash",
    category="data",
    description="The hex digest of a value: a String's UTF-8 bytes, or any other value's compact "
    "JSON (as `str` renders it). `algorithm` is one of md5, sha1, sha224, sha256 (default), "
    "sha384, sha512, sha3_256, sha3_512, blake2b, blake2s.",
    examples=[
        Example('hash("abc")', "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        Example('hash("abc", algorithm="md5")', "900150983cd24fb0d6963f7d28e17f72"),
        Example('hash("")', "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    ],
)
def hash_(value: Any, algorithm: String = "sha256") -> String:
    # "SHA-256", "sha_256" and "sha256" all name the same algorithm.
    name = _HASH_KEYS.get(algorithm.lower().replace("-", "").replace("_", ""), algorithm)
    if name not in _HASHES:
        raise _value_error(
            f"hash: unknown algorithm {algorithm!r}",
            hint=did_you_mean(name, _HASHES) or f"use one of {', '.join(_HASHES)}",
        )
    import hashlib

    text = value if type(value) is str else values.render(value)
    return hashlib.new(name, text.encode("utf-8")).hexdigest()


@builtin(
    "base64_encode",
    category="data",
    description="The base64 encoding of a string's UTF-8 bytes (`url_safe=true` for the "
    "URL-safe alphabet with - and _).",
    examples=[
        Example('base64_encode("hello")', "aGVsbG8="),
        Example('base64_encode("é?>", url_safe=true)', "w6k_Pg=="),
    ],
)
def base64_encode(text: String, url_safe: Bool = False) -> String:
    import base64

    raw = text.encode("utf-8")
    out = base64.urlsafe_b64encode(raw) if url_safe else base64.b64encode(raw)
    return out.decode("ascii")


@builtin(
    "base64_decode",
    category="data",
    description="Decode base64 (standard or URL-safe alphabet; whitespace ignored, missing "
    "padding tolerated) into a string. The bytes must be UTF-8 text, else ValueError.",
    examples=[
        Example('base64_decode("aGVsbG8=")', "hello"),
        Example('base64_decode("w6k_Pg")', "é?>"),
    ],
)
def base64_decode(text: String) -> String:
    import base64
    import binascii

    compact = "".join(text.split()).replace("-", "+").replace("_", "/")
    compact += "=" * (-len(compact) % 4)
    try:
        raw = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise _value_error(f"base64_decode: invalid base64 input {_short(text)}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _value_error("base64_decode: the decoded bytes are not UTF-8 text") from None


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


@builtin(
    "uuid",
    category="data",
    description="A new random (version 4) UUID as a lowercase hyphenated string.",
    examples=[
        Example("uuid()", type="String"),
        Example(
            "uuid() | regex_match('^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$')",
            True,
        ),
    ],
)
def uuid() -> String:
    import uuid as _uuid

    return str(_uuid.uuid4())
