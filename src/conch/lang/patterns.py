"""Compiling pattern matching: ``match`` expressions, and the patterns of their arms that a
destructuring ``let`` or ``for`` uses too (``let [a, ...rest] = xs``, ``for {k, v} in ...``).

A part of :class:`conch.lang.compiler.Compiler` in a module of its own, imported the first
time a program has a pattern: ``conch -c '1 + 1'`` compiles without it. The compiler is
reached as an :class:`conch.lang.emit.Emitter`.
"""

from __future__ import annotations

# _ast holds the node classes that the ast module re-exports; ast itself (with enum and
# contextlib) would add milliseconds to every ``conch -c``.
import _ast as py

from conch.lang import ast as A
from conch.lang import emit as E
from conch.lang.emit import compile_error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from conch.lang.emit import Emitter


def match(self: Emitter, n: A.Match) -> py.expr:
    subject = self.spill(self.expr(n.subject))
    if not isinstance(subject, py.Name):
        t = self.fresh("m")
        self.emit(E.assign(t, subject))
        subject = E.name(t)
    result = self.fresh("r")
    arms: list[tuple[py.expr, list[py.stmt], A.MatchArm]] = []
    complex_guard = False
    for arm in n.arms:
        with self.new_scope():
            test = self.pattern(arm.pattern, subject)
            gbuf: list[py.stmt] = []
            if arm.guard is not None:
                self.in_guard = True
                try:
                    with self.into(gbuf):
                        guard = self.cond(arm.guard)
                finally:
                    self.in_guard = False
            body: list[py.stmt] = []
            with self.into(body):
                value = self.expr(arm.body)
            body.append(E.assign(result, value))
            if arm.guard is not None and not gbuf:
                test = py.BoolOp(py.And(), [test, guard])
            elif arm.guard is not None:
                complex_guard = True
                body = [*gbuf, py.If(guard, body, [])]
        self.at(test, arm.pattern)
        arms.append((test, body, arm))
    if not complex_guard:
        tail: list[py.stmt] = [E.assign(result, E.const(None))]
        for test, body, arm in reversed(arms):
            tail = [self.at(py.If(test, body, tail), arm.pattern)]
        for s in tail:
            self.emit(s)
        return E.name(result)
    done = self.fresh("done")
    self.emit(E.assign(result, E.const(None)))
    self.emit(E.assign(done, E.const(False)))
    for test, body, arm in arms:
        # the arm's body (and guard) set the flag when they produce the result
        inner = body
        last_if = inner[-1]
        if isinstance(last_if, py.If):
            last_if.body.append(E.assign(done, E.const(True)))
        else:
            inner.append(E.assign(done, E.const(True)))
        gate = py.BoolOp(py.And(), [py.UnaryOp(py.Not(), E.name(done)), test])
        self.emit(self.at(py.If(gate, inner, []), arm.pattern))
    return E.name(result)


def pattern(self: Emitter, p: A.Pattern, subject: py.expr) -> py.expr:
    """A test of ``subject`` against ``p`` that binds the pattern's names as it goes."""
    if isinstance(p, A.PWild):
        return E.const(True)
    if isinstance(p, A.PBind):
        b = self.declare(p.name)
        bind = py.NamedExpr(E.store(b.pyname), subject)
        return py.BoolOp(py.Or(), [bind, E.const(True)])
    if isinstance(p, A.PLit):
        v = p.value
        if type(v) is str:
            return py.Compare(subject, [py.Eq()], [E.const(v)])
        return E.call("$peq", [subject, E.const(v)])
    if isinstance(p, A.PRange):
        return E.call("$inrange", [subject, E.const(p.start), E.const(p.end), E.const(p.inclusive)])
    if isinstance(p, A.POr):
        return py.BoolOp(py.Or(), [self.pattern(o, subject) for o in p.options])
    if isinstance(p, A.PArray):
        t = self.fresh("a")
        tests: list[py.expr] = [
            py.Compare(py.NamedExpr(E.store(t), E.call("$asarray", [subject])), [py.IsNot()], [E.const(None)]),
        ]
        count = len(p.items)
        length = E.call("$len", [E.name(t)])
        tests.append(py.Compare(length, [py.GtE() if p.has_rest else py.Eq()], [E.const(count)]))
        for i, item in enumerate(p.items):
            sub = py.Subscript(E.name(t), E.const(i), py.Load())
            tests.append(self.pattern(item, sub))
        if p.rest:
            b = self.declare(p.rest)
            rest = py.Subscript(E.name(t), py.Slice(E.const(count), None, None), py.Load())
            tests.append(py.BoolOp(py.Or(), [py.NamedExpr(E.store(b.pyname), rest), E.const(True)]))
        return py.BoolOp(py.And(), tests)
    if isinstance(p, A.PRecord):
        tests = [E.call("$isrecord", [subject])]
        for key, sub_p in p.fields:
            tests.append(py.Compare(E.const(key), [py.In()], [subject]))
            tests.append(self.pattern(sub_p, py.Subscript(subject, E.const(key), py.Load())))
        return py.BoolOp(py.And(), tests)
    raise compile_error("SyntaxError", "unsupported pattern", p)
