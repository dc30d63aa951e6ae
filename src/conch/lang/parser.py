"""Tokens to a syntax tree: statements by recursive descent, expressions by precedence climbing.

Statement ends (docs/language.md): a newline ends a statement unless it is inside ``()``, ``[]`` or
a record ``{}``, follows a binary operator or ``|``, or the next line starts with ``|``.
Blocks (``{ ... }`` after ``if``, ``fn``, ...) are newline-sensitive again.

Command-style calls: an identifier followed, on the same line and after a space, by a token
that starts a literal argument (number, string, ``true``/``false``/``null``, ``[``, ``{``,
``(``, ``fn``) is a call: ``len "abc"`` is ``len("abc")``. Further arguments (also plain
names and ``key=value``) follow, separated by spaces, until the end of the line, ``|``, a
binary operator or a closing bracket. ``f(x)`` (no space) and ``xs[0]`` are ordinary calls
and indexing.
"""

from __future__ import annotations

from conch.lang import ast as A
from conch.lang.errors import ConchError
from conch.lang.lexer import Token, tokenize

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    _T = TypeVar("_T")

PIPE, OR, AND, CMP, RANGE, ADD, MUL, POW, UNARY = 1, 2, 3, 4, 5, 6, 7, 8, 9

BINARY_OPS: dict[str, int] = {
    "|": PIPE,
    "||": OR,
    "&&": AND,
    "==": CMP,
    "!=": CMP,
    "<": CMP,
    "<=": CMP,
    ">": CMP,
    ">=": CMP,
    "=~": CMP,
    "..": RANGE,
    "..=": RANGE,
    "+": ADD,
    "-": ADD,
    "*": MUL,
    "/": MUL,
    "//": MUL,
    "%": MUL,
    "**": POW,
}
KEYWORD_OPS = {"or": ("||", OR), "and": ("&&", AND), "in": ("in", CMP)}
ASSIGN_OPS = ("=", "+=", "-=", "*=", "/=", "//=", "%=")
CLOSERS = {"(": ")", "[": "]", "{": "}"}


def _err(message: str, tok: Token, hint: str | None = None) -> ConchError:
    return ConchError("SyntaxError", message, line=tok.line, column=tok.col, hint=hint)


class Parser:
    def __init__(self, tokens: list[Token], source: str = "") -> None:
        self.toks = tokens
        self.i = 0
        self.source = source
        # (newline-sensitive, braces end the expression) for each enclosing bracket
        self.modes: list[tuple[bool, bool]] = [(True, False)]
        self.loop_depth = 0

    # -- token helpers -------------------------------------------------------------------

    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> Token:
        j = min(self.i + k, len(self.toks) - 1)
        return self.toks[j]

    def next(self) -> Token:
        t = self.toks[self.i]
        if t.kind != "eof":
            self.i += 1
        return t

    def expect(self, op: str, opener: Token | None = None, what: str | None = None) -> Token:
        t = self.tok
        if t.is_op(op):
            return self.next()
        hint = None
        if opener is not None:
            hint = f"'{opener.value}' opened at line {opener.line}, column {opener.col} is not closed"
        elif what:
            hint = what
        if t.kind == "eof":
            raise _err(f"expected '{op}' but the program ended", t, hint)
        raise _err(f"expected '{op}' but found {t.describe()}", t, hint)

    def expect_kw(self, word: str, hint: str) -> Token:
        t = self.tok
        if not t.is_kw(word):
            raise _err(f"expected '{word}' but found {t.describe()}", t, hint)
        return self.next()

    @property
    def nl_sensitive(self) -> bool:
        return self.modes[-1][0]

    @property
    def no_brace(self) -> bool:
        return self.modes[-1][1]

    def span(self, node: Any, start: Token, end: Token | None = None) -> Any:
        node.line, node.col = start.line, start.col
        last = end or self.toks[max(self.i - 1, 0)]
        node.end_line, node.end_col = last.end_line, last.end_col
        if (node.end_line, node.end_col) < (node.line, node.col):
            node.end_line, node.end_col = node.line, node.col
        return node

    # -- programs and blocks -------------------------------------------------------------

    def parse_program(self) -> A.Program:
        start = self.tok
        stmts = self.statements(None)
        prog = A.Program(stmts)
        return self.span(prog, start)

    def statements(self, closer: str | None) -> list[A.Node]:
        stmts: list[A.Node] = []
        while True:
            while self.tok.is_op(";"):
                self.next()
            t = self.tok
            if t.kind == "eof":
                if closer is not None:
                    return stmts  # the caller reports the unclosed brace
                return stmts
            if closer is not None and t.is_op(closer):
                return stmts
            stmts.append(self.statement())
            t = self.tok
            if t.is_op(";") or t.kind == "eof" or (closer is not None and t.is_op(closer)):
                continue
            if t.nl_before:
                continue
            if t.is_op(*ASSIGN_OPS):
                raise _err(
                    "cannot assign to this expression",
                    t,
                    "only variables can be reassigned; records and arrays are values (use merge, update or insert)",
                )
            if t.is_op(")", "]", "}"):
                raise _err(f"unexpected '{t.value}'", t, f"there is no matching opening bracket for '{t.value}'")
            raise _err(f"unexpected {t.describe()}", t, "put a new line or ';' between statements")

    def block(self) -> A.Block:
        open_tok = self.tok
        if not open_tok.is_op("{"):
            raise _err(f"expected '{{' but found {open_tok.describe()}", open_tok,
                       "a block is written { ... }")
        self.next()
        self.modes.append((True, False))
        stmts = self.statements("}")
        self.modes.pop()
        self.expect("}", open_tok)
        return self.span(A.Block(stmts), open_tok)

    # -- statements ----------------------------------------------------------------------

    def statement(self) -> A.Node:
        t = self.tok
        if t.kind == "kw":
            if t.value == "let":
                return self.let_stmt()
            if t.value == "fn" and self.peek().kind == "ident":
                return self.fn_def()
            if t.value == "for":
                return self.for_stmt()
            if t.value == "while":
                return self.while_stmt()
        if t.kind == "ident" and self.peek().is_op(*ASSIGN_OPS) and not self.peek().nl_before:
            self.next()
            op = self.next()
            value = self.expr()
            node = A.Assign(t.value, op.value, value)
            self.span(node, t)
            return node
        return self.expr()

    def let_stmt(self) -> A.Node:
        start = self.next()
        mutable = False
        if self.tok.is_kw("mut"):
            self.next()
            mutable = True
        if self.tok.kind not in ("ident",) and not self.tok.is_op("[", "{"):
            raise _err(f"expected a name after 'let' but found {self.tok.describe()}", self.tok,
                       "write let name = value" + ("" if self.tok.kind != "kw" else f"; '{self.tok.value}' is a keyword"))
        target = self.pattern()
        if mutable and not isinstance(target, A.PBind):
            raise _err("'let mut' needs a single name", start)
        eq = self.tok
        if not eq.is_op("="):
            if eq.is_op("=="):
                raise _err("expected '=' but found '=='", eq, "a binding is written let name = value")
            raise _err(f"expected '=' but found {eq.describe()}", eq, "a binding is written let name = value")
        self.next()
        value = self.expr()
        return self.span(A.Let(target, mutable, value), start)

    def params(self) -> list[A.Param]:
        open_tok = self.expect("(", what="parameters are written (a, b)")
        self.modes.append((False, False))
        params: list[A.Param] = []
        seen: set[str] = set()
        while not self.tok.is_op(")"):
            p = self.tok
            if p.kind != "ident":
                self.modes.pop()
                if p.kind == "eof":
                    self.expect(")", open_tok)
                raise _err(f"expected a parameter name but found {p.describe()}", p)
            self.next()
            if p.value in seen:
                raise _err(f"duplicate parameter '{p.value}'", p)
            seen.add(p.value)
            default = None
            if self.tok.is_op("="):
                self.next()
                default = self.expr()
            elif params and params[-1].default is not None:
                raise _err(f"parameter '{p.value}' needs a default value", p,
                           "parameters with defaults come last")
            params.append(A.Param(p.value, default, p.line, p.col))
            if not self.tok.is_op(","):
                break
            self.next()
        self.modes.pop()
        self.expect(")", open_tok)
        return params

    def fn_body(self) -> A.Node | A.Block:
        saved = self.loop_depth
        self.loop_depth = 0
        try:
            if self.tok.is_op("=>"):
                self.next()
                return self.expr()
            if self.tok.is_op("{"):
                return self.block()
            raise _err(f"expected '=>' or '{{' but found {self.tok.describe()}", self.tok,
                       "a function is written fn(x) => expr or fn(x) { ... }")
        finally:
            self.loop_depth = saved

    def fn_def(self) -> A.Node:
        start = self.next()
        name = self.next()
        params = self.params()
        body = self.fn_body()
        lam = self.span(A.Lambda(params, body, name=name.value), start)
        return self.span(A.FnDef(name.value, lam), start)

    def cond_expr(self) -> A.Node:
        self.modes.append((False, True))
        try:
            return self.expr()
        finally:
            self.modes.pop()

    def for_stmt(self) -> A.Node:
        start = self.next()
        var = self.pattern()
        self.expect_kw("in", "a loop is written for x in items { ... }")
        iterable = self.cond_expr()
        self.loop_depth += 1
        body = self.block()
        self.loop_depth -= 1
        return self.span(A.For(var, iterable, body), start)

    def while_stmt(self) -> A.Node:
        start = self.next()
        cond = self.cond_expr()
        self.loop_depth += 1
        body = self.block()
        self.loop_depth -= 1
        return self.span(A.While(cond, body), start)

    # -- expressions ---------------------------------------------------------------------

    def expr(self, min_bp: int = PIPE) -> A.Node:
        start = self.tok
        left = self.unary()
        last_cmp = False
        while True:
            t = self.tok
            if t.nl_before and self.nl_sensitive and not t.is_op("|"):
                break
            if t.kind == "op" and t.value in BINARY_OPS:
                op = t.value
                bp = BINARY_OPS[op]
            elif t.kind == "kw" and t.value in KEYWORD_OPS:
                op, bp = KEYWORD_OPS[t.value]
            elif t.is_kw("not") and self.peek().is_kw("in"):
                op, bp = "not in", CMP
            else:
                break
            if bp < min_bp:
                break
            if bp == CMP and last_cmp:
                raise _err("comparisons cannot be chained", t, "combine them with && (a < b && b < c)")
            self.next()
            if op == "not in":
                self.next()
            if bp == RANGE:
                right = self.expr(RANGE + 1)
                node: A.Node = A.RangeLit(left, right, op == "..=", op_line=t.line, op_col=t.col)
                if self.tok.is_op("..", "..=") and not (self.tok.nl_before and self.nl_sensitive):
                    raise _err("ranges cannot be chained", self.tok)
            elif op == "|":
                right = self.expr(PIPE + 1)
                node = A.Pipe(left, right)
            else:
                right = self.expr(bp if op == "**" else bp + 1)
                node = A.Binary(op, left, right, op_line=t.line, op_col=t.col)
            last_cmp = bp == CMP
            left = self.span(node, start)
        return left

    def unary(self) -> A.Node:
        t = self.tok
        if t.is_op("-", "!") or t.is_kw("not"):
            self.next()
            operand = self.unary()
            op = "-" if t.value == "-" else "!"
            if op == "-" and isinstance(operand, A.Literal) and type(operand.value) in (int, float):
                return self.span(A.Literal(-operand.value), t)
            return self.span(A.Unary(op, operand), t)
        return self.postfix(self.primary())

    def postfix(self, node: A.Node) -> A.Node:
        while True:
            t = self.tok
            if t.nl_before and self.nl_sensitive:
                return node
            if t.is_op("("):
                node = self.call_args(node)
            elif t.is_op("[") and not (t.space_before and isinstance(node, A.Name)):
                node = self.index(node)
            elif t.is_op(".", "?."):
                self.next()
                name = self.tok
                if name.kind not in ("ident", "kw") and not (name.kind == "str" and name.value is not None):
                    raise _err(f"expected a field name after '{t.value}' but found {name.describe()}", name)
                self.next()
                fld = A.Field(node, str(name.value), t.value == "?.", op_line=name.line, op_col=name.col)
                node = self.span(fld, _start_of(node, t))
            else:
                return node

    def call_args(self, func: A.Node) -> A.Node:
        open_tok = self.next()
        self.modes.append((False, False))
        args: list[A.Node] = []
        kwargs: list[tuple[str, A.Node]] = []
        while not self.tok.is_op(")"):
            t = self.tok
            if t.kind == "eof":
                break
            if t.kind == "ident" and self.peek().is_op("="):
                self.next()
                self.next()
                if any(k == t.value for k, _ in kwargs):
                    raise _err(f"argument '{t.value}' given twice", t)
                kwargs.append((t.value, self.expr()))
            else:
                if kwargs:
                    raise _err("positional argument after a named argument", t,
                               "put positional arguments first: f(a, b, key=value)")
                args.append(self.expr())
            if not self.tok.is_op(","):
                break
            self.next()
        self.modes.pop()
        self.expect(")", open_tok)
        node = A.Call(func, args, kwargs)
        return self.span(node, _start_of(func, open_tok))

    def index(self, obj: A.Node) -> A.Node:
        open_tok = self.next()
        self.modes.append((False, False))
        node: A.Index
        if self.tok.is_op("..", "..="):
            inclusive = self.next().value == "..="
            stop = self.expr(RANGE + 1)
            node = A.Index(obj, None, None, stop, inclusive)
        else:
            if self.tok.is_op("]"):
                raise _err("unexpected ']'", self.tok, "an index is missing between '[' and ']'")
            first = self.expr(RANGE + 1)
            if self.tok.is_op("..", "..=") and self.peek().is_op("]"):
                self.next()
                node = A.Index(obj, None, first, None)
            else:
                # re-enter the loop so that ``a..b`` and comparisons parse normally
                node = A.Index(obj, self._continue_expr(first), None, None)
        self.modes.pop()
        self.expect("]", open_tok)
        node.op_line, node.op_col = open_tok.line, open_tok.col
        return self.span(node, _start_of(obj, open_tok))

    def _continue_expr(self, left: A.Node) -> A.Node:
        """Continue parsing binary operators after an already parsed operand."""
        t = self.tok
        if t.is_op("..", "..="):
            self.next()
            right = self.expr(RANGE + 1)
            node = A.RangeLit(left, right, t.value == "..=", op_line=t.line, op_col=t.col)
            node.line, node.col = left.line, left.col
            node.end_line, node.end_col = right.end_line, right.end_col
            return node
        if t.kind in ("op", "kw") and (t.value in BINARY_OPS or t.value in KEYWORD_OPS or t.is_kw("not")):
            raise _err(f"unexpected {t.describe()} in an index", t, "parenthesise the index expression")
        return left

    def primary(self) -> A.Node:
        t = self.tok
        k = t.kind
        if k == "num":
            self.next()
            return self.span(A.Literal(t.value), t)
        if k == "str":
            self.next()
            return self.string(t)
        if k == "ident":
            self.next()
            if self.starts_command_arg(self.tok):
                return self.command(t)
            return self.span(A.Name(t.value), t)
        if k == "kw":
            v = t.value
            if v in ("true", "false", "null"):
                self.next()
                return self.span(A.Literal({"true": True, "false": False, "null": None}[v]), t)
            if v == "fn":
                self.next()
                if self.tok.kind == "ident":
                    raise _err("a named function must be a statement", self.tok,
                               "write fn name(x) => ... on its own line, or use a lambda fn(x) => ...")
                params = self.params()
                body = self.fn_body()
                return self.span(A.Lambda(params, body), t)
            if v == "if":
                return self.if_expr()
            if v == "match":
                return self.match_expr()
            if v == "try":
                return self.try_expr()
            if v == "break" or v == "continue":
                self.next()
                if self.loop_depth == 0:
                    raise _err(f"'{v}' outside a loop", t)
                return self.span(A.Break() if v == "break" else A.Continue(), t)
            if v == "return":
                self.next()
                value = None if self.ends_expression(self.tok) else self.expr()
                return self.span(A.Return(value), t)
            if v == "throw":
                self.next()
                if self.ends_expression(self.tok):
                    raise _err("'throw' needs a value", self.tok, 'write throw "message" or throw {message: ...}')
                return self.span(A.Throw(self.expr()), t)
            if v == "let":
                raise _err("'let' is a statement", t, "bindings cannot appear inside an expression")
            raise _err(f"unexpected keyword '{v}'", t)
        if k == "op":
            v = t.value
            if v == "(":
                self.next()
                self.modes.append((False, False))
                if self.tok.is_op(")"):
                    raise _err("unexpected ')'", self.tok, "an expression is missing between '(' and ')'")
                inner = self.expr()
                self.modes.pop()
                self.expect(")", t)
                return inner
            if v == "[":
                return self.array()
            if v == "{":
                if self.looks_like_record():
                    return self.record()
                blk = self.block()
                return blk
            if v in (".", "?."):
                # a projection stage: ``table | .name``
                self.next()
                name = self.tok
                if name.kind not in ("ident", "kw") and not (name.kind == "str" and name.value is not None):
                    raise _err(f"expected a field name after '{v}' but found {name.describe()}", name)
                self.next()
                return self.span(A.Field(None, str(name.value), v == "?.", op_line=name.line, op_col=name.col), t)  # type: ignore[arg-type]
            if v in (")", "]", "}"):
                raise _err(f"unexpected '{v}'", t, f"an expression is missing before '{v}'")
            if v in ASSIGN_OPS and v != "=":
                raise _err(f"unexpected '{v}'", t, "only a variable can be updated: name += value")
            if v == "=":
                raise _err("unexpected '='", t, "to compare use '=='; bindings are written let name = value")
            raise _err(f"unexpected '{v}'", t, f"an expression is missing before '{v}'")
        if k == "eof":
            raise _err("unexpected end of input", t, "an expression is missing")
        raise _err(f"unexpected {t.describe()}", t)

    def ends_expression(self, t: Token) -> bool:
        return (
            t.kind == "eof"
            or (t.nl_before and self.nl_sensitive)
            or t.is_op(")", "]", "}", ",", ";", "|")
        )

    def starts_command_arg(self, t: Token) -> bool:
        if t.nl_before or not t.space_before:
            return False
        if t.kind in ("num", "str"):
            return True
        if t.kind == "kw":
            return t.value in ("true", "false", "null", "fn")
        if t.kind == "op":
            if t.value in ("[", "("):
                return True
            if t.value == "{":
                return not self.no_brace
        return False

    def command(self, name: Token) -> A.Node:
        func = self.span(A.Name(name.value), name)
        args: list[A.Node] = []
        kwargs: list[tuple[str, A.Node]] = []
        while True:
            t = self.tok
            if t.nl_before or not t.space_before:
                break
            if t.kind == "ident" and self.peek().is_op("=") and not self.peek().space_before:
                self.next()
                self.next()
                kwargs.append((t.value, self.postfix(self.command_arg())))
                continue
            if self.starts_command_arg(t) or t.kind == "ident":
                if kwargs:
                    raise _err("positional argument after a named argument", t)
                args.append(self.postfix(self.command_arg()))
                continue
            break
        return self.span(A.Call(func, args, kwargs), name)

    def command_arg(self) -> A.Node:
        t = self.tok
        if t.kind == "ident":
            self.next()
            return self.span(A.Name(t.value), t)
        if t.is_op("{"):
            return self.record() if self.looks_like_record() else self.block()
        return self.primary()

    def string(self, t: Token) -> A.Node:
        if t.value is not None:
            return self.span(A.Literal(t.value), t)
        parts: list[str | A.Node] = []
        for part in t.parts:
            if isinstance(part, str):
                parts.append(part)
                continue
            sub = Parser(part, self.source)
            sub.modes = [(False, False)]
            e = sub.expr()
            if sub.tok.kind != "eof":
                raise _err(f"unexpected {sub.tok.describe()} in interpolation", sub.tok)
            parts.append(e)
        return self.span(A.Interp(parts), t)

    def array(self) -> A.Node:
        open_tok = self.next()
        items = self.comma_list(open_tok, "]", "array items", self.expr)
        return self.span(A.ArrayLit(items), open_tok)

    def comma_list(self, open_tok: Token, close: str, what: str, item: Callable[[], _T]) -> list[_T]:
        """The items of a literal up to its closing bracket, separated by commas (a trailing
        one allowed); ``item`` reads one."""
        self.modes.append((False, False))
        items: list[_T] = []
        while not self.tok.is_op(close) and self.tok.kind != "eof":
            items.append(item())
            if not self.tok.is_op(","):
                if not self.tok.is_op(close) and self.tok.kind != "eof":
                    raise _err(f"expected ',' or '{close}' but found {self.tok.describe()}",
                               self.tok, f"{what} are separated by commas")
                break
            self.next()
        self.modes.pop()
        self.expect(close, open_tok)
        return items

    def looks_like_record(self) -> bool:
        a, b = self.peek(1), self.peek(2)
        if a.is_op("}"):
            return True
        if a.kind in ("ident", "str", "kw", "num") and b.is_op(":"):
            return a.kind != "str" or a.value is not None
        return a.kind == "ident" and b.is_op(",", "}")

    def record(self) -> A.Node:
        open_tok = self.next()
        seen: set[str] = set()

        def entry() -> tuple[str, A.Node]:
            k = self.tok
            if k.kind in ("ident", "kw", "num") or (k.kind == "str" and k.value is not None):
                self.next()
                key = str(k.value)
            elif k.kind == "str":
                raise _err("record keys cannot be interpolated", k)
            else:
                raise _err(f"expected a field name but found {k.describe()}", k,
                           "records are written {name: value, \"two words\": value}")
            if key in seen:
                raise _err(f"duplicate field '{key}'", k)
            seen.add(key)
            if self.tok.is_op(":"):
                self.next()
                return key, self.expr()
            if k.kind == "ident":
                return key, self.span(A.Name(key), k)
            raise _err(f"expected ':' but found {self.tok.describe()}", self.tok)

        entries = self.comma_list(open_tok, "}", "record fields", entry)
        return self.span(A.RecordLit(entries), open_tok)

    def if_expr(self) -> A.Node:
        start = self.next()
        cond = self.cond_expr()
        then = self.block()
        orelse: A.Block | A.If | None = None
        if self.tok.is_kw("else"):
            self.next()
            if self.tok.is_kw("if"):
                inner = self.if_expr()
                assert isinstance(inner, A.If)
                orelse = inner
            else:
                orelse = self.block()
        return self.span(A.If(cond, then, orelse), start)

    def match_expr(self) -> A.Node:
        start = self.next()
        subject = self.cond_expr()
        open_tok = self.expect("{", what="a match is written match value { pattern => result, ... }")
        self.modes.append((True, False))
        arms: list[A.MatchArm] = []
        while True:
            while self.tok.is_op(",", ";"):
                self.next()
            if self.tok.is_op("}") or self.tok.kind == "eof":
                break
            self.modes.append((False, False))
            pat = self.pattern(allow_or=True)
            guard = None
            if self.tok.is_kw("if"):
                self.next()
                guard = self.expr()
            self.modes.pop()
            self.expect("=>", what="a match arm is written pattern => result")
            body = self.expr()
            arms.append(A.MatchArm(pat, guard, body))
            t = self.tok
            if not (t.is_op(",", "}", ";") or t.nl_before or t.kind == "eof"):
                raise _err(f"unexpected {t.describe()}", t, "separate match arms with ',' or a new line")
        self.modes.pop()
        self.expect("}", open_tok)
        return self.span(A.Match(subject, arms), start)

    def try_expr(self) -> A.Node:
        start = self.next()
        body = self.block()
        self.expect_kw("catch", "write try { ... } catch e { ... }")
        name = None
        if self.tok.kind == "ident":
            name = self.next().value
        handler = self.block()
        return self.span(A.Try(body, name, handler), start)

    # -- patterns ------------------------------------------------------------------------

    def pattern(self, allow_or: bool = False) -> A.Pattern:
        start = self.tok
        first = self.single_pattern()
        if not allow_or or not self.tok.is_op("|"):
            return first
        options = [first]
        while self.tok.is_op("|"):
            self.next()
            options.append(self.single_pattern())
        return self.span(A.POr(options), start)

    def single_pattern(self) -> A.Pattern:
        t = self.tok
        if t.kind == "ident":
            self.next()
            if t.value == "_":
                return self.span(A.PWild(), t)
            return self.span(A.PBind(t.value), t)
        if t.kind in ("num", "str") or t.is_kw("true", "false", "null") or (t.is_op("-") and self.peek().kind == "num"):
            value = self.pattern_literal()
            if self.tok.is_op("..", "..="):
                inclusive = self.next().value == "..="
                end = self.pattern_literal()
                if not all(type(v) in (int, float) for v in (value, end)):
                    raise _err("range patterns need numbers", t)
                return self.span(A.PRange(value, end, inclusive), t)
            return self.span(A.PLit(value), t)
        if t.is_op("["):
            self.next()
            self.modes.append((False, False))
            items: list[A.Pattern] = []
            rest: str | None = None
            has_rest = False
            while not self.tok.is_op("]"):
                if self.tok.is_op(".."):
                    self.next()
                    has_rest = True
                    if self.tok.kind == "ident":
                        rest = self.next().value
                    if not self.tok.is_op("]"):
                        raise _err("'..rest' must come last in an array pattern", self.tok)
                    break
                items.append(self.pattern(allow_or=True))
                if not self.tok.is_op(","):
                    break
                self.next()
            self.modes.pop()
            self.expect("]", t)
            return self.span(A.PArray(items, rest if rest != "_" else None, has_rest), t)
        if t.is_op("{"):
            self.next()
            self.modes.append((False, False))
            fields: list[tuple[str, A.Pattern]] = []
            while not self.tok.is_op("}"):
                k = self.tok
                if k.kind in ("ident", "kw") or (k.kind == "str" and k.value is not None):
                    self.next()
                else:
                    raise _err(f"expected a field name but found {k.describe()}", k)
                if self.tok.is_op(":"):
                    self.next()
                    fields.append((str(k.value), self.pattern(allow_or=True)))
                else:
                    if k.kind != "ident":
                        raise _err(f"expected ':' after field '{k.value}'", self.tok)
                    fields.append((k.value, self.span(A.PBind(k.value), k)))
                if not self.tok.is_op(","):
                    break
                self.next()
            self.modes.pop()
            self.expect("}", t)
            return self.span(A.PRecord(fields), t)
        raise _err(f"unexpected {t.describe()} in a pattern", t,
                   "patterns are literals, ranges (1..10), names, _, [first, ..rest] or {field}")

    def pattern_literal(self) -> Any:
        t = self.next()
        if t.is_op("-"):
            n = self.next()
            if n.kind != "num":
                raise _err("expected a number after '-'", n)
            return -n.value
        if t.kind == "num":
            return t.value
        if t.kind == "str":
            if t.value is None:
                raise _err("patterns cannot be interpolated strings", t)
            return t.value
        if t.is_kw("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[t.value]
        raise _err(f"expected a literal but found {t.describe()}", t)


def _start_of(node: A.Node | None, fallback: Token) -> Token:
    if node is None or not node.line:
        return fallback
    return Token("op", "", node.line, node.col, node.line, node.col)


def parse(source: str) -> A.Program:
    return Parser(tokenize(source), source).parse_program()


def parse_expression(source: str) -> A.Node:
    """One expression (a pipeline stage); the whole text must be consumed."""
    p = Parser(tokenize(source), source)
    t = p.tok
    if t.kind == "eof":
        raise _err("empty pipeline stage", t, "give a call, a lambda or a .field")
    node = p.expr()
    if p.tok.kind != "eof":
        raise _err(f"unexpected {p.tok.describe()}", p.tok)
    return node
