"""Fused pipelines: a chain of element-wise collection builtins compiled as one loop.

``range(0, n) | map(fn(x) => x * 2) | where(fn(x) => x % 3 == 0) | sum`` costs, unfused,
two lambda calls and a wrapper's type checks per element. Here the compiler recognises a
chain of ``map``/``where``/``each``/``take``/``skip``/``take_while`` (ending, perhaps, in
``reduce``, ``sum`` or ``count``/``any``/``all`` with a predicate) whose functions are
lambdas simple enough to inline, and emits comprehensions or one loop with the lambda
bodies in place.

The fused code must be indistinguishable from the builtins it replaces, and that decides its
shape:

- Order. On a list the builtins run stage by stage (every element through ``map`` before
  ``where`` sees one); on a Range they chain lazily, element by element. So a chain over a
  list becomes one comprehension per stage, over a Range one generator: effects and the
  first error come in the same order as before.
- Positions. An error's position is that of the failing instruction in the innermost
  compiled frame (``interpreter._position``). An inlined body keeps its own nodes' positions;
  a check that a builtin makes (``where``'s Bool result, ``reduce`` of nothing) is emitted
  at the stage's call node, which is where the unfused run reports it. A lazy builtin's
  check reports at whoever consumes the result, which is not known here: a lazy stage whose
  predicate is not a Bool by construction ends the fused generator (the rest runs unfused).
- What is not known until run time stays exact by branching: a chain whose input's type is
  not known from its syntax tests it (a list, else a Range or LazyList) and keeps the unfused
  code for anything else (a tuple, a value that is not an Array and must fail as before).
- Limits. In a checked compile each inlined lambda still ticks once per call, at the
  lambda's position, in the same order; materialising stays with the builtins' own
  ``bounded_list`` and ``LazyList`` (collection limit). A map or where over a list whose
  body makes no step of its own (``_tickless``) takes its steps in batches (``_batched``):
  a chunk that no step of which would reach the limit runs without ticks and adds its steps
  after, or up to the element that failed; any other chunk ticks per element. The loop of
  a fold, a test or a summed chain over a list or a Range does the same (``_batched_loop``).
  Nothing observes the counter in between, so limits, errors and output come as before.
- Captures. A generator is consumed later, possibly after the loop that made it moved on;
  like a lambda it takes the immutable bindings it reads as keyword defaults (by value).

Lambdas are inlined when their body is an expression that compiles without statements and
names no mutable binding; any other chain compiles unfused. ``Compiler(fuse=False)`` (and
``compile_program(..., fuse=False)``) turns all of this off, which the tests use to compare
both on the whole corpus.

A few string builtins (``upper``, ``lower``, ``trim``, ``split``, ``join``, ``len``) are
compiled as the Python method they call, behind a type test whose other branch is the checked
call itself, so a wrong argument fails exactly as before: :mod:`conch.lang.inline`.
"""

from __future__ import annotations

import _ast as py
import builtins

from conch.lang import ast as A
from conch.lang import emit as E
from conch.lang.emit import Func, Scope
from conch.lang.errors import ConchError
from conch.lang.inline import builtin_name, helper

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from conch.lang.emit import Emitter

_ELEMENTWISE = frozenset(("map", "where", "each", "take_while"))
_COUNTED = frozenset(("take", "skip"))
_TESTS = frozenset(("count", "any", "all"))  # with a predicate
_ENDS = frozenset(("reduce", "sum")) | _TESTS  # only at the end of a chain
_STAGES = _ELEMENTWISE | _COUNTED | _ENDS


class _NotFusable(Exception):
    """Raised while fusing: give up and compile the chain as written."""


class _Stage:
    __slots__ = ("args", "call", "func", "lam", "name", "node")

    def __init__(self, name: str, node: A.Node, call: A.Node, func: A.Name, args: list[A.Node]) -> None:
        self.name = name
        self.node = node  # the Pipe or Call node that is this stage in the tree
        self.call = call  # where the unfused call is positioned (``xs | sum``: at ``sum``)
        self.func = func  # the builtin's name
        self.args = args  # the arguments besides the input
        self.lam: A.Lambda | None = args[0] if args and isinstance(args[0], A.Lambda) else None


def _stage(c: Emitter, node: A.Node) -> tuple[_Stage, A.Node] | None:
    """``node`` as a stage and its input node, if it is one this module fuses."""
    call: A.Node
    if isinstance(node, A.Pipe) and isinstance(node.right, A.Name):
        call = func = node.right
        src, args = node.left, []
    else:
        if isinstance(node, A.Pipe) and isinstance(node.right, A.Call):
            call = node.right
            src, args = node.left, list(node.right.args)
        elif isinstance(node, A.Call) and node.args:
            call = node
            src, args = node.args[0], list(node.args[1:])
        else:
            return None
        if call.kwargs or not isinstance(call.func, A.Name):
            return None
        func = call.func
    name = builtin_name(c, func.name)
    if name not in _STAGES:
        return None
    st = _Stage(name, node, call, func, args)
    if name in _COUNTED:
        return (st, src) if len(args) == 1 else None
    if name == "sum":
        return (st, src) if not args else None
    lam = st.lam
    if lam is None or len(args) not in ((1, 2) if name == "reduce" else (1,)):
        return None
    if len(lam.params) != (2 if name == "reduce" else 1) or any(p.default is not None for p in lam.params):
        return None
    if not _simple(c, lam.body, {p.name for p in lam.params}):
        return None
    return st, src


def _simple(c: Emitter, n: A.Node | None, local: set[str]) -> bool:
    """Whether a lambda body can be inlined: an expression that needs no statements and
    reads no mutable binding (checked again on the compiled code: no statements emitted)."""
    if n is None or isinstance(n, A.Literal | A.Raw):
        return True
    if isinstance(n, A.Name):
        if n.name in local:
            return True
        b = c.scope.lookup(n.name)
        return b is None or not b.mutable
    if isinstance(n, A.Interp):
        return all(isinstance(p, str) or _simple(c, p, local) for p in n.parts)
    if isinstance(n, A.ArrayLit):
        return all(_simple(c, x, local) for x in n.items)
    if isinstance(n, A.RecordLit):
        return all(_simple(c, v, local) for _, v in n.entries)
    if isinstance(n, A.Unary):
        return _simple(c, n.operand, local)
    if isinstance(n, A.Binary):
        return _simple(c, n.left, local) and _simple(c, n.right, local)
    if isinstance(n, A.RangeLit):
        return _simple(c, n.start, local) and _simple(c, n.end, local)
    if isinstance(n, A.Field):
        return _simple(c, n.obj, local)
    if isinstance(n, A.Index):
        return all(_simple(c, x, local) for x in (n.obj, n.index, n.start, n.stop))
    if isinstance(n, A.Call):
        return _simple(c, n.func, local) and all(_simple(c, x, local) for x in n.args) and all(
            _simple(c, v, local) for _, v in n.kwargs)
    if isinstance(n, A.Pipe):
        return _simple(c, n.left, local) and _simple(c, n.right, local)
    if isinstance(n, A.Lambda):
        if isinstance(n.body, A.Block) or c.checked:
            return False  # compiles to a def: a statement
        inner = local | {p.name for p in n.params}
        return all(_simple(c, p.default, local) for p in n.params) and _simple(c, n.body, inner)
    if isinstance(n, A.If):
        return (_simple(c, n.cond, local) and _simple_block(c, n.then, local)
                and (n.orelse is None or (_simple_block(c, n.orelse, local) if isinstance(n.orelse, A.Block)
                                          else _simple(c, n.orelse, local))))
    return False


def _simple_block(c: Emitter, b: A.Block, local: set[str]) -> bool:
    return len(b.stmts) == 1 and _simple(c, b.stmts[0], local)


def _chain(c: Emitter, node: A.Node) -> tuple[list[_Stage], A.Node] | None:
    stages: list[_Stage] = []
    cur = node
    while True:
        found = _stage(c, cur)
        if found is None or (found[0].name in _ENDS and stages):
            break  # a reduce's (a sum's, ...) result is an input, not a stage, to the chain around it
        stages.append(found[0])
        cur = found[1]
    if not any(s.lam is not None for s in stages):
        return None
    stages.reverse()
    return stages, cur


def _source_kind(c: Emitter, src: A.Node) -> str | None:
    """"range" or "list" when the input's type is known from its syntax."""
    if isinstance(src, A.RangeLit):
        return "range"
    if isinstance(src, A.ArrayLit):
        return "list"
    func: A.Node | None = None
    if isinstance(src, A.Call):
        func = src.func
    elif isinstance(src, A.Pipe):
        func = src.right.func if isinstance(src.right, A.Call) else src.right
    if isinstance(func, A.Name) and builtin_name(c, func.name) == "range":
        return "range"  # the builtin returns a Range or fails
    return None


# -- entry points ------------------------------------------------------------------------


def fuse(c: Emitter, node: A.Pipe | A.Call) -> py.expr | None:
    """The fused code for the chain ending at ``node``, or None to compile it as written."""
    if c.fusing:
        # Inside a chain being fused (a body, a count) chains compile as written: each of those
        # is compiled up to three times (list, lazy, as written), which nesting would multiply.
        return None
    chain = _chain(c, node)
    if chain is None:
        return None
    stages, src = chain
    kind = _source_kind(c, src)
    saved = (c.func, c.scope, c.loop_depth, len(c.pipe_input), c.pipe_used, len(c.unresolved))
    buf: list[py.stmt] = []
    try:
        with c.into(buf):
            cur = _temp(c, c.expr(src), src)  # compiled once: a chain in it may be fused
            c.fusing = True
            if kind == "range":
                result = _lazy_chain(c, stages, cur, ints=True)
            else:
                result = _eager_chain(c, stages, cur, kind == "list")
            if result is None:
                raise _NotFusable
    except (_NotFusable, ConchError):
        # Compiled as written instead; a compile error is raised again there, in order.
        c.func, c.scope, c.loop_depth = saved[0], saved[1], saved[2]
        del c.pipe_input[saved[3]:]
        c.pipe_used = saved[4]
        del c.unresolved[saved[5]:]
        return None
    finally:
        c.fusing = False
    c.out.extend(buf)
    return result


def _unfused(c: Emitter, stages: list[_Stage], src: py.expr) -> py.expr:
    """The chain compiled as written, over an input already evaluated into ``src``."""
    import copy  # here: the copy module costs a ``conch -c`` start-up about a millisecond

    assert isinstance(src, py.Name)
    cur: A.Node = A.Raw(src.id)
    for st in stages:
        node = copy.copy(st.node)
        if isinstance(node, A.Pipe):
            node.left = cur
        else:
            assert isinstance(node, A.Call)
            node.args = [cur, *node.args[1:]]
        cur = node
    saved = c.fuse
    c.fuse = False  # this chain (and what it contains) as written
    try:
        return c.expr(cur)
    finally:
        c.fuse = saved


def _temp(c: Emitter, e: py.expr, at: A.Node) -> py.Name:
    t = c.fresh()
    c.emit(c.at(E.assign(t, e), at))
    return E.name(t)


# -- bodies ------------------------------------------------------------------------------


def _body(c: Emitter, lam: A.Lambda, kinds: list[str | None], ints: set[str]) -> tuple[list[str], py.expr, str | None]:
    """Compile ``lam``'s body in place, its parameters holding values of ``kinds``: their
    Python names, the expression and the kind of its value. Raises _NotFusable if it needs
    statements.

    A kind is what is known of every value a stage sees: "int" (an Int), "num" (never a
    Bool: arithmetic on it needs no Bool check) or None.
    """
    saved_loop, saved_ints = c.loop_depth, c.int_names
    c.loop_depth = 0  # a break in the body is not one of the fused loop's
    c.int_names = ints  # ``*`` of Ints needs no ``$mul`` in a checked run
    c.pipe_input.append(None)
    stmts: list[py.stmt] = []
    try:
        with c.new_scope():
            names = []
            for p, kind in zip(lam.params, kinds, strict=True):
                names.append(c.declare(p.name, num=kind is not None).pyname)
                if kind == "int":
                    ints.add(names[-1])
            with c.into(stmts):
                e = c.expr(lam.body)
            kind = "int" if _int(c, lam.body, ints) else "num" if c.never_bool(lam.body) else None
    finally:
        c.loop_depth, c.int_names = saved_loop, saved_ints
        c.pipe_input.pop()
    if stmts:
        raise _NotFusable
    return names, e, kind


def _int(c: Emitter, n: A.Node, ints: set[str]) -> bool:
    """Whether ``n`` evaluates to an Int (or fails), given the bindings ``ints`` hold Ints."""
    if isinstance(n, A.Literal):
        return type(n.value) is int
    if isinstance(n, A.Name):
        b = c.scope.lookup(n.name)
        return b is not None and b.pyname in ints
    if isinstance(n, A.Unary):
        return n.op == "-" and _int(c, n.operand, ints)
    if isinstance(n, A.Binary):
        return n.op in ("+", "-", "*", "//", "%") and _int(c, n.left, ints) and _int(c, n.right, ints)
    return False


def _tick(c: Emitter, lam: A.Lambda) -> py.expr:
    """The step a checked run counts on entering the lambda, where the lambda would."""
    return c.at(E.call("$tick", []), lam)


def _not_bool(c: Emitter, st: _Stage, r: py.expr, first: py.expr | None = None) -> py.expr:
    """``r`` is True, or False, or the builtin's own error at the stage's call (``first``:
    what to test first, if not ``r`` itself)."""
    from conch.lang.builtins.collections import not_bool

    fail = c.at(E.call(helper(c, "$f:notbool", not_bool), [E.const(st.name), r]), st.call)
    return py.BoolOp(py.Or(), [py.Compare(first or r, [py.Is()], [E.const(True)]),
                               py.BoolOp(py.And(), [py.Compare(r, [py.IsNot()], [E.const(False)]), fail])])


def _comp(target: str, it: py.expr, ifs: list[py.expr]) -> py.comprehension:
    return py.comprehension(E.store(target), it, ifs, 0)


# -- a list: one comprehension per stage ----------------------------------------------------


def _eager_chain(c: Emitter, stages: list[_Stage], s: py.Name, static: bool) -> py.expr:
    if static:
        return _eager(c, stages, s)
    fused: list[py.stmt] = []
    lazy: list[py.stmt] = []
    other: list[py.stmt] = []
    r = c.fresh("r")
    with c.into(fused):
        c.emit(E.assign(r, _eager(c, stages, s)))
    with c.into(lazy):
        value = _lazy_chain(c, stages, s, ints=False)
        if value is not None:
            c.emit(E.assign(r, value))
    with c.into(other):
        c.emit(E.assign(r, _unfused(c, stages, s)))
    from conch.lang.values import LazyList

    typ = helper(c, "$f:type", type)

    def test(*types: str) -> py.expr:
        return _or([py.Compare(E.call(typ, [s]), [py.Is()], [E.name(t)]) for t in types])

    if lazy:
        other = [c.at(py.If(test(helper(c, "$f:range", range), helper(c, "$f:LazyList", LazyList)), lazy, other),
                      stages[0].call)]
    c.emit(c.at(py.If(test(helper(c, "$f:list", list)), fused, other), stages[0].call))
    return E.name(r)


def _or(tests: list[py.expr]) -> py.expr:
    return tests[0] if len(tests) == 1 else py.BoolOp(py.Or(), tests)


def _eager(c: Emitter, stages: list[_Stage], cur: py.Name) -> py.expr:
    kind: str | None = None  # of the elements: known after a map whose body is arithmetic
    for i, st in enumerate(stages):
        e, kind = _eager_stage(c, st, cur, kind)
        if i == len(stages) - 1:
            return e
        cur = _temp(c, e, st.call)
    raise AssertionError("no stages")


def _eager_stage(c: Emitter, st: _Stage, cur: py.expr, kind: str | None = None) -> tuple[py.expr, str | None]:
    """One stage over a list; the expression and the kind of the elements it gives."""
    if st.name in _COUNTED or st.name == "sum":
        # A slice or a sum of a list: no per-element call to save, so the builtin itself.
        args = [c.expr(a) for a in st.args]
        return c.at(py.Call(c.load(st.func.name, st.func), [cur, *args], []), st.call), kind
    lam = st.lam
    assert lam is not None
    if st.name == "reduce":
        return _fold(c, st, [], cur, lazy=False, ints=kind == "int"), None
    if st.name in _TESTS:
        return _test(c, st, [], cur, lazy=False, ints=kind == "int"), None
    if st.name == "take_while":
        gen, _ = _generator(c, [st], cur, lazy=False, ints=kind == "int")
        return c.at(E.call(helper(c, "$f:bounded", _bounded_list()), [gen]), st.call), kind
    ints: set[str] = set()
    names, body, body_kind = _body(c, lam, [kind], ints)
    x = names[0]
    ticks: list[py.expr] = [py.UnaryOp(py.Not(), _tick(c, lam))] if c.checked else []
    if st.name in ("map", "where"):
        if st.name == "map":
            value, ifs, out_kind = body, [], body_kind
        elif E.is_bool(body):
            value, ifs, out_kind = E.name(x), [body], kind
        else:
            r = c.fresh("r")
            value, ifs, out_kind = E.name(x), [_not_bool(c, st, E.name(r), py.NamedExpr(E.store(r), body))], kind
        if c.checked and _tickless(lam.body):
            return _batched(c, st, lam, x, cur, value, ifs), out_kind
        return c.at(py.ListComp(value, [_comp(x, cur, [*ticks, *ifs])]), st.call), out_kind
    # each: the results that are not null, through bounded_list as the builtin does. The
    # result is bound in a condition: a comprehension's iterable may not bind a name (and
    # the body may, in a Bool guard).
    r = c.fresh("r")
    keep = py.Compare(py.NamedExpr(E.store(r), body), [py.IsNot()], [E.const(None)])
    gen = c.at(py.GeneratorExp(E.name(r), [_comp(x, cur, [*ticks, keep])]), st.call)
    return c.at(E.call(helper(c, "$f:bounded", _bounded_list()), [gen]), st.call), body_kind


# -- a checked stage over a list: its steps in batches ----------------------------------

_CHUNK = 4096  # elements a batch takes at most: cancellation and the clock are looked at between


def _tickless(n: A.Node | None) -> bool:
    """Whether an inlined body (see ``_simple``) makes no steps of its own, has no effects and
    takes a short time: no calls (a builtin may call a function, which steps, or print), no
    pipes, no ``**`` or ``=~`` (a big power or a slow pattern would make a batch slow to
    notice the clock)."""
    if n is None or isinstance(n, A.Literal | A.Raw | A.Name):
        return True
    if isinstance(n, A.Interp):
        return all(isinstance(p, str) or _tickless(p) for p in n.parts)
    if isinstance(n, A.ArrayLit):
        return all(_tickless(x) for x in n.items)
    if isinstance(n, A.RecordLit):
        return all(_tickless(v) for _, v in n.entries)
    if isinstance(n, A.Unary):
        return _tickless(n.operand)
    if isinstance(n, A.Binary):
        return n.op not in ("**", "=~") and _tickless(n.left) and _tickless(n.right)
    if isinstance(n, A.RangeLit):
        return _tickless(n.start) and _tickless(n.end)
    if isinstance(n, A.Field):
        return _tickless(n.obj)
    if isinstance(n, A.Index):
        return all(_tickless(x) for x in (n.obj, n.index, n.start, n.stop))
    if isinstance(n, A.If):
        return (_tickless(n.cond) and all(_tickless(s) for s in n.then.stmts)
                and (n.orelse is None or (all(_tickless(s) for s in n.orelse.stmts)
                                          if isinstance(n.orelse, A.Block) else _tickless(n.orelse))))
    return False


def _batched(c: Emitter, st: _Stage, lam: A.Lambda, x: str, cur: py.expr, value: py.expr,
             ifs: list[py.expr]) -> py.expr:
    """A map or where over the list ``cur`` in a checked run, its body making no steps of its
    own: chunks of at most _CHUNK elements, each run without a step per element when
    ``$batch`` says none of its steps would reach the step limit (then ``$steps`` adds the
    steps taken: all of them, or, when an element fails, those up to and including it, which
    is what the iterator has given), else with a ``$tick`` per element as unbatched. So the
    step limit is met at the same element, and an error comes after the same steps.

        r = []; it = iter(cur); left = len(cur)
        while left:
            m = left if left <= _CHUNK else _CHUNK; left -= m
            if $batch(m):
                try: r += [value for x in islice(it, m) if ifs]
                finally: $steps(m - (it.__length_hint__() - left))
            else:
                r += [value for x in islice(it, m) if not $tick() and ifs]
    """
    import itertools

    r, it, left, m = c.fresh("r"), c.fresh("it"), c.fresh("left"), c.fresh("m")
    islice = helper(c, "$f:islice", itertools.islice)
    length = helper(c, "$f:len", len)
    chunk = E.call(islice, [E.name(it), E.name(m)])
    fast = c.at(py.ListComp(value, [_comp(x, chunk, ifs)]), st.call)
    slow = c.at(py.ListComp(value, [_comp(x, chunk, [py.UnaryOp(py.Not(), _tick(c, lam)), *ifs])]), st.call)
    hint = E.call(py.Attribute(E.name(it), "__length_hint__", py.Load()), [])
    taken = py.BinOp(E.name(m), py.Sub(), py.BinOp(hint, py.Sub(), E.name(left)))
    add = c.at(py.Expr(c.at(E.call("$steps", [taken]), lam)), lam)
    loop = py.While(E.name(left), [
        E.assign(m, py.IfExp(py.Compare(E.name(left), [py.LtE()], [E.const(_CHUNK)]), E.name(left), E.const(_CHUNK))),
        py.AugAssign(E.store(left), py.Sub(), E.name(m)),
        py.If(c.at(E.call("$batch", [E.name(m)]), lam), [
            py.Try([py.AugAssign(E.store(r), py.Add(), fast)], [], [], [add]),
        ], [py.AugAssign(E.store(r), py.Add(), slow)]),
    ], [])
    for stmt in (E.assign(r, py.List([], py.Load())), E.assign(it, E.call(helper(c, "$f:iter", iter), [cur])),
                 E.assign(left, E.call(length, [cur])), loop):
        c.emit(c.at(stmt, st.call))
    return E.name(r)


def _bounded_list() -> Any:
    from conch.lang.values import bounded_list

    return bounded_list


# -- a Range: one generator for the chain ---------------------------------------------------


class _Unfusable(Exception):
    """A stage that a lazy generator cannot take: the generator ends before ``index``."""

    def __init__(self, index: int) -> None:
        self.index = index


def _lazy_chain(c: Emitter, stages: list[_Stage], cur: py.Name, ints: bool) -> py.expr | None:
    """The chain over a Range (``ints``) or a LazyList; None when no stage could be fused
    (and nothing was emitted)."""
    mark = len(c.out)
    i = 0
    while i < len(stages) and stages[i].name in _COUNTED:
        # take/skip of a Range is a Range (the builtin slices it), of a LazyList a LazyList
        cur = _temp(c, _eager_stage(c, stages[i], cur)[0], stages[i].call)
        i += 1
    rest = stages[i:]
    end = len(rest)
    result: py.expr | None = None
    while any(s.lam is not None for s in rest[:end]):
        start = len(c.out)
        try:
            result = _lazy(c, rest[:end], cur, ints)
            break
        except _Unfusable as stop:
            del c.out[start:]
            end = stop.index
    if result is None:
        del c.out[mark:]
        return None
    if end < len(rest):
        return _unfused(c, rest[end:], _temp(c, result, rest[end - 1].call))
    return result


def _lazy(c: Emitter, stages: list[_Stage], src: py.Name, ints: bool) -> py.expr:
    end = stages[-1]
    if end.name == "reduce":
        return _fold(c, end, stages[:-1], src, lazy=True, ints=ints)
    if end.name in _TESTS:
        return _test(c, end, stages[:-1], src, lazy=True, ints=ints)
    from conch.lang.values import LazyList

    if end.name != "sum":
        gen, _ = _generator(c, stages, src, lazy=True, ints=ints)
        return c.at(E.call(helper(c, "$f:LazyList", LazyList), [gen]), end.call)
    gen, kind = _generator(c, stages[:-1], src, lazy=True, ints=ints, summed=True)
    if kind == "int":
        return c.at(E.call(helper(c, "$f:sum_ints", sum_ints), [gen]), end.call)
    lazy = c.at(E.call(helper(c, "$f:LazyList", LazyList), [gen]), stages[-2].call)
    return _eager_stage(c, end, lazy)[0]


def sum_ints(gen: Any) -> Any:
    """``sum`` of a fused chain that yields Ints: the builtin's result without the list the
    builtin builds, unless a collection limit applies to that list (then the builtin)."""
    from conch.lang.builtins.registry import REGISTRY
    from conch.lang.context import current
    from conch.lang.values import LazyList

    if current().limits.collection_size is not None:
        return REGISTRY["sum"].fn(LazyList(gen))
    return builtins.sum(gen)


def _counts(c: Emitter, stages: list[_Stage]) -> list[py.Name]:
    """Evaluate the take/skip counts in order and check them as the builtin does (by calling
    it on an empty list) before any element is produced, as the unfused chain does while it
    is built."""
    counts: list[py.Name] = []
    for st in stages:
        if st.name in _COUNTED:
            n = _temp(c, c.expr(st.args[0]), st.args[0])
            check = py.Call(c.load(st.func.name, st.func), [py.List([], py.Load()), n], [])
            c.emit(c.at(py.Expr(c.at(check, st.call)), st.call))
            counts.append(n)
    return counts


def _generator(c: Emitter, stages: list[_Stage], src: py.expr, lazy: bool,
               ints: bool = False, summed: bool = False) -> tuple[py.expr, str | None]:
    """A call of a generator function taking ``src`` through ``stages``, and the kind of the
    values it yields (``summed``: consumed by ``sum``, which makes no steps in between)."""
    counts: list[py.expr] = list(_counts(c, stages))

    def last(value: py.expr, kind: str | None) -> list[py.stmt]:
        loop.kind = kind
        return [py.Expr(py.Yield(value))]

    loop = _Loop(stages, lazy, ints, py.Return(None), last)
    loop.batch = summed and _all_tickless(stages)
    return _def(c, loop, src, counts, stages[-1].call), loop.kind


def _fold(c: Emitter, st: _Stage, stages: list[_Stage], src: py.expr, lazy: bool, ints: bool = False) -> py.expr:
    """``reduce`` as a loop: the stages before it, then its body on the accumulator."""
    lam = st.lam
    assert lam is not None
    counts: list[py.expr] = list(_counts(c, stages))
    init: py.expr = _temp(c, c.expr(st.args[1]), st.args[1]) if len(st.args) == 2 else E.const(None)
    acc = c.fresh("acc")
    first = c.fresh("first")

    def last(value: py.expr, kind: str | None) -> list[py.stmt]:
        names, body, _ = _body(c, lam, [None, kind], loop.ints)
        step: list[py.stmt] = [py.Expr(_tick(c, lam))] if c.checked else []
        step += [E.assign(names[0], E.name(acc)), E.assign(names[1], value), E.assign(acc, body)]
        return [py.If(E.name(first), [E.assign(acc, value), E.assign(first, E.const(False))], step)]

    from conch.lang.builtins.collections import empty_reduce

    loop = _Loop(stages, lazy, ints, py.Break(), last)
    loop.batch = _all_tickless([*stages, st])
    loop.takes_expr = False  # the value is used on one of two branches, after a tick
    # reduce_: a null (or no) initial value means the first element starts the fold
    loop.prologue = [E.assign(acc, E.name("$init")), E.assign(first, py.Compare(E.name(acc), [py.Is()], [E.const(None)]))]
    empty = c.at(py.Expr(c.at(E.call(helper(c, "$f:reduce_empty", empty_reduce), []), st.call)), st.call)
    loop.epilogue = [py.If(E.name(first), [empty], []), py.Return(E.name(acc))]
    loop.has_init = True
    return _def(c, loop, src, [*counts, init], st.call)


def _test(c: Emitter, st: _Stage, stages: list[_Stage], src: py.expr, lazy: bool, ints: bool = False) -> py.expr:
    """``count``, ``any`` or ``all`` with a predicate as a loop: the stages before it, then
    the predicate, checked as the builtin checks it (at its call, as the builtin reports it
    even on a lazy input, which it consumes itself); any and all stop where the builtin does."""
    lam = st.lam
    assert lam is not None
    counts: list[py.expr] = list(_counts(c, stages))
    acc = c.fresh("acc")

    def last(value: py.expr, kind: str | None) -> list[py.stmt]:
        names, body, _ = _body(c, lam, [kind], loop.ints)
        out: list[py.stmt] = [E.assign(names[0], value)]
        if c.checked:
            out.append(py.Expr(_tick(c, lam)))
        if E.is_bool(body):
            test = body
        else:
            r = c.fresh("r")
            out.append(E.assign(r, body))
            test = _not_bool(c, st, E.name(r))
        if st.name == "count":
            out.append(py.If(test, [py.AugAssign(E.store(acc), py.Add(), E.const(1))], []))
        elif st.name == "any":
            out.append(py.If(test, [E.assign(acc, E.const(True)), py.Break()], []))
        else:
            out.append(py.If(py.UnaryOp(py.Not(), test), [E.assign(acc, E.const(False)), py.Break()], []))
        return out

    loop = _Loop(stages, lazy, ints, py.Break(), last)
    loop.batch = _all_tickless([*stages, st])
    loop.prologue = [E.assign(acc, E.const({"count": 0, "any": False, "all": True}[st.name]))]
    loop.epilogue = [py.Return(E.name(acc))]
    return _def(c, loop, src, counts, st.call)


class _Loop:
    """One generated loop: its stages, what ends it early, and what its innermost part does."""

    def __init__(self, stages: list[_Stage], lazy: bool, ints: bool, stop: py.stmt, last: Any) -> None:
        self.stages = stages
        self.lazy = lazy  # a where/take_while must then be a Bool by construction
        self.int_elems = ints  # the input's elements are Ints (a Range's)
        self.stop = stop  # return from a generator, break from a fold
        self.last = last  # (value, value is never a Bool) -> statements
        self.prologue: list[py.stmt] = []
        self.epilogue: list[py.stmt] = []
        self.init: list[py.stmt] = []  # counters
        self.guards: list[py.expr] = []  # all must hold for the loop to pull anything
        self.params: list[str] = []  # one per count, then $init for a fold
        self.has_init = False  # a reduce's initial value is the last argument
        self.takes_expr = True  # ``last`` evaluates its value once, first: no temporary needed
        self.ints: set[str] = set()  # bindings known to hold Ints
        self.kind: str | None = None  # what is known of the values yielded
        self.batch = False  # nothing steps between its elements: may take its steps in batches


def _def(c: Emitter, loop: _Loop, src: py.expr, args: list[py.expr], at: A.Node) -> py.expr:
    """Define the function running ``loop`` over its first argument; return its call. Like a
    lambda it takes the immutable bindings it reads as keyword defaults: the generator of a
    lazy chain may run after the loop that made it has moved on."""
    outer_func, outer_scope, outer_loop = c.func, c.scope, c.loop_depth
    func = Func(outer_func)
    c.func, c.scope, c.loop_depth = func, Scope(func, outer_scope), 0
    loop.params = [c.fresh("n") for _ in args]
    if loop.has_init:
        loop.params[-1] = "$init"
    x = c.fresh("x")
    try:
        inner = _stages(c, loop, 0, E.name(x), "int" if loop.int_elems else None, iter(loop.params))
    finally:
        c.func, c.scope, c.loop_depth = outer_func, outer_scope, outer_loop
    body: list[py.stmt] = [*loop.prologue, *loop.init]
    target = x
    head = inner[0]
    if isinstance(head, py.Assign) and isinstance(head.value, py.Name) and head.value.id == x:
        # the first stage's parameter is the loop variable (x is used nowhere else then)
        target = head.targets[0].id  # type: ignore[attr-defined]
        inner = inner[1:]
    for_stmt: py.stmt = py.For(E.store(target), E.name("$src"), inner, [], None)
    if loop.batch and c.checked:
        for_stmt = _batched_loop(c, target, inner, for_stmt)
    if loop.guards:
        for_stmt = py.If(E.and_(loop.guards), [for_stmt], [])
    body += [for_stmt, *loop.epilogue]
    captured = list(func.captures.values())
    for b in captured:
        c.access(b, outer_func)
    fargs = py.arguments(posonlyargs=[], args=[py.arg("$src"), *(py.arg(p) for p in loop.params)], vararg=None,
                         kwonlyargs=[py.arg(b.pyname) for b in captured],
                         kw_defaults=[E.name(b.pyname) for b in captured], kwarg=None, defaults=[])
    name = c.fresh("fused")
    fdef = py.FunctionDef(name=name, args=fargs, body=body, decorator_list=[], returns=None, type_comment=None)
    c.emit(c.at(fdef, at))
    return c.at(py.Call(E.name(name), [src, *args], []), at)


def _stages(c: Emitter, loop: _Loop, i: int, value: py.expr, kind: str | None, params: Any) -> list[py.stmt]:
    """The statements taking ``value`` through stages ``i``.. . Nested rather than
    ``continue``: a take looks at its count after every element it let through, whatever
    the stages after it did with the element."""
    if i == len(loop.stages):
        out: list[py.stmt] = loop.last(value, kind)
        return out
    st = loop.stages[i]
    if st.name in _COUNTED:
        n = E.name(next(params))
        k = c.fresh("k")
        loop.init.append(E.assign(k, E.const(0)))
        bump = py.AugAssign(E.store(k), py.Add(), E.const(1))
        rest = _stages(c, loop, i + 1, value, kind, params)
        if st.name == "skip":
            return [bump, py.If(py.Compare(E.name(k), [py.Gt()], [n]), rest, [])]
        # islice(items, n) pulls nothing when n is 0, and nothing after the n-th element
        loop.guards.append(py.Compare(n, [py.Gt()], [E.const(0)]))
        return [bump, *rest, py.If(py.Compare(E.name(k), [py.GtE()], [n]), [loop.stop], [])]
    lam = st.lam
    assert lam is not None
    names, body, body_kind = _body(c, lam, [kind], loop.ints)
    out = [E.assign(names[0], value)]
    if c.checked:
        out.append(py.Expr(_tick(c, lam)))
    if st.name in ("where", "take_while"):
        if E.is_bool(body):
            test = body
        elif loop.lazy:
            raise _Unfusable(i)
        else:
            r = c.fresh("r")
            out.append(E.assign(r, body))
            test = _not_bool(c, st, E.name(r))
        rest = _stages(c, loop, i + 1, E.name(names[0]), kind, params)
        out.append(py.If(test, rest, [loop.stop] if st.name == "take_while" else []))
        return out
    if st.name == "map" and ((i + 1 < len(loop.stages) and loop.stages[i + 1].lam is not None)
                             or (i + 1 == len(loop.stages) and loop.takes_expr)):
        # the next lambda (or the yield) takes the value at once: no temporary
        return out + _stages(c, loop, i + 1, body, body_kind, params)
    y = c.fresh("y")
    out.append(E.assign(y, body))
    rest = _stages(c, loop, i + 1, E.name(y), body_kind, params)
    if st.name == "map":
        return out + rest
    out.append(py.If(py.Compare(E.name(y), [py.IsNot()], [E.const(None)]), rest, []))  # each
    return out


def _all_tickless(stages: list[_Stage]) -> bool:
    return all(s.lam is None or _tickless(s.lam.body) for s in stages)


def _batched_loop(c: Emitter, target: str, inner: list[py.stmt], plain: py.stmt) -> py.stmt:
    """The loop of a fold, a test or a summed generator over a list or a Range (else ``plain``)
    in chunks of _CHUNK elements, each chunk that no step of which could reach the step limit
    (``$tick`` statements per element, at most) counting its steps in a local and adding them
    after (``$steps``, in a ``finally``: an element that fails has counted its own), any other
    chunk ticking as written. Its consumer (``sum``) makes no steps between elements, nor do
    the bodies (``_tickless``), so the counter is looked at by no one in between::

        i = 0
        while True:
            chunk = src[i:i + _CHUNK]; i += _CHUNK
            if not chunk: break
            if $batch(len(chunk) * ticks):
                k = 0
                try:
                    for x in chunk: <inner, each $tick() as k += 1>
                    else: continue
                finally: $steps(k)
            else:
                for x in chunk: <inner>
                else: continue
            break  # the inner loop stopped early (a take, any, all)
    """
    import ast
    import copy

    ticks = [n for s in inner for n in ast.walk(s)
             if isinstance(n, py.Call) and isinstance(n.func, py.Name) and n.func.id == "$tick"]
    if not ticks:
        return plain
    k, i, chunk = c.fresh("k"), c.fresh("i"), c.fresh("chunk")

    class Count(ast.NodeTransformer):
        def visit_Expr(self, node: py.Expr) -> Any:
            v = node.value
            if isinstance(v, py.Call) and isinstance(v.func, py.Name) and v.func.id == "$tick":
                return ast.copy_location(py.AugAssign(E.store(k), py.Add(), E.const(1)), node)
            return node

    counted = [Count().visit(s) for s in copy.deepcopy(inner)]
    typ = helper(c, "$f:type", type)
    end = py.BinOp(E.name(i), py.Add(), E.const(_CHUNK))
    batch = ast.copy_location(E.call("$batch", [py.BinOp(E.call(helper(c, "$f:len", len), [E.name(chunk)]), py.Mult(),
                                                        E.const(len(ticks)))]), ticks[0])
    body: list[py.stmt] = [
        E.assign(chunk, py.Subscript(E.name("$src"), py.Slice(E.name(i), end, None), py.Load())),
        py.AugAssign(E.store(i), py.Add(), E.const(_CHUNK)),
        py.If(py.UnaryOp(py.Not(), E.name(chunk)), [py.Break()], []),
        py.If(batch, [
            E.assign(k, E.const(0)),
            py.Try([py.For(E.store(target), E.name(chunk), counted, [py.Continue()], None)], [], [],
                   [py.Expr(E.call("$steps", [E.name(k)]))]),
        ], [py.For(E.store(target), E.name(chunk), inner, [py.Continue()], None)]),
        py.Break(),
    ]
    known = py.BoolOp(py.Or(), [py.Compare(E.call(typ, [E.name("$src")]), [py.Is()], [E.name(helper(c, f"$f:{t.__name__}", t))])
                                for t in (range, list)])
    return py.If(known, [E.assign(i, E.const(0)), py.While(E.const(True), body, [])], [plain])
