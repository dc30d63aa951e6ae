"""The language server's analysis: document text in, diagnostics, bindings and answers out."""

from __future__ import annotations

import pathlib

from conch.lsp import analysis as an
from conch.lsp import queries

DOC = """\
let x = 1
let rec = {name: "a", nested: {ok: true}}
fn square(y) => y * y
let z = lenn([1])
len([1], 2)
sort_by([1], "x", desk=true)
[1, 2] | map
x = 3
let w = square(x) + rec.name
"""


def messages(text: str) -> list[tuple[an.Range, str]]:
    return [(d.range, d.message) for d in an.analyse(text).diagnostics]


def test_clean_document_has_no_diagnostics() -> None:
    tour = (pathlib.Path(__file__).parents[2] / "examples" / "tour.conch").read_text()
    assert an.analyse(tour).diagnostics == []


def test_diagnostics_with_exact_ranges() -> None:
    diags = an.analyse(DOC).diagnostics
    got = [(d.range, d.kind, d.message, d.hint) for d in diags]
    assert got == [
        ((3, 8, 3, 12), "NameError", "unknown name 'lenn'", 'did you mean "len"?'),
        ((4, 9, 4, 10), "TypeError", "len() takes 1 argument but 2 were given", None),
        ((5, 18, 5, 22), "TypeError", "sort_by() got an unexpected keyword argument 'desk'", 'did you mean "desc"?'),
        ((6, 9, 6, 12), "TypeError", "map() missing 1 required argument: 'fn'", None),
        ((7, 0, 7, 1), "SyntaxError", "cannot assign twice to immutable 'x'", None),
    ]


def test_syntax_error_range_and_line_numbers_of_the_document() -> None:
    text = "let a = 1\nlet b = 2\nlet c = (1 + )\n"
    [d] = an.analyse(text).diagnostics
    assert (d.range, d.kind, d.message) == ((2, 13, 2, 14), "SyntaxError", "unexpected ')'")
    text = "let a = 1\nlet b = foo(1,\n"
    [d] = an.analyse(text).diagnostics
    assert d.message == "expected ')' but the program ended"
    assert d.hint == "'(' opened at line 2, column 12 is not closed"


def test_statements_spanning_lines_and_later_errors() -> None:
    text = "let a = [1,\n2,\n3]\nlet b = a\n  | map(fn(v) => v + 1)\nfn f(n) {\nlet k = n\nk\n}\nlet c = f(b) + nope\n"
    assert messages(text) == [((9, 15, 9, 19), "unknown name 'nope'")]


def test_names_across_statements() -> None:
    # a function may be called above its definition; a let only after it
    assert messages("let a = later(1)\nfn later(n) => n + b\nlet b = 2\n") == [
        ((1, 19, 1, 20), "unknown name 'b'")
    ]
    assert messages("let mut n = 0\nn = n + 1\nlet f = fn() => n\n") == []
    assert messages("args | len\n") == []


def test_shadowed_builtin_is_not_checked_against_its_signature() -> None:
    assert messages("fn len(a, b) => a\nlen(1, 2)\n") == []
    assert messages("let map = 3\nmap\n") == []


def test_pipes_count_the_piped_value() -> None:
    assert messages('"a,b" | split(",")\n[1] | len\n') == []
    assert messages("[1] | len(2)\n") == [((0, 10, 0, 11), "len() takes 1 argument but 2 were given")]


def test_definition_and_references() -> None:
    a = an.analyse(DOC)
    assert queries.definition(a, 8, 15) == (0, 4, 0, 5)  # x in square(x)
    assert queries.definition(a, 8, 9) == (2, 3, 2, 9)  # square
    assert queries.definition(a, 2, 17) == (2, 10, 2, 11)  # the parameter y
    assert queries.references(a, 0, 4) == [(0, 4, 0, 5), (7, 0, 7, 1), (8, 15, 8, 16)]
    assert queries.references(a, 0, 4, include_declaration=False) == [(7, 0, 7, 1), (8, 15, 8, 16)]
    assert queries.definition(a, 4, 1) is None  # a builtin


def test_scopes_inside_functions() -> None:
    text = "let v = 1\nfn f(v) {\n  let w = v\n  w\n}\nv\n"
    a = an.analyse(text)
    assert queries.definition(a, 2, 10) == (1, 5, 1, 6)  # the parameter, not the top-level v
    assert queries.definition(a, 5, 0) == (0, 4, 0, 5)
    assert queries.definition(a, 3, 2) == (2, 6, 2, 7)


def test_hover() -> None:
    a = an.analyse(DOC)
    h = queries.hover(a, 4, 1)
    assert h is not None
    assert "len(value: String | Array | Record | Range) -> Int" in h.markdown
    assert "Examples" in h.markdown
    assert h.range == (4, 0, 4, 3)
    h = queries.hover(a, 8, 9)
    assert h is not None and "fn square(y)" in h.markdown
    assert queries.hover(a, 1, 12) is None  # inside a string


def test_completion() -> None:
    a = an.analyse(DOC)
    items = {c.label: c for c in queries.completions(a, 9, 0)}
    assert items["sort_by"].kind == "function"
    assert items["sort_by"].detail.startswith("sort_by(items: Array")
    assert items["square"].detail == "fn square(y)"
    assert items["rec"].kind == "variable"
    assert "match" in items
    fields = an.analyse(DOC + "rec.nested.")
    assert [c.label for c in queries.completions(fields, 9, 11)] == ["ok"]
    fields = an.analyse(DOC + "rec.")
    assert [c.label for c in queries.completions(fields, 9, 4)] == ["name", "nested"]


def test_completion_in_scope_and_named_parameters() -> None:
    text = "fn f(alpha) {\n  let beta = 1\n  \n}\nsort_by([1], \n"
    a = an.analyse(text)
    inside = {c.label for c in queries.completions(a, 2, 2)}
    assert {"alpha", "beta", "f"} <= inside
    outside = {c.label for c in queries.completions(a, 4, 13)}
    assert "alpha" not in outside and "beta" not in outside
    assert {"desc=", "key="} <= outside


def test_completion_while_the_line_does_not_parse() -> None:
    text = "fn f(alpha) {\n  let beta = {q: 1}\n  beta.\n}\n"
    a = an.analyse(text)
    assert a.diagnostics  # the incomplete line
    assert [c.label for c in queries.completions(a, 2, 7)] == ["q"]


def test_signature_help() -> None:
    a = an.analyse('sort_by([1], "k", ')
    s = queries.signature_help(a, 0, 18)
    assert s is not None
    assert s.label == "sort_by(items: Array, key: String | Function, desc: Bool = false) -> Array"
    assert s.parameters == ["items: Array", "key: String | Function", "desc: Bool = false"]
    assert s.active_parameter == 2
    a = an.analyse("[3, 1] | sort_by(")
    s = queries.signature_help(a, 0, 17)
    assert s is not None and s.active_parameter == 1  # the piped value is the first argument
    a = an.analyse("fn add(a, b = 2) => a + b\nadd(1, ")
    s = queries.signature_help(a, 1, 7)
    assert s is not None and s.label == "add(a, b = 2)" and s.active_parameter == 1


def test_document_symbols() -> None:
    text = "let a = 1\nfn f(x) {\n  let inner = x\n  inner\n}\nlet g = fn(y) => y\n"
    syms = queries.document_symbols(an.analyse(text))
    assert [(s.name, s.kind) for s in syms] == [("a", "variable"), ("f", "function"), ("g", "function")]
    assert syms[1].range == (1, 0, 4, 1)
    assert syms[1].selection_range == (1, 3, 1, 4)
    assert [c.name for c in syms[1].children] == ["inner"]


def big_document(lines: int = 1000) -> str:
    """A realistic document: the tour's statements, their names numbered per copy."""
    import re

    tour = (pathlib.Path(__file__).parents[2] / "examples" / "tour.conch").read_text().splitlines()[3:41]
    names = r"\b(name|n|square|clamp|double|rec|fields|indexing|total|big|joined|summed|value|bumped|table|column|file_count|first_notes|kind|kinds|r|thrown)\b"
    out: list[str] = []
    copy = 0
    while len(out) < lines:
        suffix = str(copy)
        out += [re.sub(names, lambda m, s=suffix: m.group(1) + s, line) for line in tour]
        copy += 1
    return "\n".join(out[:lines]) + "\n"


def test_latency_of_a_1000_line_document(capsys: object) -> None:
    """The document the latencies are measured on analyses cleanly; the timings themselves
    are benchmarks/lsp.py's (docs/lsp.md)."""
    text = big_document()
    a = an.analyse(text)
    assert a.diagnostics == []
