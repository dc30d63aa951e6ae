"""A session keeps what it compiled: an input run again against the same bindings is not
parsed and compiled again, and one whose bindings changed (added, redeclared as another kind,
restored) is compiled anew, so every run means what it says."""

from __future__ import annotations

import pytest

from conch.lang import Session
from conch.lang import session as session_module


@pytest.fixture()
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources a session compiled (the parser is called once per compilation)."""
    seen: list[str] = []
    parse = session_module.parse

    def counting(source: str):  # type: ignore[no-untyped-def]
        seen.append(source)
        return parse(source)

    monkeypatch.setattr(session_module, "parse", counting)
    return seen


def test_the_same_input_against_the_same_bindings_compiles_once(compiles: list[str]) -> None:
    s = Session()
    s.run("let mut n = 0")
    for expected in (1, 2, 3):
        s.run("n = n + 1")
        assert s.run("n") == expected
    assert compiles.count("n = n + 1") == 1 and compiles.count("n") == 1


def test_changed_bindings_compile_anew(compiles: list[str]) -> None:
    s = Session()
    s.run("fn f() => 1")
    assert s.run("f() + 1") == 2
    s.run("fn f() => 10")  # a redefinition: calls compiled before must reach the new one
    assert s.run("f() + 1") == 11
    s.run('let x = "a"')
    assert s.run("x + \"b\"") == "ab"
    s.run("let mut x = 5")  # the same name, another kind
    s.run("x = x + 1")
    assert s.run("x") == 6
    # A redefined function keeps its Python name: the compiled call reaches the new one.
    assert compiles.count("f() + 1") == 1
    # Redeclared as another kind, x compiles anew.
    assert compiles.count('x + "b"') == 1 and compiles.count("x") == 1


def test_a_restored_session_compiles_against_what_it_restored(compiles: list[str]) -> None:
    s = Session()
    s.run("let mut total = 40")
    docs, unsaved = s.export()
    assert unsaved == []
    other = Session()
    other.restore(docs)
    other.run("total = total + 2")
    assert other.run("total") == 42
    s.run("total = total + 2")
    assert s.run("total") == 42


def test_the_cache_is_bounded() -> None:
    s = Session()
    for i in range(session_module.COMPILED_KEPT + 50):
        assert s.run(f"{i} + 1") == i + 1
    assert len(s._compiled) == session_module.COMPILED_KEPT
