"""Editor features read from an :class:`~conch.lsp.analysis.Analysis` at a position:
completions (bindings in scope, fields of a record, builtins with their documentation),
hover, signature help, go to definition, references and the document's symbols.

Positions are 0-based lines and characters in code points, as in :mod:`.analysis`.
"""

from __future__ import annotations

import re
from typing import Any

from conch.lang import ast as A
from conch.lang.builtins.registry import (
    Builtin,
    all_builtins,
    lookup,
)
from conch.lang.lexer import KEYWORDS
from conch.lsp.analysis import (
    Analysis,
    CompletionItem,
    Def,
    HoverInfo,
    Pos,
    Range,
    Ref,
    SignatureInfo,
    SymbolInfo,
    Unit,
)

# -- builtins -------------------------------------------------------------------------------

_builtin_items: list[CompletionItem] | None = None


def builtin_markdown(b: Builtin, examples: int = 3) -> str:
    parts = []
    for m in b.overloads or (b,):
        text = f"```conch\n{m.signature}\n```\n{m.description}\n\n*{m.category}*, effect: `{m.effect}`"
        if m.aliases:
            text += f", aliases: {', '.join(m.aliases)}"
        shown = m.examples[:examples]
        if shown:
            text += "\n\nExamples:\n```conch\n" + "\n".join(_example_line(e) for e in shown) + "\n```"
        parts.append(text)
    return "\n\n---\n\n".join(parts)


def _example_line(e: Any) -> str:
    from conch.lang import values

    if e.has_result:
        return f"{e.code}    # {values.render(e.result)}"
    return f"{e.code}    # {e.type}"


def _builtins() -> list[CompletionItem]:
    global _builtin_items
    if _builtin_items is None:
        items = []
        seen: set[str] = set()
        for b in all_builtins():
            for name in (b.name, *b.aliases):
                if name in seen:
                    continue
                seen.add(name)
                entry = lookup(name) or b
                items.append(CompletionItem(name, "function", entry.signature,
                                            builtin_markdown(entry, examples=2), sort_text=f"2{name}"))
        _builtin_items = items
    return _builtin_items


def warm_up() -> None:
    """Build what the first completion would (every builtin's item)."""
    _builtins()


# -- queries --------------------------------------------------------------------------------


def _detail(u: Unit, d: Def) -> str:
    if d.kind == "fn" or (d.params is not None and d.kind in ("let", "let mut")):
        params = ", ".join(_param_text(u, p) for p in d.params or [])
        return f"fn {d.name}({params})" if d.kind == "fn" else f"{d.kind} {d.name} = fn({params})"
    if d.kind in ("let", "let mut"):
        v = d.value
        if v is not None and v.line == v.end_line and 1 <= v.line <= len(u.lines):
            value = u.lines[v.line - 1][v.col - 1 : v.end_col - 1]
            if len(value) > 60:
                value = value[:57] + "..."
            return f"{d.kind} {d.name} = {value}"
        return f"{d.kind} {d.name}"
    label = {"param": "parameter", "for": "loop variable", "match": "pattern variable", "catch": "caught error"}
    return f"({label.get(d.kind, d.kind)}) {d.name}"


def _param_text(u: Unit, p: A.Param) -> str:
    if p.default is None:
        return p.name
    dv = p.default
    if dv.line == dv.end_line and 1 <= dv.line <= len(u.lines):
        return f"{p.name} = {u.lines[dv.line - 1][dv.col - 1 : dv.end_col - 1]}"
    return f"{p.name} = ..."


def _visible(an: Analysis, i: int, pos: Pos) -> dict[str, tuple[int, Def]]:
    """The bindings that can be named at a position, by name."""
    out: dict[str, tuple[int, Def]] = {}
    for k, c in enumerate(an.chunks):
        for name, d in c.unit.top_fns.items():
            out.setdefault(name, (k, d))
    for k in range(i):
        for name, d in an.chunks[k].unit.top_defs.items():
            out[name] = (k, d)
    u = an.chunks[i].unit
    for s in u.scopes:  # outer scopes come first: inner bindings win
        if s.parent is not None and not (s.start <= pos <= s.end):
            continue
        for d in s.defs:
            if d.kind == "fn" or d.visible <= pos:
                out[d.name] = (i, d)
    return out


def _fields_of(node: A.Node | None) -> list[str]:
    if isinstance(node, A.RecordLit):
        return [k for k, _ in node.entries]
    if isinstance(node, A.ArrayLit):
        seen: dict[str, None] = {}
        for item in node.items:
            for k in _fields_of(item):
                seen[k] = None
        return list(seen)
    return []


def _field_value(node: A.Node | None, name: str) -> A.Node | None:
    if isinstance(node, A.RecordLit):
        for k, v in node.entries:
            if k == name:
                return v
    return None


_FIELD_PATH = re.compile(r"([A-Za-z_][\w$]*(?:\??\.[A-Za-z_][\w$]*)*)\??\.([\w$]*)$")
_PROJECTION = re.compile(r"\|\s*\??\.([\w$]*)$")
_WORD = re.compile(r"[\w$]*$")


def completions(an: Analysis, line: int, character: int) -> list[CompletionItem]:
    """Completion items at a position: record fields after ``name.``, else named parameters
    of the builtin being called, bindings in scope, builtins and keywords."""
    text = an.lines[line] if line < len(an.lines) else ""
    prefix = text[:character]
    i, pos = an.rel(line, character)
    visible = _visible(an, i, pos)
    m = _FIELD_PATH.search(prefix)
    if m and not re.search(r"\d\.[\w$]*$", prefix):
        path = re.split(r"\??\.", m.group(1))
        found = visible.get(path[0])
        node = found[1].value if found else None
        for name in path[1:]:
            node = _field_value(node, name)
        return [CompletionItem(f, "field", detail=f"field of {m.group(1)}", sort_text=f"0{f}")
                for f in _fields_of(node)]
    m = _PROJECTION.search(prefix)
    if m:
        names: dict[str, None] = {}
        for _, d in visible.values():
            for f in _fields_of(d.value):
                names[f] = None
        return [CompletionItem(f, "field", detail="field", sort_text=f"0{f}") for f in names]
    items: list[CompletionItem] = []
    call = _enclosing_call(an, line, character)
    if call is not None:
        b = lookup(call[0]) if call[0] not in visible else None
        if b is not None:
            for p in b.params:
                if not p.variadic:
                    items.append(CompletionItem(f"{p.name}=", "property", detail=f"{p.name}: {p.type}",
                                                documentation=f"parameter of `{b.signature}`",
                                                sort_text=f"0{p.name}"))
    for name, (k, d) in visible.items():
        kind = "function" if d.kind == "fn" or d.params is not None else "variable"
        items.append(CompletionItem(name, kind, detail=_detail(an.chunks[k].unit, d), sort_text=f"1{name}"))
    items.extend(b for b in _builtins() if b.label not in visible)
    items.extend(CompletionItem(k, "keyword", sort_text=f"3{k}") for k in sorted(KEYWORDS))
    return items


def _object_at(an: Analysis, line: int, character: int) -> tuple[int, Def | Ref] | None:
    i, pos = an.rel(line, character)
    obj = an.chunks[i].unit.at(pos)
    return None if obj is None else (i, obj)


def hover(an: Analysis, line: int, character: int) -> HoverInfo | None:
    """A builtin's signature, description and examples; a binding's declaration."""
    found = _object_at(an, line, character)
    if found is None:
        return None
    i, obj = found
    rng = an.def_range(i, obj) if isinstance(obj, Def) else an.ref_range(i, obj)
    target = an.target(i, obj)
    if target is None:
        b = lookup(obj.name)
        if b is None:
            return None
        return HoverInfo(builtin_markdown(b), rng)
    k, d = target
    return HoverInfo(f"```conch\n{_detail(an.chunks[k].unit, d)}\n```", rng)


def definition(an: Analysis, line: int, character: int) -> Range | None:
    """Where the binding named at a position is made (the name in its ``let``/``fn``...)."""
    found = _object_at(an, line, character)
    if found is None:
        return None
    target = an.target(*found)
    if target is None:
        return None
    return an.def_range(*target)


def references(an: Analysis, line: int, character: int, include_declaration: bool = True) -> list[Range]:
    """Every place that names the binding named at a position."""
    found = _object_at(an, line, character)
    if found is None:
        return []
    target = an.target(*found)
    if target is None:
        return []
    k, d = target
    out = [an.def_range(k, d)] if include_declaration else []
    for r in an.chunks[k].unit.refs:
        if r.target is d:
            out.append(an.ref_range(k, r))
    if d.top:
        for j, c in enumerate(an.chunks):
            if j == k:
                continue
            for r in c.unit.free:
                if r.name == d.name and an.outer(j, r.name) == (k, d):
                    out.append(an.ref_range(j, r))
    return out


def document_symbols(an: Analysis) -> list[SymbolInfo]:
    """The ``let`` and ``fn`` bindings, those inside a function as its children."""

    def sym(i: int, d: Def) -> SymbolInfo:
        u = an.chunks[i].unit
        kind = "function" if d.kind == "fn" or d.params is not None else "variable"
        l0, c0, l1, c1 = d.span
        return SymbolInfo(d.name, kind, _detail(u, d), an.abs_range(i, l0, c0, l1, c1), an.def_range(i, d),
                          [sym(i, c) for c in d.children])

    return [sym(i, d) for i, c in enumerate(an.chunks) for d in c.unit.symbols]


_OPEN = {")": "(", "]": "[", "}": "{"}


def _enclosing_call(an: Analysis, line: int, character: int) -> tuple[str, int, bool, str] | None:
    """(callee name, index of the argument at the position, piped, that argument's text so
    far) for the innermost ``name(`` call around a position."""
    start = max(0, line - 30)
    current = an.lines[line][:character] if line < len(an.lines) else ""
    before = "\n".join([*an.lines[start:line], current])
    depth: list[str] = []
    commas = 0
    last_comma = len(before)
    in_str = False
    for j in range(len(before) - 1, -1, -1):
        ch = before[j]
        if ch == '"' and (j == 0 or before[j - 1] != "\\"):
            in_str = not in_str
            continue
        if in_str:
            continue
        if ch in _OPEN:
            depth.append(ch)
        elif ch in "([{":
            if depth:
                depth.pop()
                continue
            if ch != "(":
                return None
            m = re.search(r"([A-Za-z_][\w$]*)\s*$", before[:j])
            if m is None:
                return None
            piped = re.search(r"\|\s*$", before[: m.start()]) is not None
            return m.group(1), commas, piped, before[last_comma + 1 if commas else j + 1 :]
        elif ch == "," and not depth:
            if commas == 0:
                last_comma = j
            commas += 1
    return None


def signature_help(an: Analysis, line: int, character: int) -> SignatureInfo | None:
    """The signature of the builtin or named function being called at a position."""
    call = _enclosing_call(an, line, character)
    if call is None:
        return None
    name, index, piped, current = call
    i, pos = an.rel(line, character)
    visible = _visible(an, i, pos)
    kw = re.match(r"\s*([A-Za-z_][\w$]*)\s*=(?!=)", current)
    if name in visible:
        k, d = visible[name]
        if d.params is None:
            return None
        u = an.chunks[k].unit
        params = [_param_text(u, p) for p in d.params]
        names = [p.name for p in d.params]
        label = f"{name}({', '.join(params)})"
        doc = ""
    else:
        b = lookup(name)
        if b is None:
            return None
        params = [f"{'...' if p.variadic else ''}{p.name}: {p.type}" for p in b.params]
        names = [p.name for p in b.params]
        label, doc = b.signature, b.description
        # the signature's own rendering of defaults: take each parameter's text from it
        inner = label[label.index("(") + 1 : label.rindex(")")]
        parts = _split_params(inner)
        if len(parts) == len(params):
            params = parts
    active = index + (1 if piped else 0)
    if kw and kw.group(1) in names:
        active = names.index(kw.group(1))
    if names and active >= len(names) and params[-1].startswith("..."):
        active = len(names) - 1
    return SignatureInfo(label, doc, params, active)


def _split_params(inner: str) -> list[str]:
    out, depth, cur, quote = [], 0, "", False
    for ch in inner:
        if ch == '"':
            quote = not quote
        if not quote:
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            elif ch == "," and depth == 0:
                out.append(cur.strip())
                cur = ""
                continue
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out
