"""The playground in a real browser against a real agent server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from tests.web.studio.conftest import Servers


def run_program(page: Any, code: str) -> None:
    editor = page.locator(".cm-content")
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.press("Delete")
    # insert_text: typing would trigger the editor's bracket closing and completion.
    page.keyboard.insert_text(code)
    page.keyboard.press("Control+Enter")


def test_a_program_shows_its_table(servers: Servers, page: Any, shots: Path) -> None:
    page.goto(servers.agent + "/#/playground")
    expect(page.locator(".builtin-list li").first).to_be_visible()
    run_program(
        page,
        'print("hello from conch")\n'
        '[{name: "b", size: 2}, {name: "a", size: 10}, {name: "c", size: 1}] | sort_by("name")',
    )
    table = page.get_by_test_id("result-table")
    expect(table).to_be_visible()
    expect(page.get_by_test_id("result-type")).to_have_text("Table")
    expect(page.get_by_test_id("output")).to_contain_text("hello from conch")
    cells = table.locator("tbody tr td:first-child")
    expect(cells).to_have_text(["a", "b", "c"])
    # Sort by size: ascending, then descending.
    table.get_by_role("button", name="size").click()
    expect(cells).to_have_text(["c", "b", "a"])
    table.get_by_role("button", name="size").click()
    expect(cells).to_have_text(["a", "b", "c"])
    page.screenshot(path=str(shots / "playground.png"))


def test_a_record_renders_as_a_tree(servers: Servers, page: Any) -> None:
    page.goto(servers.agent + "/#/playground")
    run_program(page, '{name: "conch", nested: {ok: true, n: [1, 2]}}')
    expect(page.get_by_test_id("result-type")).to_have_text("Record")
    tree = page.locator(".value .tree").first
    expect(tree).to_contain_text("nested")
    expect(tree.locator(".v-boolean")).to_have_text("true")


def test_a_syntax_error_shows_the_caret(servers: Servers, page: Any, shots: Path) -> None:
    page.goto(servers.agent + "/#/playground")
    run_program(page, "let a = 1\nlet x = (1 + )")
    err = page.get_by_test_id("run-error")
    expect(err).to_contain_text("SyntaxError")
    caret = page.get_by_test_id("caret")
    expect(caret).to_be_visible()
    lines = caret.inner_text().split("\n")
    assert lines[0].endswith("| let x = (1 + )")
    # The caret sits under the ')' the parser stopped at.
    assert lines[1].index("^") == lines[0].index(")")
    # And the editor marks the same token.
    expect(page.locator(".cm-error-mark")).to_have_text(")")
    page.screenshot(path=str(shots / "playground-error.png"))


def test_completion_offers_builtins(servers: Servers, page: Any) -> None:
    page.goto(servers.agent + "/#/playground")
    expect(page.locator(".builtin-list li").first).to_be_visible()
    page.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.press("Delete")
    page.keyboard.type("sort_")
    options = page.locator(".cm-tooltip-autocomplete li")
    expect(options.filter(has_text="sort_by")).to_have_count(1)


def test_reference_example_loads_into_the_editor(servers: Servers, page: Any) -> None:
    page.goto(servers.agent + "/#/playground")
    page.get_by_label("Search builtins").fill("reverse")
    page.locator(".builtin-list button", has_text="reverse").first.click()
    example = page.locator(".builtin-info .example").first
    expect(example).to_be_visible()
    text = example.inner_text()
    example.click()
    expect(page.locator(".cm-content")).to_have_text(text)


def test_the_editor_marks_errors_before_run(servers: Servers, page: Any, shots: Path) -> None:
    """Diagnostics, completions and hovers from POST /api/v1/analyse (the language server's
    front end), as you type and before anything runs."""
    page.goto(servers.agent + "/#/playground")
    expect(page.locator(".builtin-list li").first).to_be_visible()
    editor = page.locator(".cm-content")
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.press("Delete")
    page.keyboard.insert_text("let total = 1\nlet x = totl + 1")
    mark = page.locator(".cm-lintRange-error")
    expect(mark).to_have_count(1, timeout=15_000)
    expect(mark).to_have_text("totl")
    mark.hover()
    expect(page.locator(".cm-tooltip-lint")).to_contain_text('did you mean "total"?')
    page.screenshot(path=str(shots / "playground-diagnostics.png"))
    # Nothing ran: there is no result and no run error.
    expect(page.get_by_test_id("run-error")).to_have_count(0)
    # Fixing the name clears the mark.
    page.keyboard.press("Control+End")
    page.keyboard.press("Control+a")
    page.keyboard.insert_text("let total = 1\nlet x = total + 1\nlet y = to")
    expect(mark).to_have_count(0, timeout=15_000)
    # Completion offers the binding in scope.
    page.keyboard.press("Control+Space")
    expect(page.locator(".cm-tooltip-autocomplete")).to_contain_text("total")
    page.keyboard.press("Escape")
    # Hover over a builtin shows its documentation.
    page.keyboard.press("Control+a")
    page.keyboard.insert_text('sort_by([3, 1], fn(x) => x)')
    page.locator(".cm-content").get_by_text("sort_by").hover()
    expect(page.locator(".cm-conch-hover")).to_contain_text("sort_by", timeout=15_000)
