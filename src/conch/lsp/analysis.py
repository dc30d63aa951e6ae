"""Editor features as pure functions of a document's text (no LSP types here).

:func:`analyse` turns a document into an :class:`Analysis`: diagnostics (syntax errors from the
parser, unknown names from the compiler with its did-you-mean hint, wrong argument counts
against the builtin registry's signatures), the ``let``/``fn`` bindings and every name that
refers to them. The query functions (completions, hover, signature help, definition,
references, document symbols) read an analysis at a position: :mod:`.queries`.

Positions here are 0-based lines and 0-based characters counted in code points (what Python
indexes strings by); :mod:`.server` converts them to the client's encoding.

Speed: a document is cut into top-level statements ("chunks", each starting at column 0 of a
line) and each chunk is lexed, parsed, resolved and compiled on its own, cached by its text.
An edit re-analyses only the chunk it touches; other chunks are cache hits (their positions are
kept relative to the chunk's first line). A chunk that does not parse because it runs on into
the next one (an unclosed bracket, a trailing ``|``) is merged with the following chunks until
it does. The only link between chunks is the top-level bindings: each chunk is compiled as a
session input given the earlier ``let``s and every top-level ``fn`` (which the whole-program
compiler predeclares) that it mentions, so the compiler reports exactly the unknown names a
run of the whole program would.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Any

from conch.lang import ast as A
from conch.lang.builtins.registry import (
    EMPTY,
    KEYWORD_ONLY,
    POSITIONAL,
    VAR_KEYWORD,
    VAR_POSITIONAL,
    Builtin,
    lookup,
)
from conch.lang.compiler import Compiler
from conch.lang.emit import Binding, Func
from conch.lang.errors import ConchError, did_you_mean
from conch.lang.lexer import tokenize
from conch.lang.parser import Parser

Pos = tuple[int, int]  # chunk-relative conch position: 1-based line, 1-based column
Range = tuple[int, int, int, int]  # 0-based start line, start char, end line, end char

# Names a program is given when run (``conch run FILE ARGS`` and ``conch -c`` bind ``args``).
KNOWN_GLOBALS = frozenset({"args"})

_CACHE_LIMIT = 4096
_MERGE_LINES = 200  # the longest statement looked for when one runs on past column-0 lines


# -- results -------------------------------------------------------------------------------


@dataclass
class Diagnostic:
    range: Range
    message: str
    kind: str  # the conch error kind: SyntaxError, NameError, TypeError
    hint: str | None = None
    severity: str = "error"


@dataclass
class CompletionItem:
    label: str
    kind: str  # "function", "variable", "keyword", "field", "property"
    detail: str = ""
    documentation: str = ""
    insert_text: str | None = None
    sort_text: str | None = None


@dataclass
class HoverInfo:
    markdown: str
    range: Range


@dataclass
class SignatureInfo:
    label: str
    documentation: str
    parameters: list[str]  # each parameter's text as it appears in ``label``
    active_parameter: int


@dataclass
class SymbolInfo:
    name: str
    kind: str  # "function" or "variable"
    detail: str
    range: Range
    selection_range: Range
    children: list[SymbolInfo] = field(default_factory=list)


# -- per-chunk structures (chunk-relative positions) ----------------------------------------


class Def:
    """A binding: ``let``, ``fn``, a parameter, a loop or pattern variable, a caught error."""

    __slots__ = ("children", "col", "end_col", "kind", "line", "name", "params", "span", "top",
                 "value", "visible")

    def __init__(self, name: str, kind: str, line: int, col: int, span: tuple[int, int, int, int],
                 visible: Pos, value: A.Node | None = None, params: list[A.Param] | None = None) -> None:
        self.name = name
        self.kind = kind  # "let", "let mut", "fn", "param", "for", "match", "catch"
        self.line, self.col, self.end_col = line, col, col + len(name)
        self.span = span  # the whole statement (for symbols), 1-based, end exclusive
        self.visible = visible  # from where on it can be named
        self.value = value
        self.params = params
        self.top = False
        self.children: list[Def] = []


class Ref:
    __slots__ = ("col", "end_col", "line", "name", "target")

    def __init__(self, name: str, line: int, col: int, target: Def | None) -> None:
        self.name = name
        self.line, self.col, self.end_col = line, col, col + len(name)
        self.target = target  # None: not bound in the chunk (an earlier chunk's, a builtin, unknown)


class _Scope:
    __slots__ = ("defs", "end", "names", "parent", "start")

    def __init__(self, parent: _Scope | None, start: Pos, end: Pos) -> None:
        self.parent = parent
        self.start, self.end = start, end
        self.names: dict[str, Def] = {}
        self.defs: list[Def] = []

    def lookup(self, name: str) -> Def | None:
        s: _Scope | None = self
        while s is not None:
            d = s.names.get(name)
            if d is not None:
                return d
            s = s.parent
        return None


class _Call:
    __slots__ = ("args", "callee", "kwargs", "piped")

    def __init__(self, callee: Ref, args: list[A.Node], kwargs: list[tuple[str, A.Node]], piped: bool) -> None:
        self.callee = callee
        self.args = args
        self.kwargs = kwargs
        self.piped = piped


class Unit:
    """One chunk: its parse, bindings and references, and what it needs from outside."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.split("\n")
        self.tree: A.Program | None = None
        self.error: ConchError | None = None
        self.mergeable = False  # failed at its end: it may run on into the next chunk
        self.defs: list[Def] = []
        self.refs: list[Ref] = []
        self.free: list[Ref] = []  # references to names not bound in the chunk
        self.calls: list[_Call] = []
        self.scopes: list[_Scope] = []
        self.top_defs: dict[str, Def] = {}  # top-level bindings, the last of each name
        self.top_fns: dict[str, Def] = {}
        self.symbols: list[Def] = []
        self.index: dict[int, list[tuple[int, int, Def | Ref]]] = {}
        self.mentioned: frozenset[str] = frozenset()
        self.compiled: dict[tuple[Any, ...], list[tuple[Range, str, str, list[str]]]] = {}

    def parse(self) -> None:
        parser: Parser | None = None
        try:
            parser = Parser(tokenize(self.text), self.text)
            self.tree = parser.parse_program()
        except RecursionError:
            self.error = ConchError("SyntaxError", "the program is nested too deeply", line=1, column=1)
        except ConchError as err:
            self.error = err
            if parser is None:  # the lexer's: a string or interpolation left open runs on
                self.mergeable = "unterminated" in err.message
            else:
                self.mergeable = parser.tok.kind == "eof"

    def recover(self) -> None:
        """A tree for navigation and completion despite a syntax error: the offending line (or
        the one before it, when the error shows only on the next line) is blanked, positions
        kept, until the rest parses (a few tries)."""
        lines = list(self.lines)
        err = self.error
        for _ in range(4):
            if err is None or err.line is None or not 1 <= err.line <= len(lines):
                return
            at = err.line - 1
            before = next((k for k in range(at - 1, -1, -1) if lines[k].strip()), None)
            best: tuple[tuple[int, int], list[str], ConchError] | None = None
            for k in (at, before):
                if k is None:
                    continue
                trial = list(lines)
                trial[k] = ""
                text = "\n".join(trial)
                try:
                    self.tree = Parser(tokenize(text), text).parse_program()
                    return
                except RecursionError:
                    return
                except ConchError as exc:
                    where = (exc.line or 0, exc.column or 0)
                    if best is None or where > best[0]:
                        best = (where, trial, exc)
            assert best is not None
            _, lines, err = best

    def resolve(self) -> None:
        if self.tree is None:
            return
        _Resolver(self).program(self.tree)
        for r in self.refs:
            self.index.setdefault(r.line, []).append((r.col, r.end_col, r))
        for d in self.defs:
            self.index.setdefault(d.line, []).append((d.col, d.end_col, d))
        self.mentioned = frozenset(r.name for r in self.free)

    def at(self, pos: Pos) -> Def | Ref | None:
        line, col = pos
        for start, end, obj in self.index.get(line, ()):
            if start <= col <= end:
                return obj
        return None


_units: dict[str, Unit] = {}


def clear_cache() -> None:
    """Forget every analysed document (the next analysis of any text starts cold)."""
    _units.clear()


def _unit(text: str) -> Unit:
    u = _units.get(text)
    if u is None:
        if len(_units) >= _CACHE_LIMIT:
            _units.clear()
        u = Unit(text)
        u.parse()
        if u.tree is None and not u.mergeable:
            u.recover()
        u.resolve()
        _units[text] = u
    return u


# -- resolving names ------------------------------------------------------------------------


def _start(n: A.Node) -> Pos:
    return (n.line, n.col)


def _end(n: A.Node) -> Pos:
    return (n.end_line, n.end_col)


class _Resolver:
    """Walks a chunk's tree in the compiler's order with the compiler's scoping rules."""

    def __init__(self, unit: Unit) -> None:
        self.u = unit
        self.scope = _Scope(None, (1, 1), (1 << 30, 0))
        unit.scopes.append(self.scope)
        self.owner: list[list[Def]] = [unit.symbols]  # where let/fn symbols go

    # scopes and bindings

    def push(self, start: Pos, end: Pos) -> _Scope:
        self.scope = _Scope(self.scope, start, end)
        self.u.scopes.append(self.scope)
        return self.scope

    def pop(self) -> None:
        assert self.scope.parent is not None
        self.scope = self.scope.parent

    def bind(self, d: Def) -> Def:
        self.scope.names[d.name] = d
        self.scope.defs.append(d)
        self.u.defs.append(d)
        if self.scope.parent is None:
            d.top = True
            self.u.top_defs[d.name] = d
            if d.kind == "fn":
                self.u.top_fns.setdefault(d.name, d)
        if d.kind in ("let", "let mut", "fn"):
            self.owner[-1].append(d)
        return d

    def ref(self, name: str, line: int, col: int) -> Ref:
        r = Ref(name, line, col, self.scope.lookup(name))
        self.u.refs.append(r)
        if r.target is None:
            self.u.free.append(r)
        return r

    def find(self, start: Pos, name: str, limit_lines: int = 3) -> Pos:
        """Where ``name`` is written at or after ``start`` (nodes keep no position for some names)."""
        lines = self.u.lines
        pat = re.compile(rf"(?<![\w$]){re.escape(name)}(?![\w$])")
        line, col = start
        for i in range(line - 1, min(len(lines), line - 1 + limit_lines)):
            m = pat.search(lines[i], col - 1 if i == line - 1 else 0)
            if m:
                return (i + 1, m.start() + 1)
        return start

    # statements

    def program(self, prog: A.Program) -> None:
        self.statements(prog.stmts)

    def statements(self, stmts: list[A.Node]) -> None:
        fns: dict[int, Def] = {}
        for s in stmts:
            if isinstance(s, A.FnDef):
                line, col = self.find((s.line, s.col + 2), s.name, 1)
                fns[id(s)] = self.bind(Def(s.name, "fn", line, col, (s.line, s.col, s.end_line, s.end_col),
                                           (self.scope.start), s.fn, s.fn.params))
        for s in stmts:
            if isinstance(s, A.FnDef):
                d = fns[id(s)]
                self.owner.append(d.children)
                self.lam(s.fn)
                self.owner.pop()
            else:
                self.stmt(s)

    def stmt(self, s: A.Node) -> None:
        if isinstance(s, A.Let):
            self.expr(s.value)
            kind = "let mut" if s.mutable else "let"
            self.pattern(s.target, kind, _end(s), (s.line, s.col, s.end_line, s.end_col), s.value)
        elif isinstance(s, A.Assign):
            self.ref(s.name, s.line, s.col)
            self.expr(s.value)
        elif isinstance(s, A.For):
            self.expr(s.iterable)
            self.push(_start(s), _end(s))
            self.pattern(s.var, "for", _start(s.var), None, None)
            self.statements(s.body.stmts)
            self.pop()
        elif isinstance(s, A.While):
            self.expr(s.cond)
            self.block(s.body)
        else:
            self.expr(s)

    def block(self, b: A.Block) -> None:
        self.push(_start(b), _end(b))
        self.statements(b.stmts)
        self.pop()

    def pattern(self, p: A.Pattern, kind: str, visible: Pos, span: tuple[int, int, int, int] | None,
                value: A.Node | None) -> None:
        if isinstance(p, A.PBind):
            sp = span or (p.line, p.col, p.end_line, p.end_col)
            self.bind(Def(p.name, kind, p.line, p.col, sp, visible, value,
                          value.params if isinstance(value, A.Lambda) else None))
        elif isinstance(p, A.PArray):
            for item in p.items:
                self.pattern(item, kind, visible, span, None)
            if p.rest and p.rest != "_":
                line, col = self.find((p.line, p.col), p.rest)
                self.bind(Def(p.rest, kind, line, col, span or (line, col, line, col + len(p.rest)), visible))
        elif isinstance(p, A.PRecord):
            for _, sub in p.fields:
                self.pattern(sub, kind, visible, span, None)
        elif isinstance(p, A.POr) and p.options:
            self.pattern(p.options[0], kind, visible, span, None)

    def lam(self, lam: A.Lambda) -> None:
        for p in lam.params:
            if p.default is not None:
                self.expr(p.default)
        self.push(_start(lam), _end(lam))
        for p in lam.params:
            self.bind(Def(p.name, "param", p.line, p.col, (p.line, p.col, p.line, p.col + len(p.name)),
                          (lam.line, lam.col)))
        if isinstance(lam.body, A.Block):
            self.statements(lam.body.stmts)
        else:
            self.expr(lam.body)
        self.pop()

    # expressions

    def expr(self, n: A.Node | None) -> None:
        if n is None:
            return
        t = type(n)
        if t is A.Name:
            assert isinstance(n, A.Name)
            self.ref(n.name, n.line, n.col)
        elif t is A.Literal or t is A.Raw or t is A.Break or t is A.Continue:
            return
        elif t is A.Call:
            assert isinstance(n, A.Call)
            self.call(n, piped=False)
        elif t is A.Pipe:
            assert isinstance(n, A.Pipe)
            self.expr(n.left)
            right = n.right
            if isinstance(right, A.Call):
                self.call(right, piped=True)
            elif isinstance(right, A.Name):
                r = self.ref(right.name, right.line, right.col)
                self.u.calls.append(_Call(r, [], [], True))
            else:
                self.expr(right)
        elif t is A.Binary:
            assert isinstance(n, A.Binary)
            self.expr(n.left)
            self.expr(n.right)
        elif t is A.Field:
            assert isinstance(n, A.Field)
            self.expr(n.obj)
        elif t is A.Index:
            assert isinstance(n, A.Index)
            self.expr(n.obj)
            self.expr(n.index)
            self.expr(n.start)
            self.expr(n.stop)
        elif t is A.ArrayLit:
            assert isinstance(n, A.ArrayLit)
            for item in n.items:
                self.expr(item)
        elif t is A.RecordLit:
            assert isinstance(n, A.RecordLit)
            for _, v in n.entries:
                self.expr(v)
        elif t is A.Interp:
            assert isinstance(n, A.Interp)
            for part in n.parts:
                if not isinstance(part, str):
                    self.expr(part)
        elif t is A.Unary:
            assert isinstance(n, A.Unary)
            self.expr(n.operand)
        elif t is A.RangeLit:
            assert isinstance(n, A.RangeLit)
            self.expr(n.start)
            self.expr(n.end)
        elif t is A.Lambda:
            assert isinstance(n, A.Lambda)
            self.lam(n)
        elif t is A.Block:
            assert isinstance(n, A.Block)
            self.block(n)
        elif t is A.If:
            assert isinstance(n, A.If)
            self.expr(n.cond)
            self.block(n.then)
            self.expr(n.orelse)
        elif t is A.Match:
            assert isinstance(n, A.Match)
            self.expr(n.subject)
            for arm in n.arms:
                self.push(_start(arm.pattern), _end(arm.body))
                self.pattern(arm.pattern, "match", _start(arm.pattern), None, None)
                self.expr(arm.guard)
                self.expr(arm.body)
                self.pop()
        elif t is A.Try:
            assert isinstance(n, A.Try)
            self.block(n.body)
            self.push(_end(n.body), _end(n.handler))
            if n.name:
                line, col = self.find(_end(n.body), n.name)
                self.bind(Def(n.name, "catch", line, col, (line, col, line, col + len(n.name)), (line, col)))
            self.statements(n.handler.stmts)
            self.pop()
        elif t is A.Return:
            assert isinstance(n, A.Return)
            self.expr(n.value)
        elif t is A.Throw:
            assert isinstance(n, A.Throw)
            self.expr(n.value)
        elif isinstance(n, A.Let | A.Assign | A.For | A.While | A.FnDef):
            self.stmt(n)

    def call(self, n: A.Call, piped: bool) -> None:
        func = n.func
        if isinstance(func, A.Name):
            r = self.ref(func.name, func.line, func.col)
            self.u.calls.append(_Call(r, n.args, n.kwargs, piped))
        else:
            self.expr(func)
        for a in n.args:
            self.expr(a)
        for _, v in n.kwargs:
            self.expr(v)


# -- the document ---------------------------------------------------------------------------


@dataclass
class Chunk:
    start: int  # 0-based line of the chunk's first line
    unit: Unit


_STARTS_STATEMENT = re.compile(r"[^\s#|})\].,]")
_CONTINUES = re.compile(r"(else|catch)(?![\w$])")


def _chunk_starts(lines: list[str]) -> list[int]:
    starts = [0]
    for i in range(1, len(lines)):
        line = lines[i]
        if line and _STARTS_STATEMENT.match(line) and not _CONTINUES.match(line):
            starts.append(i)
    return starts


class Analysis:
    """A document, analysed: see the module's text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.split("\n")
        self.chunks: list[Chunk] = []
        self.diagnostics: list[Diagnostic] = []
        self._split()
        self._starts = [c.start for c in self.chunks]
        self._check()

    def _split(self) -> None:
        lines = self.lines
        starts = _chunk_starts(lines)
        last = len(starts)
        starts.append(len(lines))
        i = 0
        while i < last:
            first = unit = _unit("\n".join(lines[starts[i]:starts[i + 1]]))
            j = i + 1
            step = 1
            # A chunk that fails at its end may run on into the next ones (an unindented
            # block body, a bracket continued on a line at column 0): merge them, doubling,
            # up to _MERGE_LINES lines. When that never parses, the chunk is on its own (its
            # error points at the chunk rather than at the end of the document, and what
            # follows is still analysed).
            while unit.error is not None and unit.mergeable and j < last:
                j = min(j + step, last)
                step *= 2
                if starts[j] - starts[i] > _MERGE_LINES:
                    break
                unit = _unit("\n".join(lines[starts[i]:starts[j]]))
            if unit.error is not None:
                unit, j = first, i + 1
                if unit.tree is None:
                    unit.recover()
                    unit.resolve()
            self.chunks.append(Chunk(starts[i], unit))
            i = j

    # positions

    def chunk_index(self, line: int) -> int:
        return max(0, bisect.bisect_right(self._starts, line) - 1)

    def rel(self, line: int, character: int) -> tuple[int, Pos]:
        i = self.chunk_index(line)
        return i, (line - self.chunks[i].start + 1, character + 1)

    def abs_range(self, i: int, line: int, col: int, end_line: int, end_col: int) -> Range:
        s = self.chunks[i].start
        return (s + line - 1, col - 1, s + end_line - 1, end_col - 1)

    def def_range(self, i: int, d: Def) -> Range:
        return self.abs_range(i, d.line, d.col, d.line, d.end_col)

    def ref_range(self, i: int, r: Ref) -> Range:
        return self.abs_range(i, r.line, r.col, r.line, r.end_col)

    # top-level bindings across chunks

    def outer(self, i: int, name: str) -> tuple[int, Def] | None:
        """What a name free in chunk ``i`` refers to: the last earlier top-level binding, else
        a top-level ``fn`` anywhere (named functions are defined on entry to the program)."""
        for k in range(i - 1, -1, -1):
            d = self.chunks[k].unit.top_defs.get(name)
            if d is not None:
                return k, d
        for k, c in enumerate(self.chunks):
            d = c.unit.top_fns.get(name)
            if d is not None:
                return k, d
        return None

    def target(self, i: int, obj: Def | Ref) -> tuple[int, Def] | None:
        if isinstance(obj, Def):
            return i, obj
        if obj.target is not None:
            return i, obj.target
        return self.outer(i, obj.name)

    # diagnostics

    def _check(self) -> None:
        env: dict[str, Def] = {}
        for c in self.chunks:
            env.update(c.unit.top_fns)
        top_fns = set(env)
        for i, c in enumerate(self.chunks):
            u = c.unit
            if u.error is not None:
                self.diagnostics.append(self._error_diagnostic(i, u.error))
            elif u.tree is not None:
                key = tuple(sorted((n, env[n].kind, n in top_fns) for n in u.mentioned if n in env))
                found = u.compiled.get(key)
                if found is None:
                    found = _compile_check(u, key)
                    u.compiled[key] = found
                for (l0, c0, l1, c1), kind, message, cands in found:
                    hint = None
                    if kind == "NameError" and message.startswith("unknown name"):
                        name = message.split("'")[1]
                        hint = did_you_mean(name, [*cands, *env, *KNOWN_GLOBALS])
                    self.diagnostics.append(Diagnostic(self.abs_range(i, l0, c0, l1, c1), message, kind, hint))
                for (l0, c0, l1, c1), message, hint in _arity_diagnostics(u, env):
                    self.diagnostics.append(Diagnostic(self.abs_range(i, l0, c0, l1, c1), message, "TypeError", hint))
            env.update(u.top_defs)

    def _error_diagnostic(self, i: int, err: ConchError) -> Diagnostic:
        u = self.chunks[i].unit
        line = min(max(err.line or 1, 1), len(u.lines))
        text = u.lines[line - 1]
        col = min(max(err.column or 1, 1), len(text) + 1)
        end = _token_end(text, col - 1, err.message) + 1
        start = self.chunks[i].start

        def shift(s: str | None) -> str | None:  # "opened at line 2": the chunk's line numbers
            return None if s is None else _LINE_NO.sub(lambda m: f"line {int(m.group(1)) + start}", s)

        message = shift(err.message) or err.message
        return Diagnostic(self.abs_range(i, line, col, line, end), message, err.kind, shift(err.hint))


_LINE_NO = re.compile(r"\bline (\d+)")


_TOKEN = re.compile(r"[A-Za-z_$][\w$]*|\d[\w.]*|\.\.=?|[=!<>]=|=>|&&|\|\||\*\*|//|\?\.|\S")


def _token_end(text: str, start: int, message: str) -> int:
    """The end (0-based, exclusive) of the token an error at ``start`` points at."""
    if start >= len(text):
        return start
    if "unterminated" in message:
        return len(text)
    m = _TOKEN.match(text, start)
    return m.end() if m else start + 1


def _compile_check(u: Unit, key: tuple[Any, ...]) -> list[tuple[Range, str, str, list[str]]]:
    """The compiler's verdict on a chunk given the outer bindings it names: unknown names (with
    the candidates for a hint) and the errors it raises (assigning to an immutable...)."""
    assert u.tree is not None
    main = Func(None)
    session = {name: Binding(name, kind == "let mut", is_fn, main, is_global=True) for name, kind, is_fn in key}
    comp = Compiler(session_globals=session, known_globals=KNOWN_GLOBALS)
    out: list[tuple[Range, str, str, list[str]]] = []
    try:
        with comp.into([]):
            comp.predeclare_fns(u.tree.stmts)
            comp.statements(u.tree.stmts, want_value=True, top=True)
    except ConchError as err:
        line, col = err.line or 1, err.column or 1
        text = u.lines[line - 1] if line <= len(u.lines) else ""
        out.append(((line, col, line, _token_end(text, col - 1, err.message) + 1), err.kind, err.message, []))
        return out
    except RecursionError:
        return [((1, 1, 1, 1), "SyntaxError", "the program is nested too deeply", [])]
    for un in comp.unresolved:
        out.append(((un.line, un.col, un.line, un.col + len(un.name)), "NameError",
                    f"unknown name '{un.name}'", un.candidates))
    return out


# -- argument counts ------------------------------------------------------------------------

def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _call_problem(b: Builtin, npos: int, kwnames: list[str]) -> tuple[str, str, str | None] | None:
    """(what, message, hint) for a call of ``b`` that cannot bind, else None. ``what`` says
    where to point: "extra", "missing", or "kw:NAME"."""
    sig = b.parameter_specs()
    positional = [s for s in sig if s[1] == POSITIONAL]
    names = {s[0] for s in sig if s[1] in (POSITIONAL, KEYWORD_ONLY)}
    varargs = any(s[1] == VAR_POSITIONAL for s in sig)
    varkw = any(s[1] == VAR_KEYWORD for s in sig)
    if npos > len(positional) and not varargs:
        least = sum(1 for s in positional if s[2] is EMPTY)
        most = len(positional)
        takes = f"{most}" if least == most else f"from {least} to {most}"
        return ("extra", f"{b.name}() takes {takes} argument{'' if most == 1 else 's'} but {npos} were given", None)
    filled = {s[0] for s in positional[:npos]}
    for k in kwnames:
        if k not in names and not varkw:
            hint = did_you_mean(k, sorted(names))
            return (f"kw:{k}", f"{b.name}() got an unexpected keyword argument '{k}'", hint)
        if k in filled:
            return (f"kw:{k}", f"{b.name}() got multiple values for argument '{k}'", None)
    missing = [s[0] for s in sig if s[1] in (POSITIONAL, KEYWORD_ONLY) and s[2] is EMPTY
               and s[0] not in filled and s[0] not in kwnames]
    if missing:
        listed = " and ".join(f"'{m}'" for m in missing)
        return ("missing", f"{b.name}() missing {_plural(len(missing), 'required argument')}: {listed}", None)
    return None


def _arity_diagnostics(u: Unit, env: dict[str, Def]) -> list[tuple[tuple[int, int, int, int], str, str | None]]:
    out: list[tuple[tuple[int, int, int, int], str, str | None]] = []
    for call in u.calls:
        r = call.callee
        if r.target is not None or r.name in env:
            continue
        b = lookup(r.name)
        if b is None:
            continue
        npos = len(call.args) + (1 if call.piped else 0)
        kwnames = [k for k, _ in call.kwargs]
        problems = [_call_problem(m, npos, kwnames) for m in (b.overloads or (b,))]
        if any(p is None for p in problems):
            continue
        first = problems[0]
        assert first is not None
        what, message, hint = first
        where = (r.line, r.col, r.line, r.end_col)
        if what == "extra":
            extra = call.args[len(call.args) - (npos - _max_positional(b)):]
            if extra:
                where = (extra[0].line, extra[0].col, extra[-1].end_line, extra[-1].end_col)
        elif what.startswith("kw:"):
            name = what[3:]
            for k, v in call.kwargs:
                if k == name:
                    where = _kw_name_range(u, k, v) or where
                    break
        out.append((where, message, hint))
    return out


def _max_positional(b: Builtin) -> int:
    return sum(1 for s in b.parameter_specs() if s[1] == POSITIONAL)


def _kw_name_range(u: Unit, name: str, value: A.Node) -> tuple[int, int, int, int] | None:
    """``name=value`` keeps no position for ``name``: it is the word before the ``=``."""
    if not value.line or value.line > len(u.lines):
        return None
    text = u.lines[value.line - 1][: value.col - 1]
    m = re.search(rf"(?<![\w$]){re.escape(name)}\s*=\s*$", text)
    if m is None:
        return None
    return (value.line, m.start() + 1, value.line, m.start() + 1 + len(name))


# -- entry point ----------------------------------------------------------------------------


def analyse(text: str) -> Analysis:
    """Analyse a document (see the module's text)."""
    return Analysis(text)


def diagnostics(text: str) -> list[Diagnostic]:
    return analyse(text).diagnostics
