"""The REPL driven through prompt_toolkit's pipe input."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prompt_toolkit.application import create_app_session
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

from conch.cli.repl import ConchCompleter, Repl, help_text, is_complete
from conch.lang.context import Context


@pytest.fixture
def repl(tmp_path: Path) -> Repl:
    console = Console(file=io.StringIO(), width=100, color_system=None, force_terminal=False)
    return Repl(console=console, context=Context(cwd=tmp_path))


def output(repl: Repl) -> str:
    file = repl.console.file
    assert isinstance(file, io.StringIO)
    return file.getvalue()


@pytest.fixture
def drive(repl: Repl) -> Iterator[object]:
    def run(keys: str) -> str:
        with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
            pipe.send_text(keys)
            pipe.close()  # EOF ends the loop
            assert repl.loop() == 0
        return output(repl)

    yield run


def completions(repl: Repl, text: str) -> list[str]:
    doc = Document(text, len(text))
    return [c.text for c in ConchCompleter(repl).get_completions(doc, CompleteEvent())]


def test_is_complete() -> None:
    assert is_complete("1 + 1")
    assert not is_complete("[1, 2,")
    assert not is_complete("fn f(x) {")
    assert not is_complete("[1, 2] |")
    assert not is_complete("[1, 2] |   # more to come")
    assert not is_complete('"open string')
    assert not is_complete('"""multi\nline')
    assert is_complete('"a ( b"')
    assert is_complete("# just a comment")
    assert is_complete("x = 1")  # `=` inside, not at the end
    assert not is_complete("let x =")


def test_multi_line_input_and_bindings(drive, repl: Repl) -> None:  # type: ignore[no-untyped-def]
    text = drive("let xs = [\r1, 2,\r3]\rxs |\rmap(fn(x) => x * 10) |\rsum\r")
    assert "60" in text.split()


def test_results_errors_and_tables(drive, repl: Repl) -> None:  # type: ignore[no-untyped-def]
    text = drive('[{name: "a", size: 1}, {name: "b", size: 22}]\r1 / 0\r"plain"\r')
    assert "name" in text and "size" in text and "22" in text
    assert "ZeroDivisionError" in text
    assert "  1 | 1 / 0" in text and "^" in text
    assert "plain" in text


def test_a_later_input_reassigns_a_let_mut(drive, repl: Repl) -> None:  # type: ignore[no-untyped-def]
    text = drive("let mut c = 41\rc = c + 1\rc\rlet k = 1\rk = 2\r")
    assert "NameError" not in text
    assert "42" in text.split()
    assert "SyntaxError: cannot assign twice to immutable 'k'" in text


def test_quit(drive, repl: Repl) -> None:  # type: ignore[no-untyped-def]
    text = drive('"before"\r:quit\r"after"\r')
    assert "before" in text and "after" not in text


def test_help(drive, repl: Repl) -> None:  # type: ignore[no-untyped-def]
    text = drive(":help cat\r:help\r:help lenght\r")
    assert "cat(path: String) -> String" in text
    assert 'write("a.txt", "hi"); cat("a.txt")' in text
    assert "filesystem:" in text and "collections:" in text
    assert 'did you mean "length"?' in text or "did you mean" in text


def test_help_text_shows_overloads() -> None:
    text = help_text("append")
    assert "append(path: String" in text and "append(items: Array" in text


def test_completion_of_builtins_variables_and_fields(drive, repl: Repl) -> None:  # type: ignore[no-untyped-def]
    drive('let rec = {name: "x", nested: {inner: 1}, size: 2}\rlet recent = 1\r')
    assert completions(repl, "gre") == ["grep"]
    assert {"rec", "recent"} <= set(completions(repl, "re"))
    assert "reduce" in completions(repl, "re")
    assert completions(repl, "rec.") == ["name", "nested", "size"]
    assert completions(repl, "rec.n") == ["name", "nested"]
    assert completions(repl, "rec.nested.") == ["inner"]
    assert completions(repl, "1 + rec.si") == ["size"]
    assert completions(repl, "wh") == ["where", "while"] or "where" in completions(repl, "wh")


def test_tab_completes_in_the_prompt(repl: Repl) -> None:
    # Completion runs in the background: give it time before typing on.
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        pipe.send_text("let record = {alpha: 41}\rrecord.alp\t")

        def finish() -> None:
            pipe.send_text(" + 1\r")
            pipe.close()

        timer = threading.Timer(1.0, finish)
        timer.start()
        assert repl.loop() == 0
        timer.join()
    assert "42" in output(repl).split()


def test_history_is_persisted(tmp_path: Path) -> None:
    from prompt_toolkit.history import FileHistory

    path = tmp_path / "history"
    console = Console(file=io.StringIO(), width=100)
    repl = Repl(console=console, history=FileHistory(str(path)), context=Context(cwd=tmp_path))
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        pipe.send_text("1 + 2\r")
        pipe.close()
        repl.loop()
    assert "1 + 2" in path.read_text()
