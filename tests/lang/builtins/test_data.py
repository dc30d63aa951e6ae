"""Unit tests of the data builtins: encoders round-trip, conversions fail precisely."""

from __future__ import annotations

import re
from typing import Any

import pytest

from conch.lang.builtins.registry import REGISTRY, load_all
from conch.lang.errors import ConchError
from conch.lang.values import LazyList

load_all()

SAMPLE = {
    "name": "conch ünïcode 日本",
    "n": 3,
    "ratio": 0.25,
    "ok": True,
    "none": None,
    "tags": ["a", "b"],
    "nested": {"deep": [1, {"x": "y"}]},
}


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    return REGISTRY[name].fn(*args, **kwargs)


def fails(kind: str, name: str, *args: Any, **kwargs: Any) -> ConchError:
    with pytest.raises(ConchError) as info:
        call(name, *args, **kwargs)
    assert info.value.kind == kind, info.value
    return info.value


def test_json_round_trip() -> None:
    text = call("to_json", SAMPLE)
    assert "日本" in text and " " not in text.replace("conch ünïcode 日本", "")
    assert call("from_json", text) == SAMPLE
    assert call("from_json", call("to_json", SAMPLE, indent=2)) == SAMPLE
    assert call("to_json", range(3)) == "[0,1,2]"
    assert call("to_json", LazyList(iter([1, 2]))) == "[1,2]"
    assert call("to_json", float("nan")) == '"NaN"'
    assert call("to_json", None) == "null"


def test_json_errors() -> None:
    err = fails("ValueError", "from_json", '{"a": }')
    assert "line 1, column 7" in err.message
    fails("ValueError", "from_json", "")
    fails("TypeError", "from_json", 1)
    err = fails("TypeError", "to_json", {"f": len})
    assert "at f" in err.message
    fails("ValueError", "to_json", [1], indent=-1)


def test_csv_round_trip() -> None:
    table = [
        {"name": "a, with comma", "n": 1, "x": 1.5, "ok": True, "empty": None},
        {"name": 'quote "q"', "n": -2, "x": 0.0, "ok": False, "empty": None},
        {"name": "multi\nline é", "n": 0, "x": 1e-3, "ok": True, "empty": None},
    ]
    text = call("to_csv", table)
    assert text.startswith("name,n,x,ok,empty\n")
    assert call("from_csv", text) == table


def test_to_csv_shapes() -> None:
    assert call("to_csv", [{"a": 1}, {"b": 2}]) == "a,b\n1,\n,2\n"
    assert call("to_csv", [{"a": [1, 2], "b": {"c": 1}}]) == 'a,b\n"[1,2]","{""c"":1}"\n'
    assert call("to_csv", [[1, "x"], ["y", None]], separator="\t") == "1\tx\ny\t\n"
    assert call("to_csv", []) == ""
    fails("TypeError", "to_csv", [1, 2])
    fails("TypeError", "to_csv", {"a": 1})
    fails("ValueError", "to_csv", [{"a": 1}], separator=";;")


def test_from_csv_inference() -> None:
    text = "id,zip,price,flag,note,neg\n1,007,2.50,true,,-3\n2,10001,1e3,false,x,+4\n"
    rows = call("from_csv", text)
    assert rows == [
        {"id": 1, "zip": "007", "price": 2.5, "flag": True, "note": None, "neg": -3},
        {"id": 2, "zip": 10001, "price": 1000.0, "flag": False, "note": "x", "neg": 4},
    ]
    raw = call("from_csv", text, infer=False)
    assert raw[0] == {
        "id": "1",
        "zip": "007",
        "price": "2.50",
        "flag": "true",
        "note": "",
        "neg": "-3",
    }
    assert call("from_csv", "a\nNaN\ninf\n.5\n1.\n") == [
        {"a": "NaN"},
        {"a": "inf"},
        {"a": 0.5},
        {"a": "1."},
    ]


def test_from_csv_edges() -> None:
    assert call("from_csv", "") == []
    assert call("from_csv", "a,b\n") == []
    assert call("from_csv", "a,b\n1\n") == [{"a": 1, "b": None}]
    assert call("from_csv", "a,\n1,2\n") == [{"a": 1, "column1": 2}]
    assert call("from_csv", "1,2\n3\n", header=False) == [
        {"column0": 1, "column1": 2},
        {"column0": 3, "column1": None},
    ]
    assert call("from_csv", "a,b\r\n1,2\r\n") == [{"a": 1, "b": 2}]
    err = fails("ValueError", "from_csv", "a,b\n1,2,3\n")
    assert "row 2" in err.message and "3 fields" in err.message
    assert "duplicate" in fails("ValueError", "from_csv", "a,a\n1,2\n").message
    fails("ValueError", "from_csv", 'a\n"unclosed\n')


def test_yaml_round_trip() -> None:
    text = call("to_yaml", SAMPLE)
    assert "日本" in text
    assert call("from_yaml", text) == SAMPLE
    assert call("from_yaml", "") is None
    assert call("from_yaml", "when: 2024-05-01 10:00:00") == {"when": "2024-05-01T10:00:00"}
    err = fails("ValueError", "from_yaml", "a: [1, 2\nb: 3")
    assert "line" in err.message
    # the safe loader refuses Python objects
    fails("ValueError", "from_yaml", "!!python/object/apply:os.system ['true']")
    fails("TypeError", "to_yaml", [len])


def test_toml_round_trip() -> None:
    value = {k: v for k, v in SAMPLE.items() if k != "none"}
    text = call("to_toml", value)
    assert call("from_toml", text) == value
    assert call("to_toml", {}) == ""
    err = fails("ValueError", "to_toml", SAMPLE)
    assert "null" in err.message and "none" in err.message
    err = fails("ValueError", "to_toml", {"a": [1, None]})
    assert "a[1]" in err.message
    fails("TypeError", "to_toml", [1])
    assert call("from_toml", "d = 1979-05-27\nt = 07:32:00") == {"d": "1979-05-27", "t": "07:32:00"}
    assert "invalid TOML" in fails("ValueError", "from_toml", "a = ").message


def test_int_conversions() -> None:
    assert call("int", "  12 ") == 12
    assert call("int", "-7") == -7
    assert call("int", "1_000") == 1000
    assert call("int", "0b11") == 3
    assert call("int", 2.99) == 2
    assert call("int", -2.99) == -2
    assert call("int", False) == 0
    assert call("int", 10**30) == 10**30
    err = fails("ValueError", "int", "abc")
    assert err.message == "int: 'abc' is not an integer"
    assert fails("ValueError", "int", "1.5").hint
    fails("ValueError", "int", "")
    fails("ValueError", "int", float("inf"))
    fails("ValueError", "int", float("nan"))
    assert "'value'" in fails("TypeError", "int", None).message
    fails("TypeError", "int", [1])


def test_float_conversions() -> None:
    assert call("float", "2.5") == 2.5
    assert call("float", " -1e2 ") == -100.0
    assert call("float", 3) == 3.0
    assert call("float", True) == 1.0
    assert fails("ValueError", "float", "abc").message == "float: 'abc' is not a number"
    fails("ValueError", "float", 10**400)
    fails("TypeError", "float", None)


def test_bool_conversions() -> None:
    for text in ("true", "TRUE", "yes", "on", "1", " y "):
        assert call("bool", text) is True, text
    for text in ("false", "No", "off", "0", "", "n"):
        assert call("bool", text) is False, text
    fails("ValueError", "bool", "maybe")
    assert call("bool", None) is False
    assert call("bool", 0.0) is False
    assert call("bool", -1) is True
    assert call("bool", []) is False
    assert call("bool", range(0)) is False
    assert call("bool", range(1)) is True
    assert call("bool", {}) is False
    assert call("bool", {"a": 1}) is True
    assert call("bool", len) is True


def test_type_of_and_describe() -> None:
    assert call("type_of", None) == "Null"
    assert call("type_of", 1.0) == "Float"
    assert call("type_of", []) == "Array"
    assert call("type_of", [{"a": 1}]) == "Table"
    assert call("type_of", call) == "Function"
    assert call("describe", [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]) == "Table<a: Int, b: String>"
    assert call("describe", [1, "a"]) == "Array<Any>"
    assert call("describe", range(3)) == "Range<Int>"


def test_hash() -> None:
    assert call("hash", "abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert call("hash", "abc", algorithm="SHA-1") == "a9993e364706816aba3e25717850c26c9cd0d89d"
    # non-strings hash their compact JSON rendering
    assert call("hash", [1, 2]) == call("hash", "[1,2]")
    assert len(call("hash", "é", algorithm="sha512")) == 128
    err = fails("ValueError", "hash", "x", algorithm="sha257")
    assert err.hint and "sha256" in err.hint


def test_base64() -> None:
    for text in ("", "a", "ab", "abc", "héllo wörld 日本 😀", "\x00\n"):
        assert call("base64_decode", call("base64_encode", text)) == text
        assert call("base64_decode", call("base64_encode", text, url_safe=True)) == text
    assert call("base64_encode", "???") == "Pz8/"
    assert call("base64_encode", "???", url_safe=True) == "Pz8_"
    assert call("base64_decode", "aGVs\nbG8=") == "hello"
    assert call("base64_decode", "aGVsbG8") == "hello"
    fails("ValueError", "base64_decode", "a*b=")
    assert "UTF-8" in fails("ValueError", "base64_decode", "/w==").message


def test_uuid() -> None:
    a, b = call("uuid"), call("uuid")
    assert a != b
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", a)
