"""String builtins: case, trimming, splitting and joining, regexes, padding, formatting, parsing.

Indices and widths count Unicode code points (``len("é") == 1``), never bytes. The hot
builtins (``split``, ``join``, ``upper``, ``lines``) are thin calls to the ``str`` methods:
they run once per element of large pipelines.

``contains`` is not here: it lives in collections and handles both Array membership and
String substring.
"""

from __future__ import annotations

from conch.lang import values
from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Array, Bool, Float, Function, Int, Record, String
from conch.lang.errors import ConchError

# re is imported by the regex builtins when first called, typing only by type checkers: they
# cost milliseconds on every start of a program that names a string builtin.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from typing import Any

_render = values.render


def _value_error(message: str, hint: str | None = None) -> ConchError:
    return ConchError("ValueError", message, hint=hint)


# -- case ---------------------------------------------------------------------------------


@builtin(
    "upper",
    category="strings",
    description='The string in upper case (full Unicode case mapping: "ß" becomes "SS").',
    examples=[
        Example('upper("hello")', "HELLO"),
        Example('"straße" | upper', "STRASSE"),
    ],
)
def upper(s: String) -> String:
    return s.upper()


@builtin(
    "lower",
    category="strings",
    description="The string in lower case (full Unicode case mapping).",
    examples=[Example('lower("Hello World")', "hello world"), Example('"ÉTÉ" | lower', "été")],
)
def lower(s: String) -> String:
    return s.lower()


@builtin(
    "capitalize",
    category="strings",
    description="The string with its first character in upper case; the rest is left unchanged.",
    examples=[
        Example('capitalize("hello world")', "Hello world"),
        Example('capitalize("élan McQueen")', "Élan McQueen"),
    ],
)
def capitalize(s: String) -> String:
    return s[:1].upper() + s[1:]


# -- trimming -----------------------------------------------------------------------------


@builtin(
    "trim",
    category="strings",
    description="The string without leading and trailing whitespace, or without any of the "
    "characters in `chars` when given.",
    examples=[
        Example('trim("  hi  ")', "hi"),
        Example('trim("--hi--", "-")', "hi"),
    ],
)
def trim(s: String, chars: String | None = None) -> String:
    return s.strip(chars)


@builtin(
    "trim_start",
    category="strings",
    description="The string without leading whitespace (or leading characters of `chars`).",
    examples=[Example('trim_start("  hi  ")', "hi  "), Example('trim_start("007", "0")', "7")],
)
def trim_start(s: String, chars: String | None = None) -> String:
    return s.lstrip(chars)


@builtin(
    "trim_end",
    category="strings",
    description="The string without trailing whitespace (or trailing characters of `chars`).",
    examples=[Example('trim_end("  hi  ")', "  hi"), Example('trim_end("1.500", "0")', "1.5")],
)
def trim_end(s: String, chars: String | None = None) -> String:
    return s.rstrip(chars)


# -- splitting and joining ----------------------------------------------------------------


@builtin(
    "split",
    category="strings",
    description="Split a string on a literal separator. With no separator (null) it splits on "
    "runs of whitespace and drops empty pieces; an empty separator splits into characters. "
    "`limit` caps the number of splits.",
    examples=[
        Example('"a,b,c" | split(",")', ["a", "b", "c"]),
        Example('split("  one  two ")', ["one", "two"]),
        Example('split("héllo", "")', ["h", "é", "l", "l", "o"]),
        Example('split("k=v=w", "=", limit=1)', ["k", "v=w"]),
    ],
)
def split(s: String, sep: String | None = None, limit: Int | None = None) -> Array:
    if sep == "":
        return list(s)
    if limit is None:
        return s.split(sep)
    return s.split(sep, limit if limit >= 0 else -1)


@builtin(
    "join",
    category="strings",
    description="Join the elements of an array into one string with a separator; elements that "
    "are not strings are rendered as `str` renders them.",
    examples=[
        Example('["a", "b", "c"] | join("-")', "a-b-c"),
        Example("join([1, 2, 3])", "123"),
        Example('join([], ", ")', ""),
    ],
)
def join(items: Array, sep: String = "") -> String:
    seq = values.as_list(items)
    try:
        return sep.join(seq)
    except TypeError:
        return sep.join([_render(v) for v in seq])


@builtin(
    "lines",
    category="strings",
    description="Split text into lines on \\n or \\r\\n; a final line ending does not make an "
    "extra empty line.",
    examples=[
        Example('lines("a\\nb\\r\\nc\\n")', ["a", "b", "c"]),
        Example('lines("")', []),
    ],
)
def lines(s: String) -> Array:
    parts = s.split("\n")
    if parts[-1] == "":
        parts.pop()
    if "\r" in s:
        parts = [p[:-1] if p.endswith("\r") else p for p in parts]
    return parts


# A word is a run of letters and digits, joined by inner apostrophes ("it's", "don’t").
_WORD: re.Pattern[str] | None = None


def _word_regex() -> re.Pattern[str]:
    global _WORD
    import re

    _WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
    return _WORD


@builtin(
    "words",
    category="strings",
    description="The words of a text: runs of Unicode letters and digits (inner apostrophes "
    "kept); punctuation, underscores and whitespace separate words.",
    examples=[
        Example('words("Hello, world! It\'s fine.")', ["Hello", "world", "It's", "fine"]),
        Example('words("naïve café, 2 times")', ["naïve", "café", "2", "times"]),
    ],
)
def words(s: String) -> Array:
    return (_WORD or _word_regex()).findall(s)


# -- replacing ----------------------------------------------------------------------------


@builtin(
    "replace",
    category="strings",
    description="Replace every occurrence of a literal substring (or only the first `count` ones).",
    examples=[
        Example('replace("a-b-c", "-", "+")', "a+b+c"),
        Example('"a-b-c" | replace("-", "", count=1)', "ab-c"),
    ],
)
def replace(s: String, old: String, new: String, count: Int | None = None) -> String:
    if count is None:
        return s.replace(old, new)
    return s.replace(old, new, count)


def _compile(pattern: str, builtin_name: str) -> re.Pattern[str]:
    import re

    try:
        return re.compile(pattern)
    except re.error as exc:
        raise _value_error(f"{builtin_name}: invalid regex {pattern!r}: {exc}") from None


_DOLLAR: re.Pattern[str] | None = None


def _py_template(replacement: str) -> str:
    """Translate a ``$1``/``${name}``/``$$`` replacement into Python's ``re.sub`` template.

    conch uses the ``$`` syntax of Nushell/Rust/JavaScript because a backslash before a digit
    is not a valid escape in a conch string; backslashes in the replacement stay literal.
    """
    if "$" not in replacement and "\\" not in replacement:
        return replacement
    global _DOLLAR
    if _DOLLAR is None:
        import re

        _DOLLAR = re.compile(r"\$(?:\$|(\d+)|\{(\w+)\})")
    parts: list[str] = []
    pos = 0
    for m in _DOLLAR.finditer(replacement):
        parts.append(replacement[pos : m.start()].replace("\\", "\\\\"))
        if m.group(0) == "$$":
            parts.append("$")
        else:
            parts.append(f"\\g<{m.group(1) or m.group(2)}>")
        pos = m.end()
    parts.append(replacement[pos:].replace("\\", "\\\\"))
    return "".join(parts)


@builtin(
    "regex_replace",
    category="strings",
    description="Replace matches of a regular expression (Python `re` syntax). In a String "
    "replacement `$0` is the whole match, `$1` or `${name}` a group and `$$` a dollar sign; "
    "a Function replacement receives the matched text and returns its replacement. `count` "
    "limits the number of replacements.",
    examples=[
        Example('regex_replace("a1b22c333", \'\\d+\', "#")', "a#b#c#"),
        Example("regex_replace(\"John Smith\", '(\\w+) (\\w+)', '$2, $1')", "Smith, John"),
        Example("regex_replace(\"a-b\", '[a-z]', fn(m) => upper(m))", "A-B"),
    ],
)
def regex_replace(
    s: String, pattern: String, replacement: String | Function, count: Int | None = None
) -> String:
    rx = _compile(pattern, "regex_replace")
    if count is not None and count <= 0:
        return s
    n = 0 if count is None else count  # re.sub: 0 means every match
    if isinstance(replacement, str):
        import re

        try:
            return rx.sub(_py_template(replacement), s, count=n)
        except (re.error, IndexError) as exc:
            raise _value_error(f"regex_replace: bad replacement {replacement!r}: {exc}") from None

    def call(m: re.Match[str]) -> str:
        out = replacement(m.group(0))
        return out if type(out) is str else _render(out)

    return rx.sub(call, s, count=n)


@builtin(
    "regex_match",
    category="strings",
    description="Whether the regular expression matches anywhere in the string (anchor with `^` "
    "and `$` for a whole-string match). Use `regex_capture` for the matched groups.",
    examples=[
        Example("regex_match(\"abc123\", '\\d+')", True),
        Example("regex_match(\"abc\", '^\\d+$')", False),
    ],
)
def regex_match(s: String, pattern: String) -> Bool:
    return _compile(pattern, "regex_match").search(s) is not None


@builtin(
    "regex_capture",
    category="strings",
    returns="Record | Null",
    description="The first match of a regular expression as a Record `{match, start, end, "
    "groups, named}` (groups: the numbered groups, null when unmatched; named: the named "
    "groups), or null when it does not match.",
    examples=[
        Example(
            "regex_capture(\"v1.25\", '(\\d+)\\.(?P<minor>\\d+)')",
            {
                "match": "1.25",
                "start": 1,
                "end": 5,
                "groups": ["1", "25"],
                "named": {"minor": "25"},
            },
        ),
        Example("regex_capture(\"abc\", '\\d')", None),
    ],
)
def regex_capture(s: String, pattern: String) -> Record | None:
    m = _compile(pattern, "regex_capture").search(s)
    if m is None:
        return None
    return {
        "match": m.group(0),
        "start": m.start(),
        "end": m.end(),
        "groups": list(m.groups()),
        "named": m.groupdict(),
    }


@builtin(
    "regex_find_all",
    category="strings",
    description="Every non-overlapping match of a regular expression, as an array of the "
    "matched texts (whole matches, whatever groups the pattern has).",
    examples=[
        Example("regex_find_all(\"a1b22c333\", '\\d+')", ["1", "22", "333"]),
        Example("regex_find_all(\"x=1, y=2\", '(\\w)=\\d')", ["x=1", "y=2"]),
        Example("regex_find_all(\"abc\", '\\d')", []),
    ],
)
def regex_find_all(s: String, pattern: String) -> Array:
    return [m.group(0) for m in _compile(pattern, "regex_find_all").finditer(s)]


# -- tests and slicing --------------------------------------------------------------------


@builtin(
    "starts_with",
    category="strings",
    description="Whether the string starts with the prefix.",
    examples=[
        Example('starts_with("conch", "con")', True),
        Example('"conch" | starts_with("ch")', False),
    ],
)
def starts_with(s: String, prefix: String) -> Bool:
    return s.startswith(prefix)


@builtin(
    "ends_with",
    category="strings",
    description="Whether the string ends with the suffix.",
    examples=[
        Example('ends_with("main.conch", ".conch")', True),
        Example('ends_with("a", "ab")', False),
    ],
)
def ends_with(s: String, suffix: String) -> Bool:
    return s.endswith(suffix)


@builtin(
    "substring",
    category="strings",
    description="The characters from `start` (inclusive) to `end` (exclusive; null means the "
    "end of the string). Negative indices count from the end; out-of-range indices are clamped.",
    examples=[
        Example('substring("hello", 1, 3)', "el"),
        Example('substring("hello", -3)', "llo"),
        Example('substring("日本語テキスト", 2, 4)', "語テ"),
    ],
)
def substring(s: String, start: Int, end: Int | None = None) -> String:
    return s[start:end]


def _pad_args(name: str, value: Any, width: int, fill: str) -> str:
    if len(fill) != 1:
        raise _value_error(
            f"{name}: fill must be exactly one character, got {fill!r}",
            hint='use a single character such as " " or "0"',
        )
    return value if type(value) is str else _render(value)


@builtin(
    "pad_left",
    category="strings",
    description="Right-align a value in a string of `width` characters by adding `fill` "
    "(one character, default a space) on the left; numbers are rendered first. Longer "
    "strings are returned unchanged.",
    examples=[
        Example('pad_left("7", 3, "0")', "007"),
        Example("42 | pad_left(5)", "   42"),
        Example('pad_left("é", 3, "·")', "··é"),
    ],
)
def pad_left(value: String | Int | Float, width: Int, fill: String = " ") -> String:
    return _pad_args("pad_left", value, width, fill).rjust(width, fill)


@builtin(
    "pad_right",
    category="strings",
    description="Left-align a value in a string of `width` characters by adding `fill` "
    "(one character, default a space) on the right; numbers are rendered first.",
    examples=[Example('pad_right("ab", 4, ".")', "ab.."), Example('pad_right("日本", 3)', "日本 ")],
)
def pad_right(value: String | Int | Float, width: Int, fill: String = " ") -> String:
    return _pad_args("pad_right", value, width, fill).ljust(width, fill)


@builtin(
    "repeat",
    category="strings",
    description="The string (or array) repeated `n` times; `n` must not be negative.",
    examples=[
        Example('repeat("ab", 3)', "ababab"),
        Example('"-" | repeat(0)', ""),
        Example("repeat([0], 3)", [0, 0, 0]),
    ],
)
def repeat(value: String | Array, n: Int) -> String | Array:
    if n < 0:
        raise _value_error(f"repeat: n must not be negative, got {n}")
    if type(value) is str:
        values.check_size(len(value) * n, "String")
        return value * n
    items = values.as_list(value)
    values.check_size(len(items) * n)
    return items * n


# -- formatting ---------------------------------------------------------------------------


def _format_one(value: Any, spec: str) -> str:
    if not spec:
        return value if type(value) is str else _render(value)
    # Only plain numbers and strings reach Python's format(): it never sees arbitrary
    # objects, so a template cannot reach attributes the way str.format("{0.__class__}") can.
    target = value if type(value) in (int, float, str) else _render(value)
    try:
        return format(target, spec)
    except (ValueError, TypeError) as exc:
        raise _value_error(
            f"format: invalid format spec {spec!r} for {values.type_of(value)}: {exc}"
        ) from None


def _lookup(name: str, args: tuple[Any, ...], named: dict[str, Any]) -> Any:
    if name in named:
        return named[name]
    if len(args) == 1 and isinstance(args[0], dict) and name in args[0]:
        return args[0][name]
    raise _value_error(
        f"format: no value for placeholder {{{name}}}",
        hint="pass it as a named argument, or pass a single Record with that field",
    )


def _format(template: str, args: tuple[Any, ...], named: dict[str, Any]) -> str:
    out: list[str] = []
    i = 0
    n = len(template)
    auto = 0
    while i < n:
        brace = i
        while brace < n and template[brace] not in "{}":
            brace += 1
        if brace > i:
            out.append(template[i:brace])
        if brace >= n:
            break
        i = brace
        if template[i] == "}":
            if template.startswith("}}", i):
                out.append("}")
                i += 2
                continue
            raise _value_error(
                f"format: single '}}' at position {i} in the template",
                hint="write '}}' for a literal brace",
            )
        if template.startswith("{{", i):
            out.append("{")
            i += 2
            continue
        close = template.find("}", i)
        if close < 0:
            raise _value_error(
                f"format: unclosed '{{' at position {i} in the template",
                hint="write '{{' for a literal brace",
            )
        field, _, spec = template[i + 1 : close].partition(":")
        field = field.strip()
        if field == "" or field.isdigit():
            index = auto if field == "" else int(field)
            if field == "":
                auto += 1
            if index >= len(args):
                raise _value_error(
                    f"format: placeholder {{{field}}} needs argument {index}, "
                    f"but {len(args)} {'was' if len(args) == 1 else 'were'} given"
                )
            value = args[index]
        else:
            value = _lookup(field, args, named)
        out.append(_format_one(value, spec))
        i = close + 1
    return "".join(out)


@builtin(
    "format",
    category="strings",
    description="Fill a template: `{}` takes the next argument, `{0}` an argument by position, "
    "`{name}` a named argument (or a field of a single Record argument); `{{` and `}}` are "
    "literal braces. Values are rendered as `str` renders them; a Python format spec after a "
    "colon (`{:.2f}`, `{:>5}`) formats numbers and strings.",
    examples=[
        Example('format("{} is {}", "conch", "typed")', "conch is typed"),
        Example('format("{1}{0}{1}", "a", "b")', "bab"),
        Example('format("{name}: {n:.2f}", name="pi", n=3.14159)', "pi: 3.14"),
        Example('format("{} {{x}}", [1, 2])', "[1,2] {x}"),
        Example('format("{user} is {age}", {user: "ada", age: 36})', "ada is 36"),
    ],
)
def format_(template: String, *args: Any, **named: Any) -> String:
    return _format(template, args, named)


@builtin(
    "str",
    category="strings",
    description="The value as a string: a String unchanged, anything else as compact JSON "
    '(`null`, `true`, `[1,2]`, `{"a":1}`).',
    examples=[
        Example("str(42)", "42"),
        Example('str("x")', "x"),
        Example("str([1, {a: null}])", '[1,{"a":null}]'),
        Example("str(1.5)", "1.5"),
    ],
)
def str_(value: Any) -> String:
    return _render(value)


# -- parsing ------------------------------------------------------------------------------


@builtin(
    "parse_int",
    category="strings",
    description="Parse an integer in base 2 to 36 (default 10); surrounding whitespace, a sign, "
    "underscores between digits and a matching 0x/0o/0b prefix are accepted. With base 0 the "
    "prefix decides the base. Fails with ValueError on anything else.",
    examples=[
        Example('parse_int("42")', 42),
        Example('parse_int("ff", 16)', 255),
        Example('parse_int("-1_000")', -1000),
        Example('parse_int("0b101", 0)', 5),
    ],
)
def parse_int(s: String, base: Int = 10) -> Int:
    if base != 0 and not 2 <= base <= 36:
        raise _value_error(f"parse_int: base must be 0 or between 2 and 36, got {base}")
    try:
        return int(s, base)
    except ValueError:
        raise _value_error(
            f"parse_int: {s!r} is not an integer in base {base}"
            if base
            else f"parse_int: {s!r} is not an integer literal"
        ) from None


@builtin(
    "parse_float",
    category="strings",
    description='Parse a floating-point number (`"3.5"`, `"-1e-3"`, `"inf"`, `"nan"`); '
    "surrounding whitespace is accepted. Fails with ValueError on anything else.",
    examples=[Example('parse_float("3.5")', 3.5), Example('parse_float(" 1e3 ")', 1000.0)],
)
def parse_float(s: String) -> Float:
    try:
        return float(s)
    except ValueError:
        raise _value_error(f"parse_float: {s!r} is not a number") from None
