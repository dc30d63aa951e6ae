"""What the compiler and its passes (:mod:`conch.lang.fusion`) build code with: the Python
AST node helpers, the scope model (bindings, functions, block scopes) and :class:`Emitter`,
the part of the compiler a pass may use.

A module of its own so that a pass needs only public names, and the compiler, which calls
its passes, is not imported back by them (no circle).
"""

from __future__ import annotations

# _ast holds the node classes that the ast module re-exports; ast itself (with enum and
# contextlib) would add milliseconds to every ``conch -c``.
import _ast as py

from conch.lang.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from typing import Any, Protocol

    from conch.lang import ast as A

    class Emitter(Protocol):
        """What a pass (fusion) uses of the compiler that calls it: its state while
        compiling and the methods that compile a conch node or a name into that state.
        :class:`conch.lang.compiler.Compiler` is one (a type only: typing is not imported
        at run time)."""

        checked: bool  # counting steps (a run with limits)
        fuse: bool
        fusing: bool  # compiling the parts of a chain being fused
        func: Func
        scope: Scope
        loop_depth: int
        out: list[py.stmt]
        pipe_input: list[py.expr | None]
        pipe_used: bool
        int_names: set[str]
        builtins: dict[str, Any]
        unresolved: list[Any]

        def at(self, pynode: Any, node: A.Node | A.Param, op: tuple[int, int, int] | None = None) -> Any: ...
        def fresh(self, base: str = "t") -> str: ...
        def declare(self, name: str, mutable: bool = False, is_fn: bool = False, num: bool = False) -> Binding: ...
        def load(self, name: str, node: A.Node) -> py.expr: ...
        def access(self, b: Binding, func: Func) -> None: ...
        def emit(self, stmt: py.stmt) -> None: ...
        def into(self, out: list[py.stmt]) -> AbstractContextManager[list[py.stmt]]: ...
        def new_scope(self) -> AbstractContextManager[Scope]: ...
        def expr(self, node: A.Node) -> py.expr: ...
        def never_bool(self, n: A.Node) -> bool: ...

_BOOL_NODES = (py.Compare, py.BoolOp)
_BOOL_HELPERS = frozenset(("$eq", "$ne", "$rematch", "$truth", "$in", "$notin"))


# Plain classes and records rather than dataclasses: the dataclasses module (and the inspect
# and re modules it imports) would add milliseconds to every ``conch -c``.


@record(eq=False)
class Binding:
    pyname: str
    mutable: bool
    is_fn: bool
    func: Func
    is_global: bool = False
    # immutable and bound to a value that cannot be a Bool (a number literal, arithmetic,
    # a Range loop variable): arithmetic on it needs no Bool check
    num: bool = False

    def __repr__(self) -> str:
        return f"Binding({self.pyname!r}, mutable={self.mutable}, is_fn={self.is_fn})"


class Func:
    __slots__ = ("captures", "globals", "in_loop", "nonlocals", "parent")

    def __init__(self, parent: Func | None) -> None:
        self.parent = parent
        self.captures: dict[str, Binding] = {}
        self.nonlocals: set[str] = set()
        self.globals: set[str] = set()
        self.in_loop = 0


class Scope:
    __slots__ = ("declared", "func", "names", "parent", "top")

    def __init__(self, func: Func, parent: Scope | None, top: bool = False) -> None:
        self.func = func
        self.parent = parent
        self.names: dict[str, Binding] = {}
        self.top = top
        # every binding declared in the scope, in order (shadowed ones included)
        self.declared: list[Binding] = []

    def lookup(self, name: str) -> Binding | None:
        s: Scope | None = self
        while s is not None:
            b = s.names.get(name)
            if b is not None:
                return b
            s = s.parent
        return None

    def visible(self) -> set[str]:
        out: set[str] = set()
        s: Scope | None = self
        while s is not None:
            out.update(s.names)
            s = s.parent
        return out


def name(pyname: str) -> py.Name:
    return py.Name(pyname, py.Load())


def store(pyname: str) -> py.Name:
    return py.Name(pyname, py.Store())


def const(v: Any) -> py.Constant:
    return py.Constant(v)


def call(fn: py.expr | str, args: list[py.expr], keywords: list[py.keyword] | None = None) -> py.Call:
    func = name(fn) if isinstance(fn, str) else fn
    return py.Call(func, args, keywords or [])


def assign(pyname: str, value: py.expr) -> py.Assign:
    return py.Assign([store(pyname)], value)


def and_(tests: list[py.expr]) -> py.expr:
    return tests[0] if len(tests) == 1 else py.BoolOp(py.And(), tests)


def is_bool(e: py.expr) -> bool:
    """Whether compiled code ``e`` evaluates to a Bool (or fails) by construction."""
    if isinstance(e, _BOOL_NODES) or (isinstance(e, py.UnaryOp) and isinstance(e.op, py.Not)):
        return True
    if isinstance(e, py.Constant) and isinstance(e.value, bool):
        return True
    if isinstance(e, py.IfExp) and isinstance(e.body, py.Compare):
        # an ordering guarded against Bools: a Bool or an error (not an if-expression, whose
        # other branch may be anything)
        fail = e.orelse
        return isinstance(fail, py.Call) and isinstance(fail.func, py.Name) and fail.func.id == "$boolop"
    return isinstance(e, py.Call) and isinstance(e.func, py.Name) and e.func.id in _BOOL_HELPERS
