"""Unit tests of the strings builtins, called through their checked wrappers."""

from __future__ import annotations

from typing import Any

import pytest

from conch.lang.builtins.registry import REGISTRY, load_all
from conch.lang.errors import ConchError
from conch.lang.values import LazyList

load_all()


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    return REGISTRY[name].fn(*args, **kwargs)


def fails(kind: str, name: str, *args: Any, **kwargs: Any) -> ConchError:
    with pytest.raises(ConchError) as info:
        call(name, *args, **kwargs)
    assert info.value.kind == kind, info.value
    return info.value


def test_case_mapping_is_unicode_aware() -> None:
    assert call("upper", "straße") == "STRASSE"
    assert call("lower", "ÀÉÎ") == "àéî"
    assert call("capitalize", "élan vital") == "Élan vital"
    assert call("capitalize", "") == ""
    assert call("capitalize", "hello World") == "Hello World"


def test_type_errors_name_the_parameter() -> None:
    err = fails("TypeError", "upper", 3)
    assert "'s'" in err.message and "Int" in err.message
    err = fails("TypeError", "split", "a b", 1)
    assert "'sep'" in err.message
    err = fails("TypeError", "join", "abc", "-")
    assert "'items'" in err.message
    err = fails("TypeError", "pad_left", "a", "3")
    assert "'width'" in err.message
    err = fails("TypeError", "regex_replace", "a", "a", 3)
    assert "'replacement'" in err.message


def test_trim_family() -> None:
    assert call("trim", " \t x \n") == "x"
    assert call("trim", "xxhixx", "x") == "hi"
    assert call("trim_start", "  a ") == "a "
    assert call("trim_end", "  a ") == "  a"
    assert call("trim", "") == ""
    assert call("trim", "\u3000全角\u3000") == "全角"


def test_split() -> None:
    assert call("split", "a,b,,c", ",") == ["a", "b", "", "c"]
    assert call("split", "  a \t b\n") == ["a", "b"]
    assert call("split", "", ",") == [""]
    assert call("split", "") == []
    assert call("split", "héé", "") == ["h", "é", "é"]
    assert call("split", "a=b=c", "=", limit=1) == ["a", "b=c"]
    assert call("split", "a=b=c", "=", limit=-1) == ["a", "b", "c"]
    assert call("split", "a→b→c", "→") == ["a", "b", "c"]


def test_join_accepts_every_array_kind() -> None:
    assert call("join", ["a", "b"], ", ") == "a, b"
    assert call("join", [1, None, True, "x", [1]], "|") == "1|null|true|x|[1]"
    assert call("join", range(3), "-") == "0-1-2"
    assert call("join", LazyList(iter(["x", "y"])), "") == "xy"
    assert call("join", ("p", "q")) == "pq"
    assert call("join", [], ",") == ""


def test_lines_and_words() -> None:
    assert call("lines", "a\nb") == ["a", "b"]
    assert call("lines", "a\r\nb\r\n") == ["a", "b"]
    assert call("lines", "\n\nx") == ["", "", "x"]
    assert call("lines", "\n") == [""]
    assert call("lines", "") == []
    assert call("words", "it's a don’t-care: x_y 42") == [
        "it's",
        "a",
        "don’t",
        "care",
        "x",
        "y",
        "42",
    ]
    assert call("words", "日本語 テキスト") == ["日本語", "テキスト"]
    assert call("words", "") == []


def test_replace_is_literal() -> None:
    assert call("replace", "a.b.c", ".", "[.]") == "a[.]b[.]c"
    assert call("replace", "aaa", "a", "b", count=2) == "bba"
    assert call("replace", "$1", "$1", "\\") == "\\"


def test_regex_replace_templates() -> None:
    assert call("regex_replace", "2024-05-01", r"(\d+)-(\d+)-(\d+)", "$3/$2/$1") == "01/05/2024"
    assert call("regex_replace", "ab", r"(?P<x>a)", "<${x}>") == "<a>b"
    assert call("regex_replace", "ab", "a", "$$") == "$b"
    assert call("regex_replace", "ab", "a", "$0$0") == "aab"
    # a backslash in the replacement is literal text
    assert call("regex_replace", "ab", "a", r"\1") == r"\1b"
    assert call("regex_replace", "aaa", "a", "b", count=1) == "baa"
    assert call("regex_replace", "aaa", "a", "b", count=0) == "aaa"
    assert call("regex_replace", "a1b2", r"\d", lambda m: int(m) * 10) == "a10b20"
    err = fails("ValueError", "regex_replace", "a", "(", "x")
    assert "invalid regex" in err.message
    fails("ValueError", "regex_replace", "a", "a", "$2")


def test_regex_match_capture_find_all() -> None:
    assert call("regex_match", "hello", "ell") is True
    assert call("regex_match", "hello", "^ell") is False
    assert call("regex_match", "", "^$") is True
    assert call("regex_capture", "key=val", r"(\w+)=(\w+)") == {
        "match": "key=val",
        "start": 0,
        "end": 7,
        "groups": ["key", "val"],
        "named": {},
    }
    assert call("regex_capture", "x", r"(a)?x")["groups"] == [None]
    assert call("regex_capture", "x", "y") is None
    assert call("regex_find_all", "a1 b2 c3", r"[a-z](\d)") == ["a1", "b2", "c3"]
    assert call("regex_find_all", "ééé", "é") == ["é", "é", "é"]
    fails("ValueError", "regex_match", "a", "[")
    fails("ValueError", "regex_find_all", "a", "*")


def test_prefix_suffix_substring() -> None:
    assert call("starts_with", "abc", "") is True
    assert call("ends_with", "naïve", "ïve") is True
    assert call("substring", "hello", 1) == "ello"
    assert call("substring", "hello", -2) == "lo"
    assert call("substring", "hello", 3, 100) == "lo"
    assert call("substring", "hello", 4, 2) == ""
    assert call("substring", "😀a😀", 1, 2) == "a"


def test_padding_counts_characters() -> None:
    assert call("pad_left", "é", 4, "·") == "···é"
    assert call("pad_right", "日本", 4, "*") == "日本**"
    assert call("pad_left", 3.5, 5, "0") == "003.5"
    assert call("pad_left", "long", 2) == "long"
    err = fails("ValueError", "pad_left", "a", 3, "ab")
    assert "one character" in err.message
    fails("ValueError", "pad_right", "a", 3, "")


def test_repeat() -> None:
    assert call("repeat", "é", 3) == "ééé"
    assert call("repeat", [1, 2], 2) == [1, 2, 1, 2]
    assert call("repeat", range(2), 2) == [0, 1, 0, 1]
    assert call("repeat", "x", 0) == ""
    fails("ValueError", "repeat", "x", -1)


def test_format() -> None:
    assert call("format", "{} + {} = {}", 1, 2, 3) == "1 + 2 = 3"
    assert call("format", "{0}{0}", "ab") == "abab"
    assert call("format", "{x}/{y}", x=1, y=None) == "1/null"
    assert call("format", "{a}", {"a": "rec"}) == "rec"
    assert call("format", "{}", {"a": "rec"}) == '{"a":"rec"}'
    assert call("format", "{:>5}|{:<3}|", "ab", 7) == "   ab|7  |"
    assert call("format", "{:,}", 1234567) == "1,234,567"
    assert call("format", "{{}}") == "{}"
    assert call("format", "héllo {}", "wörld") == "héllo wörld"
    assert call("format", "") == ""
    assert "argument 1" in fails("ValueError", "format", "{} {}", 1).message
    fails("ValueError", "format", "{missing}")
    fails("ValueError", "format", "oops {")
    fails("ValueError", "format", "oops }")
    fails("ValueError", "format", "{:d}", "text")


def test_format_cannot_reach_attributes() -> None:
    # Python's str.format would evaluate this; conch treats it as an unknown name.
    fails("ValueError", "format", "{0.__class__}", 1)


def test_str() -> None:
    assert call("str", None) == "null"
    assert call("str", True) == "true"
    assert call("str", "é") == "é"
    assert call("str", {"a": [1, 2.5]}) == '{"a":[1,2.5]}'
    assert call("str", range(3)) == "[0,1,2]"
    assert call("str", float("inf")) == '"Infinity"'


def test_parse_int_and_float() -> None:
    assert call("parse_int", " 42 ") == 42
    assert call("parse_int", "-0x1F", 16) == -31
    assert call("parse_int", "z", 36) == 35
    assert call("parse_int", "0o17", 0) == 15
    assert call("parse_int", "9" * 40) == int("9" * 40)
    err = fails("ValueError", "parse_int", "abc")
    assert "'abc'" in err.message and "base 10" in err.message
    fails("ValueError", "parse_int", "")
    fails("ValueError", "parse_int", "1.5")
    fails("ValueError", "parse_int", "1", 1)
    assert call("parse_float", "-1e-3") == -0.001
    assert call("parse_float", "3") == 3.0
    assert call("parse_float", "inf") == float("inf")
    assert "not a number" in fails("ValueError", "parse_float", "1,5").message
    fails("TypeError", "parse_float", 1.5)


def test_large_inputs_stay_fast() -> None:
    text = "\n".join(f"line {i}" for i in range(100_000))
    rows = call("lines", text)
    assert len(rows) == 100_000
    assert call("join", call("split", call("upper", text), "\n"), "\n") == text.upper()
