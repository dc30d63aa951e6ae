"""Unit tests of the system builtins: output, environment, time, sleep, introspection."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from typing import Any

import pytest

import conch
from conch.lang.builtins.registry import CATEGORIES, REGISTRY, all_builtins, load_all
from conch.lang.context import ALL_EFFECTS, Context, Limits, using
from conch.lang.errors import ConchError

load_all()


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    return REGISTRY[name].fn(*args, **kwargs)


def fails(kind: str, name: str, *args: Any, **kwargs: Any) -> ConchError:
    with pytest.raises(ConchError) as info:
        call(name, *args, **kwargs)
    assert info.value.kind == kind, info.value
    return info.value


def test_print_emits_one_rendered_line() -> None:
    out: list[str] = []
    with using(Context(output=out.append)):
        assert call("print", "a", 1, None, [1, "x"], {"k": True}) is None
        assert call("print") is None
        assert call("print", "é\nnext") is None
    assert out == ['a 1 null [1,"x"] {"k":true}', "", "é\nnext"]


def test_print_respects_the_output_limit() -> None:
    out: list[str] = []
    with using(Context(output=out.append, limits=Limits(output_bytes=10))):
        call("print", "12345")
        err = fails("LimitError", "print", "123456789")
    assert "output limit" in err.message
    assert out == ["12345"]


def test_print_is_allowed_in_a_pure_sandbox() -> None:
    out: list[str] = []
    with using(Context(output=out.append, allowed_effects=frozenset({"pure"}))):
        call("print", "ok")
        fails("PermissionError", "env", "HOME")
        fails("PermissionError", "hostname")
    assert out == ["ok"]


def test_echo() -> None:
    value = {"a": [1]}
    assert call("echo", value) is value


def test_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCH_TEST_VAR", "ünï")
    assert call("env", "CONCH_TEST_VAR") == "ünï"
    monkeypatch.delenv("CONCH_TEST_VAR")
    assert call("env", "CONCH_TEST_VAR") is None
    assert call("env", "CONCH_TEST_VAR", default=0) == 0
    monkeypatch.setenv("CONCH_TEST_VAR", "x")
    whole = call("env")
    assert whole["CONCH_TEST_VAR"] == "x"
    assert list(whole) == sorted(whole)
    fails("TypeError", "env", 1)


def test_now_and_timestamp() -> None:
    before = time.time() * 1000
    stamp = call("timestamp")
    text = call("now")
    after = time.time() * 1000
    assert isinstance(stamp, int) and before - 1 <= stamp <= after + 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", text)
    parsed = dt.datetime.fromisoformat(text).timestamp() * 1000
    assert before - 1000 <= parsed <= after + 1000


def test_date_format() -> None:
    assert call("date_format", 0) == "1970-01-01"
    assert call("date_format", 1_500, "%S") == "01"
    assert call("date_format", 1714571100000.0, "%H:%M") == "13:45"
    assert call("date_format", "2024-05-01T13:45:00+02:00", "%H:%M %z") == "13:45 +0200"
    assert call("date_format", "2024-05-01", "%A") == "Wednesday"
    assert call("date_format", "2024-05-01T00:00:00", "%Z") == "UTC"
    assert call("date_format", call("now"), "%Y") == str(dt.datetime.now(dt.UTC).year)
    assert "ISO-8601" in fails("ValueError", "date_format", "yesterday").message
    fails("ValueError", "date_format", 10**20)
    fails("TypeError", "date_format", None)


def test_sleep_sleeps() -> None:
    start = time.monotonic()
    assert call("sleep", 60) is None
    assert time.monotonic() - start >= 0.055
    assert call("sleep", 0) is None
    fails("ValueError", "sleep", -1)
    fails("TypeError", "sleep", "1s")


def test_sleep_notices_cancellation() -> None:
    ctx = Context()
    threading.Timer(0.05, ctx.cancelled.set).start()
    start = time.monotonic()
    with using(ctx):
        fails("CancelledError", "sleep", 10_000)
    assert time.monotonic() - start < 1


def test_sleep_respects_the_wall_time_limit() -> None:
    start = time.monotonic()
    with using(Context(limits=Limits(wall_time_s=0.1))):
        err = fails("TimeoutError", "sleep", 10_000)
    assert "wall-time" in err.message
    assert time.monotonic() - start < 1


def test_hostname_and_version() -> None:
    assert isinstance(call("hostname"), str) and call("hostname")
    assert call("version") == conch.__version__


def test_assert() -> None:
    assert call("assert", True) is None
    assert call("assert", True, "never") is None
    err = fails("UserError", "assert", False)
    assert err.message == "assertion failed"
    assert fails("UserError", "assert", False, "x must be positive").message == "x must be positive"
    assert "'condition'" in fails("TypeError", "assert", 1).message


def test_builtins_table() -> None:
    table = call("builtins")
    assert len(table) == len(all_builtins()) > 50
    assert all(list(row) == ["name", "category", "description"] for row in table)
    assert {row["category"] for row in table} <= set(CATEGORIES)
    names = {row["name"] for row in table}
    assert {"upper", "to_json", "print", "builtins", "help"} <= names
    strings = call("builtins", "strings")
    assert strings and all(row["category"] == "strings" for row in strings)
    err = fails("ValueError", "builtins", "string")
    assert err.hint == 'did you mean "strings"?'


def test_help() -> None:
    info = call("help", "split")
    assert info["name"] == "split"
    assert info["category"] == "strings"
    assert info["signature"].startswith("split(s: String")
    assert [p["name"] for p in info["parameters"]] == ["s", "sep", "limit"]
    assert info["examples"] and info["example_results"][0]["code"] == info["examples"][0]
    assert call("help", REGISTRY["upper"].fn)["name"] == "upper"
    err = fails("NameError", "help", "uper")
    assert err.hint == 'did you mean "upper"?'
    fails("TypeError", "help", lambda x: x)
    fails("TypeError", "help", 3)


def test_every_effect_is_known() -> None:
    for name in ("env", "hostname"):
        assert REGISTRY[name].effect == "read"
    for name in ("print", "now", "timestamp", "sleep", "echo", "assert"):
        assert REGISTRY[name].effect == "pure"
    assert {b.effect for b in all_builtins()} <= ALL_EFFECTS
