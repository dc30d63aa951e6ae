"""Conch syntax tree to a Python ``ast.Module``, compiled once to a code object.

Every generated Python node carries the conch source position (filename ``<conch>``), so a
failing instruction's position (``co_positions``) is the conch line and column: the
interpreter reads it from the traceback instead of tracking positions at run time.

Scoping: conch locals become Python locals of the enclosing ``def`` (a program is one
``def``), closures are Python closures. Immutable bindings captured by an inner function are
passed as keyword-only defaults, so a lambda created in a loop keeps the value it saw
(conch closures capture values); ``let mut`` bindings and named functions are captured by
reference (``nonlocal`` where reassigned). Python names are unique per program, so conch
shadowing (``let x = 1; let x = x + 1``) never aliases an earlier binding.

Generated helper and builtin names contain ``$`` so they can never collide with conch names.
"""

from __future__ import annotations

# _ast holds the node classes that the ast module re-exports; ast itself (with enum and
# contextlib) would add milliseconds to every ``conch -c``.
import _ast as py
import itertools

from conch.lang import ast as A
from conch.lang import emit as E
from conch.lang.emit import (
    Binding,
    CompileState,
    Func,
    Scope,
    Unresolved,
    compile_error,
    compile_quietly,
    fix_missing_locations,
    is_trivial,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from conch.lang.builtins.registry import Builtin

MAIN = "$main"

_CMP_OPS: dict[str, Any] = {"<": py.Lt, "<=": py.LtE, ">": py.Gt, ">=": py.GtE}
_ARITH: dict[str, Any] = {"-": py.Sub, "*": py.Mult, "/": py.Div, "//": py.FloorDiv, "%": py.Mod, "**": py.Pow}
# The builtin names fusion.py looks at (stages of a fused chain, builtins it inlines): other
# calls compile without importing it.
_FUSION_NAMES = frozenset(("map", "where", "filter", "each", "take", "skip", "take_while", "reduce", "sum",
                           "count", "any", "all", "upper", "lower", "trim", "split", "join", "len", "length"))


class Compiled:
    __slots__ = ("builtins", "code", "top_bindings", "unresolved")

    def __init__(self, code: Any, builtins: dict[str, Any], unresolved: list[Unresolved],
                 top_bindings: dict[str, Binding]) -> None:
        self.code = code
        self.builtins = builtins
        self.unresolved = unresolved
        self.top_bindings = top_bindings


def _registry() -> dict[str, Builtin]:
    # imported when a program first names something that is not its own: ``1 + 1`` starts
    # without the builtins' machinery
    from conch.lang.builtins.registry import REGISTRY

    return REGISTRY


def _chain_child(n: A.Node) -> A.Node | None:
    if isinstance(n, A.Field | A.Index):
        return n.obj
    if isinstance(n, A.Call):
        return n.func
    return None


def _set_chain_child(n: A.Field | A.Index | A.Call, child: A.Node) -> None:
    if isinstance(n, A.Call):
        n.func = child
    else:
        n.obj = child


def _int_literal(n: A.Node | None) -> bool:
    return isinstance(n, A.Literal) and type(n.value) is int


def _float_literal(n: A.Node | None) -> bool:
    return isinstance(n, A.Literal) and type(n.value) is float


class Compiler(CompileState):
    # False: every ``*`` of a checked run through ``$mul``, as before (the tests compare)
    bare_mul = True

    def load(self, name: str, node: A.Node) -> py.expr:
        b = self.scope.lookup(name)
        if b is None:
            builtin = _registry().get(name)
            if builtin is not None:
                key = f"$b:{name}"
                self.builtins[key] = builtin.fn
                return self.at(E.name(key), node)
            if name not in self.known_globals:
                cands = sorted(self.scope.visible() | set(_registry()))
                self.unresolved.append(Unresolved(name, node.line, node.col, cands, self.func is not self.main_func))
            return self.at(E.name(name), node)
        self.access(b, self.func)
        return self.at(E.name(b.pyname), node)

    def spill(self, e: py.expr) -> py.expr:
        if is_trivial(e):
            return e
        t = self.fresh()
        self.emit(E.assign(t, e))
        return E.name(t)

    def seq(self, nodes: list[A.Node]) -> list[py.expr]:
        """Compile several expressions keeping left-to-right evaluation order."""
        results: list[py.expr] = []
        for n in nodes:
            buf: list[py.stmt] = []
            with self.into(buf):
                e = self.expr(n)
            if buf and results:
                results = [self.spill(r) for r in results]
            self.out.extend(buf)
            results.append(e)
        return results

    # -- programs ------------------------------------------------------------------------

    def compile_program(self, prog: A.Program) -> Compiled:
        body: list[py.stmt] = []
        with self.into(body):
            self.predeclare_fns(prog.stmts)
            value = self.statements(prog.stmts, want_value=True, top=True)
            self.emit(py.Return(value))
        if self.main_func.globals:
            body.insert(0, py.Global(sorted(self.main_func.globals)))
        fdef = py.FunctionDef(
            name=MAIN,
            args=py.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
            body=body,
            decorator_list=[],
            returns=None,
            type_comment=None,
        )
        fdef.lineno, fdef.col_offset, fdef.end_lineno, fdef.end_col_offset = 1, 0, 1, 0
        module = py.Module(body=[fdef], type_ignores=[])
        fix_missing_locations(module)
        # with source, docstrings carry the functions' texts: kept even under ``python -OO``
        code = compile_quietly(module, -1 if self.source is None else 0)
        top = {name: b for name, b in self.scope.names.items() if b.is_global}
        return Compiled(code, self.builtins, self.unresolved, top)

    def predeclare_fns(self, stmts: list[A.Node]) -> None:
        for s in stmts:
            if isinstance(s, A.FnDef):
                self.declare(s.name, is_fn=True)

    def statements(self, stmts: list[A.Node], want_value: bool, top: bool = False) -> py.expr:
        n = len(stmts)
        value: py.expr = E.const(None)
        mark = len(self.out)
        first_local = len(self.scope.declared)
        hoisted: list[py.stmt] = []
        for i, s in enumerate(stmts):
            if top:
                self.emit(self.at(py.Expr(E.call("$onst", [E.const(i)])), s))
            if isinstance(s, A.FnDef):
                buf: list[py.stmt] = []
                with self.into(buf):
                    self.stmt(s)
                # Named functions are defined on entry to their block, so they may be called
                # above their definition; not one that needs a value only computed by then.
                local = self.scope.declared[first_local:]
                needs_local = any(b in local for b in self.last_captures)
                plain_defaults = all(p.default is None or isinstance(p.default, A.Literal) for p in s.fn.params)
                if needs_local or not plain_defaults:
                    self.out.extend(buf)
                else:
                    hoisted.extend(buf)
            elif i == n - 1 and want_value:
                value = self.value_stmt(s)
            else:
                self.stmt(s)
        self.out[mark:mark] = hoisted
        return value

    def value_stmt(self, s: A.Node) -> py.expr:
        if isinstance(s, A.Let | A.Assign | A.FnDef | A.For | A.While):
            self.stmt(s)
            return E.const(None)
        return self.expr(s)

    def block_value(self, block: A.Block, want_value: bool = True) -> py.expr:
        with self.new_scope():
            self.predeclare_fns(block.stmts)
            return self.statements(block.stmts, want_value)

    # -- statements ----------------------------------------------------------------------

    def stmt(self, s: A.Node) -> None:
        if isinstance(s, A.Let):
            self.let(s)
        elif isinstance(s, A.Assign):
            self.assign(s)
        elif isinstance(s, A.FnDef):
            self.fn_def(s)
        elif isinstance(s, A.For):
            self.for_(s)
        elif isinstance(s, A.While):
            self.while_(s)
        elif isinstance(s, A.If):
            self.if_(s, want_value=False)
        elif isinstance(s, A.Block):
            self.block_value(s, want_value=False)
        elif isinstance(s, A.Break | A.Continue | A.Return | A.Throw):
            self.expr(s)
        else:
            e = self.expr(s)
            if not is_trivial(e):
                self.emit(self.at(py.Expr(e), s))

    def let(self, s: A.Let) -> None:
        value = self.expr(s.value)
        if isinstance(s.target, A.PBind):
            b = self.declare(s.target.name, mutable=s.mutable, num=self.never_bool(s.value))
            self.emit(self.at(E.assign(b.pyname, value), s))
            return
        subject = self.spill(value)
        test = self.pattern(s.target, subject)
        self.emit(self.at(py.If(py.UnaryOp(py.Not(), test), [py.Raise(E.call("$nomatch", [subject]), None)], []), s.target))

    def assign(self, s: A.Assign) -> None:
        b = self.scope.lookup(s.name)
        if b is None:
            raise compile_error("NameError", f"cannot assign to '{s.name}': it is not defined", s,
                       f"declare it first: let mut {s.name} = ...")
        if not b.mutable:
            raise compile_error("SyntaxError", f"cannot assign twice to immutable '{s.name}'", s,
                       f"declare it with let mut {s.name} = ... to reassign it")
        value = self.expr(s.value)
        if s.op != "=":
            op = s.op[:-1]
            cur = E.name(b.pyname)
            if op == "+":
                value = self.at(E.call("$add", [cur, value]), s)
            else:
                value = self.numeric_op(op, cur, value, s, None, s.value, None)
        if b.is_global:
            # A session's binding lives in the namespace: ``$main`` too must name it global,
            # or a later input's ``c = c + 1`` would make ``c`` a local of that input.
            self.func.globals.add(b.pyname)
        elif b.func is not self.func:
            self.func.nonlocals.add(b.pyname)
        self.emit(self.at(E.assign(b.pyname, value), s))

    def fn_def(self, s: A.FnDef) -> None:
        b = self.scope.names.get(s.name)
        if b is None or not b.is_fn:
            b = self.declare(s.name, is_fn=True)
        self.function(s.fn, b.pyname)

    def for_(self, s: A.For) -> None:
        iterable = self.expr(s.iterable)
        body: list[py.stmt] = []
        self.func.in_loop += 1
        self.loop_depth += 1
        with self.into(body), self.new_scope():
            if self.checked:
                self.emit(py.Expr(E.call("$tick", [])))
            if isinstance(s.var, A.PBind):
                target = self.declare(s.var.name, num=isinstance(s.iterable, A.RangeLit)).pyname
            else:
                target = self.fresh("it")
                test = self.pattern(s.var, E.name(target))
                self.emit(self.at(py.If(py.UnaryOp(py.Not(), test), [py.Raise(E.call("$nomatch", [E.name(target)]), None)], []), s.var))
            self.predeclare_fns(s.body.stmts)
            self.statements(s.body.stmts, want_value=False)
        self.func.in_loop -= 1
        self.loop_depth -= 1
        loop = py.For(E.store(target), iterable, body or [py.Pass()], [], None)
        self.emit(self.at(loop, s))

    def while_(self, s: A.While) -> None:
        cond_stmts: list[py.stmt] = []
        with self.into(cond_stmts):
            cond = self.cond(s.cond)
        body: list[py.stmt] = []
        self.func.in_loop += 1
        self.loop_depth += 1
        with self.into(body):
            if self.checked:
                self.emit(py.Expr(E.call("$tick", [])))
            self.block_value(s.body, want_value=False)
        self.func.in_loop -= 1
        self.loop_depth -= 1
        if cond_stmts:
            brk = self.at(py.If(py.UnaryOp(py.Not(), cond), [py.Break()], []), s.cond)
            loop = py.While(E.const(True), [*cond_stmts, brk, *body], [])
        else:
            loop = py.While(cond, body or [py.Pass()], [])
        self.emit(self.at(loop, s))

    # -- functions -----------------------------------------------------------------------

    def function(self, lam: A.Lambda, def_name: str | None, label: str | None = None) -> py.expr:
        # label: the Python name of a lambda's def (conch.lang.snapshot finds it by it)
        defaults = [self.expr(p.default) for p in lam.params if p.default is not None]
        outer_func, outer_scope, outer_loop = self.func, self.scope, self.loop_depth
        func = Func(outer_func)
        self.func = func
        self.scope = Scope(func, outer_scope)
        self.loop_depth = 0
        self.pipe_input.append(None)
        body: list[py.stmt] = []
        try:
            params = []
            for p in lam.params:
                b = self.declare(p.name)
                params.append(self.at(py.arg(b.pyname), p))
            with self.into(body):
                if isinstance(lam.body, A.Block):
                    self.predeclare_fns(lam.body.stmts)
                    value = self.statements(lam.body.stmts, want_value=True)
                else:
                    value = self.expr(lam.body)
        finally:
            self.func, self.scope, self.loop_depth = outer_func, outer_scope, outer_loop
            self.pipe_input.pop()
        captured = list(func.captures.values())
        self.last_captures = captured
        for b in captured:
            self.access(b, outer_func)
        kwonly = [py.arg(b.pyname) for b in captured]
        kw_defaults: list[py.expr | None] = [E.name(b.pyname) for b in captured]
        args = py.arguments(posonlyargs=[], args=params, vararg=None, kwonlyargs=kwonly,
                            kw_defaults=kw_defaults, kwarg=None, defaults=defaults)
        decls: list[py.stmt] = []
        if func.nonlocals:
            decls.append(py.Nonlocal(sorted(func.nonlocals)))
        if func.globals:
            decls.append(py.Global(sorted(func.globals)))
        if def_name is None and not body and not decls and not self.checked and self.source is None:
            return self.at(py.Lambda(args, value), lam)
        ret = self.at(py.Return(value), lam.body)
        if self.source is not None:
            decls.insert(0, py.Expr(E.const(self.text_of(lam))))
            if def_name is None and label is None:
                # a def named once in its scope: used in place, no temporary
                self.counter += 1
                label = f"lambda$fn{self.counter}"
        if self.checked and def_name is not None:
            enter = py.Expr(E.call("$enter", []))
            guarded: list[py.stmt] = [enter, py.Try([*body, ret], [], [], [py.Expr(E.call("$leave", []))])]
            full = [*decls, *guarded]
        else:
            tick: list[py.stmt] = [py.Expr(E.call("$tick", []))] if self.checked else []
            full = [*decls, *tick, *body, ret]
        name = def_name or label or "lambda"
        fdef = py.FunctionDef(name=name, args=args, body=full, decorator_list=[], returns=None, type_comment=None)
        self.emit(self.at(fdef, lam))
        if def_name is not None:
            return E.name(def_name)
        if label is not None:
            return E.name(label)
        t = self.fresh("fn")
        self.emit(E.assign(t, E.name(name)))
        return E.name(t)

    # -- expressions ---------------------------------------------------------------------

    def cond(self, node: A.Node) -> py.expr:
        e = self.expr(node)
        if E.is_bool(e):
            return e
        return self.at(E.call("$truth", [e]), node)

    def expr(self, node: A.Node) -> py.expr:
        method = getattr(self, "x_" + type(node).__name__, None)
        if method is None:
            raise compile_error("SyntaxError", f"unexpected {type(node).__name__} here", node)
        result: py.expr = method(node)
        return result

    def x_Literal(self, n: A.Literal) -> py.expr:
        return self.at(E.const(n.value), n)

    def x_Interp(self, n: A.Interp) -> py.expr:
        exprs = self.seq([p for p in n.parts if not isinstance(p, str)])
        it = iter(exprs)
        values: list[py.expr] = []
        for p in n.parts:
            if isinstance(p, str):
                values.append(E.const(p))
            else:
                e = next(it)
                values.append(py.FormattedValue(E.call("$render", [e]), -1, None))
        return self.at(py.JoinedStr(values), n)

    def x_Name(self, n: A.Name) -> py.expr:
        return self.load(n.name, n)

    def x_Raw(self, n: A.Raw) -> py.expr:
        return E.name(n.pyname)

    def x_ArrayLit(self, n: A.ArrayLit) -> py.expr:
        return self.at(py.List(self.seq(n.items), py.Load()), n)

    def x_RecordLit(self, n: A.RecordLit) -> py.expr:
        vals = self.seq([v for _, v in n.entries])
        keys: list[py.expr | None] = [E.const(k) for k, _ in n.entries]
        return self.at(py.Dict(keys, vals), n)

    def x_Unary(self, n: A.Unary) -> py.expr:
        if n.op == "-":
            operand = self.expr(n.operand)
            if self.never_bool(n.operand):
                return self.at(py.UnaryOp(py.USub(), operand), n)
            ref, tests = self.bool_guard(operand)
            fail = E.call("$boolop", [E.const("unary -"), ref])
            return self.at(py.IfExp(E.and_(tests), py.UnaryOp(py.USub(), ref), fail), n)
        return self.at(py.UnaryOp(py.Not(), self.cond(n.operand)), n)

    def never_bool(self, n: A.Node) -> bool:
        """Whether ``n`` cannot evaluate to a Bool, so arithmetic on it needs no Bool check."""
        if isinstance(n, A.Name):
            b = self.scope.lookup(n.name)
            return b is not None and b.num
        if isinstance(n, A.Literal):
            return type(n.value) is not bool
        if isinstance(n, A.Binary):
            return n.op in _ARITH or n.op == "+"
        if isinstance(n, A.Unary):
            return n.op == "-"
        return isinstance(n, A.Interp | A.ArrayLit | A.RecordLit | A.RangeLit)

    def bool_guard(self, e: py.expr) -> tuple[py.expr, list[py.expr]]:
        """A reference to ``e``'s value and the tests that it is not a Bool.

        Python treats True as 1 in arithmetic; conch does not. Two identity tests cost a few
        nanoseconds, where a helper call would double the cost of ``x * 2``.
        """
        if is_trivial(e):
            ref: py.expr = e
            first: py.expr = e
        else:
            t = self.fresh()
            ref = E.name(t)
            first = py.NamedExpr(E.store(t), e)
        return ref, [py.Compare(first, [py.IsNot()], [E.const(True)]),
                     py.Compare(ref, [py.IsNot()], [E.const(False)])]

    def numeric_op(self, op: str, left: py.expr, right: py.expr, n: A.Node, lnode: A.Node | None,
                   rnode: A.Node, oppos: tuple[int, int, int] | None) -> py.expr:
        """``left op right`` for an arithmetic or ordering operator, failing on a Bool operand."""
        need_l = lnode is None or not self.never_bool(lnode)
        need_r = not self.never_bool(rnode)

        def build(a: py.expr, b: py.expr) -> py.expr:
            if op in _ARITH:
                return py.BinOp(a, _ARITH[op](), b)
            return py.Compare(a, [_CMP_OPS[op]()], [b])

        if op == "*" and self.checked:
            # a limited run: ``"ab" * n`` and ``[0] * n`` are bounded by the collection limit,
            # by ``$mul``, unless the operands cannot be a String or an Array
            if not self.bare_mul:
                return self.at(E.call("$mul", [left, right]), n, oppos)
            if lnode is not None and self.known_int(lnode) and self.known_int(rnode):
                return self.at(build(left, right), n, oppos)
            if not (_float_literal(lnode) or _float_literal(rnode)):
                if _int_literal(rnode) and lnode is not None:
                    return self.numeric_mul(left, right, left, n, oppos)
                if _int_literal(lnode):
                    return self.numeric_mul(left, right, right, n, oppos)
                return self.at(E.call("$mul", [left, right]), n, oppos)
            # by a Float: a String or an Array fails in Python's ``*`` as in ``$mul``
        if not need_l and not need_r:
            return self.at(build(left, right), n, oppos)
        # The tests run before the operation: keep operands evaluated left to right, once.
        if need_r and not is_trivial(left) and not is_trivial(right):
            left = self.spill(left)
        tests: list[py.expr] = []
        lref, rref = left, right
        if need_r and is_trivial(left):
            rref, rtests = self.bool_guard(right)
            tests += rtests
            if need_l:
                tests += self.bool_guard(left)[1]
        else:
            if need_l:
                lref, ltests = self.bool_guard(left)
                tests += ltests
            if need_r:
                rref, rtests = self.bool_guard(right)
                tests += rtests
        fail = self.at(E.call("$boolop", [E.const(op), lref, rref]), n, oppos)
        return self.at(py.IfExp(E.and_(tests), self.at(build(lref, rref), n, oppos), fail), n, oppos)

    def known_int(self, n: A.Node) -> bool:
        """Whether ``n`` evaluates to an Int (or fails), given ``int_names``."""
        if isinstance(n, A.Literal):
            return type(n.value) is int
        if isinstance(n, A.Name):
            b = self.scope.lookup(n.name)
            return b is not None and b.pyname in self.int_names
        if isinstance(n, A.Unary):
            return n.op == "-" and self.known_int(n.operand)
        if isinstance(n, A.Binary):
            return n.op in ("+", "-", "*", "//", "%") and self.known_int(n.left) and self.known_int(n.right)
        return False

    def numeric_mul(self, left: py.expr, right: py.expr, other: py.expr, n: A.Node,
                    oppos: tuple[int, int, int] | None) -> py.expr:
        """``left * right``, one of them an Int literal and ``other`` the other: Python's
        ``*`` when ``other`` is an Int or a Float (not a Bool), else ``$mul`` as before."""
        if is_trivial(other):
            ref: py.expr = other
            first: py.expr = other
        else:
            t = self.fresh()
            ref = E.name(t)
            first = py.NamedExpr(E.store(t), other)
        if other is left:
            left = ref
        else:
            right = ref
        self.builtins["$f:type"] = type
        self.builtins["$f:int"] = int
        self.builtins["$f:float"] = float
        typ = E.call("$f:type", [first])
        test = py.BoolOp(py.Or(), [py.Compare(typ, [py.Is()], [E.name("$f:int")]),
                                   py.Compare(E.call("$f:type", [ref]), [py.Is()], [E.name("$f:float")])])
        fast = self.at(py.BinOp(left, py.Mult(), right), n, oppos)
        return self.at(py.IfExp(test, fast, self.at(E.call("$mul", [left, right]), n, oppos)), n, oppos)

    def x_Binary(self, n: A.Binary) -> py.expr:
        op = n.op
        oppos = (n.op_line, n.op_col, len(op))
        if op in ("&&", "||"):
            return self.logical(n)
        left, right = self.seq([n.left, n.right])
        if op == "+":
            return self.at(E.call("$add", [left, right]), n, oppos)
        if op in _ARITH:
            return self.numeric_op(op, left, right, n, n.left, n.right, oppos)
        if op in ("==", "!="):
            if self.native_eq(n.left) or self.native_eq(n.right):
                cmp_op: Any = py.Eq() if op == "==" else py.NotEq()
                return self.at(py.Compare(left, [cmp_op], [right]), n, oppos)
            return self.at(E.call("$eq" if op == "==" else "$ne", [left, right]), n, oppos)
        if op == "=~":
            return self.at(E.call("$rematch", [left, right]), n, oppos)
        if op in ("in", "not in"):
            return self.at(E.call("$in" if op == "in" else "$notin", [left, right]), n, oppos)
        if self.in_guard and op in ("<", "<=", ">", ">="):
            return self.at(E.call("$gcmp", [left, right, E.const(op)]), n, oppos)
        return self.numeric_op(op, left, right, n, n.left, n.right, oppos)

    @staticmethod
    def native_eq(n: A.Node) -> bool:
        """Whether Python's ``==`` is exact here (Python says ``true == 1``; conch does not)."""
        if isinstance(n, A.Literal):
            v = n.value
            if type(v) is str or v is None:
                return True
            if type(v) in (int, float):
                return v not in (0, 1)
            return False
        if isinstance(n, A.Binary) and n.op in ("+", "-", "*", "/", "//", "%", "**"):
            return True
        return isinstance(n, A.Interp)

    def logical(self, n: A.Binary) -> py.expr:
        left = self.cond(n.left)
        rbuf: list[py.stmt] = []
        with self.into(rbuf):
            right = self.cond(n.right)
        oppos = (n.op_line, n.op_col, len(n.op))
        if not rbuf:
            node = py.BoolOp(py.And() if n.op == "&&" else py.Or(), [left, right])
            return self.at(node, n, oppos)
        t = self.fresh()
        self.emit(E.assign(t, left))
        test: py.expr = E.name(t) if n.op == "&&" else py.UnaryOp(py.Not(), E.name(t))
        self.emit(self.at(py.If(test, [*rbuf, E.assign(t, right)], []), n))
        return E.name(t)

    def x_RangeLit(self, n: A.RangeLit) -> py.expr:
        start, stop = self.seq([n.start, n.end])
        return self.at(E.call("$range", [start, stop, E.const(n.inclusive)]), n, (n.op_line, n.op_col, 2))

    def short_circuit(self, n: A.Field | A.Index | A.Call) -> py.expr | None:
        """``a?.b.c``: null when ``a?.b`` is null, without evaluating the rest of the chain."""
        path: list[A.Field | A.Index | A.Call] = [n]
        cur = _chain_child(n)
        while isinstance(cur, A.Field | A.Index | A.Call):
            if isinstance(cur, A.Field) and cur.optional:
                break
            path.append(cur)
            cur = _chain_child(cur)
        else:
            return None
        t = self.fresh("opt")
        test = py.Compare(py.NamedExpr(E.store(t), self.expr(cur)), [py.Is()], [E.const(None)])
        import copy

        copies = [copy.copy(x) for x in path]
        for parent, child in itertools.pairwise(copies):
            _set_chain_child(parent, child)
        _set_chain_child(copies[-1], A.Raw(t, line=cur.line, col=cur.col))
        rest = self.expr(copies[0])
        return self.at(py.IfExp(test, E.const(None), rest), n)

    def x_Field(self, n: A.Field) -> py.expr:
        if not n.optional and n.obj is not None:
            sc = self.short_circuit(n)
            if sc is not None:
                return sc
        if n.obj is None:
            obj = self.pipe_input[-1]
            if obj is None:
                raise compile_error("SyntaxError", f"'.{n.name}' needs an input", n,
                           f"use it as a pipeline stage: value | .{n.name}")
            self.pipe_used = True
        else:
            obj = self.expr(n.obj)
        helper = "$ofield" if n.optional else "$field"
        return self.at(E.call(helper, [obj, E.const(n.name)]), n, (n.op_line, n.op_col, len(n.name)))

    def x_Index(self, n: A.Index) -> py.expr:
        sc = self.short_circuit(n)
        if sc is not None:
            return sc
        pos = (n.op_line, n.op_col, 1)
        if n.index is not None:
            obj, idx = self.seq([n.obj, n.index])
            if isinstance(n.index, A.RangeLit):
                # ``x[1..3]`` slices without building the range
                assert isinstance(idx, py.Call)
                return self.at(E.call("$slice", [obj, idx.args[0], idx.args[1], idx.args[2]]), n, pos)
            return self.at(E.call("$index", [obj, idx]), n, pos)
        parts = [n.obj] + [p for p in (n.start, n.stop) if p is not None]
        exprs = self.seq(parts)
        obj = exprs[0]
        rest = iter(exprs[1:])
        start = next(rest) if n.start is not None else E.const(None)
        stop = next(rest) if n.stop is not None else E.const(None)
        return self.at(E.call("$slice", [obj, start, stop, E.const(n.inclusive)]), n, pos)

    def x_Call(self, n: A.Call, first: py.expr | None = None) -> py.expr:
        if first is None:
            if self.fuse and isinstance(n.func, A.Name) and n.func.name in _FUSION_NAMES:
                from conch.lang import fusion

                fused = fusion.fuse(self, n)
                if fused is not None:
                    return fused
            sc = self.short_circuit(n)
            if sc is not None:
                return sc
        func = self.expr(n.func)
        nodes = list(n.args) + [v for _, v in n.kwargs]
        if first is not None:
            buf: list[py.stmt] = []
            with self.into(buf):
                exprs = self.seq(nodes)
            if buf:
                first = self.spill(first)
            self.out.extend(buf)
            exprs.insert(0, first)
            npos = len(n.args) + 1
        else:
            exprs = self.seq(nodes)
            npos = len(n.args)
        args = exprs[:npos]
        kws = [py.keyword(k, e) for (k, _), e in zip(n.kwargs, exprs[npos:], strict=True)]
        call = self.at(py.Call(func, args, kws), n)
        if self.fuse and not kws and isinstance(n.func, A.Name) and n.func.name in _FUSION_NAMES \
                and self.is_builtin(func):
            from conch.lang import inline

            return inline.inline_builtin(self, n.func.name, call, n) or call
        return call

    @staticmethod
    def is_builtin(e: py.expr) -> bool:
        return isinstance(e, py.Name) and e.id.startswith("$b:")

    def x_Pipe(self, n: A.Pipe) -> py.expr:
        stage = n.right.func if isinstance(n.right, A.Call) else n.right
        if self.fuse and isinstance(stage, A.Name) and stage.name in _FUSION_NAMES:
            from conch.lang import fusion

            fused = fusion.fuse(self, n)
            if fused is not None:
                return fused
        left = self.expr(n.left)
        right = n.right
        if isinstance(right, A.Call):
            return self.x_Call(right, first=left)
        if isinstance(right, A.Name):
            func = self.expr(right)
            call = self.at(py.Call(func, [left], []), right)
            if self.fuse and right.name in _FUSION_NAMES and self.is_builtin(func):
                from conch.lang import inline

                return inline.inline_builtin(self, right.name, call, right) or call
            return call
        if isinstance(right, A.Lambda) and not isinstance(right.body, A.Block) and not right.params[1:] and right.params and right.params[0].default is None:
            return self.at(py.Call(self.expr(right), [left], []), right)
        left = self.spill(left)
        self.pipe_input.append(left)
        saved = self.pipe_used
        self.pipe_used = False
        try:
            e = self.expr(right)
            used = self.pipe_used
        finally:
            self.pipe_input.pop()
            self.pipe_used = saved
        if used:
            return e
        return self.at(E.call("$pipe", [e, left]), right)

    def x_Lambda(self, n: A.Lambda) -> py.expr:
        return self.function(n, None)

    def x_Block(self, n: A.Block) -> py.expr:
        return self.block_value(n)

    def x_If(self, n: A.If) -> py.expr:
        return self.if_(n, want_value=True)

    def if_(self, n: A.If, want_value: bool) -> py.expr:
        cond = self.cond(n.cond)
        then_stmts: list[py.stmt] = []
        with self.into(then_stmts):
            then_val = self.block_value(n.then, want_value)
        else_stmts: list[py.stmt] = []
        with self.into(else_stmts):
            if n.orelse is None:
                else_val: py.expr = E.const(None)
            elif isinstance(n.orelse, A.If):
                else_val = self.if_(n.orelse, want_value)
            else:
                else_val = self.block_value(n.orelse, want_value)
        if not want_value:
            if not is_trivial(then_val):
                then_stmts.append(py.Expr(then_val))
            if not is_trivial(else_val):
                else_stmts.append(py.Expr(else_val))
            self.emit(self.at(py.If(cond, then_stmts or [py.Pass()], else_stmts), n))
            return E.const(None)
        if not then_stmts and not else_stmts:
            return self.at(py.IfExp(cond, then_val, else_val), n)
        t = self.fresh()
        then_stmts.append(E.assign(t, then_val))
        else_stmts.append(E.assign(t, else_val))
        self.emit(self.at(py.If(cond, then_stmts, else_stmts), n))
        return E.name(t)

    def x_Match(self, n: A.Match) -> py.expr:
        from conch.lang import patterns

        return patterns.match(self, n)

    def pattern(self, p: A.Pattern, subject: py.expr) -> py.expr:
        """A test of ``subject`` against ``p`` that binds the pattern's names as it goes
        (:mod:`conch.lang.patterns`, imported when a program first has a pattern)."""
        from conch.lang import patterns

        return patterns.pattern(self, p, subject)

    def x_Try(self, n: A.Try) -> py.expr:
        result = self.fresh("r")
        body: list[py.stmt] = []
        with self.into(body):
            v = self.block_value(n.body)
            body.append(E.assign(result, v))
        exc = self.fresh("e")
        handler: list[py.stmt] = []
        with self.into(handler), self.new_scope():
            converted = E.call("$catch", [E.name(exc)])
            if n.name:
                b = self.declare(n.name)
                self.emit(E.assign(b.pyname, converted))
            else:
                self.emit(py.Expr(converted))
            self.predeclare_fns(n.handler.stmts)
            hv = self.statements(n.handler.stmts, want_value=True)
            self.emit(E.assign(result, hv))
        h = py.ExceptHandler(E.name("$Exception"), exc, handler)
        self.emit(self.at(py.Try(body, [h], [], []), n))
        return E.name(result)

    def x_Break(self, n: A.Break) -> py.expr:
        if self.loop_depth == 0:
            raise compile_error("SyntaxError", "'break' outside a loop", n)
        self.emit(self.at(py.Break(), n))
        return E.const(None)

    def x_Continue(self, n: A.Continue) -> py.expr:
        if self.loop_depth == 0:
            raise compile_error("SyntaxError", "'continue' outside a loop", n)
        self.emit(self.at(py.Continue(), n))
        return E.const(None)

    def x_Return(self, n: A.Return) -> py.expr:
        value = self.expr(n.value) if n.value is not None else E.const(None)
        self.emit(self.at(py.Return(value), n))
        return E.const(None)

    def x_Throw(self, n: A.Throw) -> py.expr:
        value = self.expr(n.value)
        self.emit(self.at(py.Raise(E.call("$throw", [value]), None), n))
        return E.const(None)

    def x_Let(self, n: A.Let) -> py.expr:
        raise compile_error("SyntaxError", "'let' is a statement", n)
