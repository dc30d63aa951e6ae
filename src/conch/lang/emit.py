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
import _warnings
import sys

from conch.lang.errors import ConchError
from conch.lang.record import record

FILENAME = "<conch>"

TYPE_CHECKING = False
if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from typing import Any, Protocol

    from conch.lang import ast as A

    class Emitter(Protocol):
        """What a pass (fusion), or a part of the compiler in a module of its own
        (patterns), uses of the compiler that calls it: its state while compiling and the
        methods that compile a conch node or a name into that state.
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
        in_guard: bool  # compiling a match arm's guard
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
        def cond(self, node: A.Node) -> py.expr: ...
        def spill(self, e: py.expr) -> py.expr: ...
        def pattern(self, p: A.Pattern, subject: py.expr) -> py.expr: ...
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


class Unresolved:
    __slots__ = ("candidates", "col", "in_function", "line", "name")

    def __init__(self, name: str, line: int, col: int, candidates: list[str], in_function: bool = False) -> None:
        self.name = name
        self.line = line
        self.col = col
        self.candidates = candidates
        self.in_function = in_function


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


def is_trivial(e: py.expr) -> bool:
    """Whether ``e`` may be evaluated again at no cost or effect (a constant, a name)."""
    return isinstance(e, py.Constant | py.Name)


def fix_missing_locations(node: py.AST, line: int = 1, col: int = 0, end_line: int = 1, end_col: int = 0) -> None:
    """``ast.fix_missing_locations`` without importing ``ast``."""
    if "lineno" in node._attributes:
        if getattr(node, "lineno", None) is None:
            node.lineno, node.col_offset = line, col  # type: ignore[attr-defined]
        else:
            line, col = node.lineno, node.col_offset  # type: ignore[attr-defined]
        if getattr(node, "end_lineno", None) is None:
            node.end_lineno, node.end_col_offset = end_line, end_col  # type: ignore[attr-defined]
        else:
            end_line, end_col = node.end_lineno, node.end_col_offset  # type: ignore[attr-defined]
    for name in node._fields:
        child = getattr(node, name, None)
        if isinstance(child, py.AST):
            fix_missing_locations(child, line, col, end_line, end_col)
        elif isinstance(child, list):
            for item in child:
                if isinstance(item, py.AST):
                    fix_missing_locations(item, line, col, end_line, end_col)


_QUIET = ("ignore", None, SyntaxWarning, None, 0)
# CPython's hook for "the filter list changed" (absent elsewhere: then the warnings module).
_filters_mutated = getattr(_warnings, "_filters_mutated", None)


def compile_quietly(module: py.Module, optimize: int = -1) -> Any:
    """``compile`` with Python's SyntaxWarnings ignored: it warns about calls of constants
    (``null()``), which conch reports at run time. The ignore rule goes straight into the
    warning filters the interpreter consults (the warnings module's, once it is imported)
    rather than through ``warnings.catch_warnings``: importing the warnings module costs a
    third of a millisecond of every ``conch -c``."""
    if _filters_mutated is None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            return compile(module, FILENAME, "exec", optimize=optimize)
    filters = getattr(sys.modules.get("warnings"), "filters", None)
    if filters is None:
        filters = _warnings.filters
    filters.insert(0, _QUIET)
    _filters_mutated()
    try:
        return compile(module, FILENAME, "exec", optimize=optimize)
    finally:
        if _QUIET in filters:
            filters.remove(_QUIET)
        _filters_mutated()


def compile_error(kind: str, message: str, node: A.Node | A.Param, hint: str | None = None) -> ConchError:
    """An error in the program, found while compiling it: at ``node``'s position."""
    return ConchError(kind, message, line=node.line or None, column=node.col or None, hint=hint)


# Context managers as classes: contextlib is not imported at start-up.
class _Into:
    __slots__ = ("compiler", "out", "saved")

    def __init__(self, compiler: CompileState, out: list[py.stmt]) -> None:
        self.compiler = compiler
        self.out = out

    def __enter__(self) -> list[py.stmt]:
        self.saved = self.compiler.out
        self.compiler.out = self.out
        return self.out

    def __exit__(self, *exc: object) -> None:
        self.compiler.out = self.saved


class _NewScope:
    __slots__ = ("compiler", "saved")

    def __init__(self, compiler: CompileState) -> None:
        self.compiler = compiler

    def __enter__(self) -> Scope:
        c = self.compiler
        self.saved = c.scope
        c.scope = Scope(c.func, self.saved)
        return c.scope

    def __exit__(self, *exc: object) -> None:
        self.compiler.scope = self.saved


class CompileState:
    def __init__(
        self,
        *,
        checked: bool = False,
        session_globals: dict[str, Binding] | None = None,
        known_globals: frozenset[str] = frozenset(),
        fuse: bool = True,
        source: str | None = None,
    ) -> None:
        # REGISTRY imports the builtin modules on its first read: a program that names no
        # builtin starts without them.
        self.checked = checked
        self.session = session_globals is not None
        self.prev_globals = session_globals or {}
        self.known_globals = known_globals
        self.used: set[str] = {b.pyname for b in self.prev_globals.values()}
        self.counter = 0
        self.builtins: dict[str, Any] = {}
        self.unresolved: list[Unresolved] = []
        self.out: list[py.stmt] = []
        self.pipe_input: list[py.expr | None] = [None]
        self.main_func = Func(None)
        self.func = self.main_func
        self.scope = Scope(self.main_func, None, top=True)
        self.loop_depth = 0
        self.in_guard = False
        self.pipe_used = False
        self.last_captures: list[Binding] = []
        # pipelines of collection builtins as one loop (fusion.py); off to compare with it
        self.fuse = fuse
        self.fusing = False  # compiling the parts of a chain being fused
        self.int_names: set[str] = set()  # Python names of bindings known to hold Ints (fusion.py)
        # A session's program text: each function then carries its source as its docstring (a
        # constant, nothing done per call) to be saved as data (conch.lang.snapshot).
        self.source = source
        self._line_starts: list[int] | None = None
        if self.session:
            self.rekinded: list[str] = []  # session bindings declared again as another kind
            for name, b in self.prev_globals.items():
                b.func = self.main_func
                self.scope.names[name] = b

    # -- positions -----------------------------------------------------------------------

    @staticmethod
    def at(pynode: Any, node: A.Node | A.Param, op: tuple[int, int, int] | None = None) -> Any:
        """Give ``pynode`` the conch position of ``node`` (or of an operator token)."""
        if op is not None:
            line, col, length = op
            pynode.lineno = pynode.end_lineno = line
            pynode.col_offset = col - 1
            pynode.end_col_offset = col - 1 + length
            return pynode
        if not node.line:
            return pynode
        pynode.lineno = node.line
        pynode.col_offset = node.col - 1
        end_line = getattr(node, "end_line", 0) or node.line
        end_col = getattr(node, "end_col", 0) or node.col
        if (end_line, end_col) < (node.line, node.col):
            end_line, end_col = node.line, node.col
        pynode.end_lineno = end_line
        pynode.end_col_offset = end_col - 1
        return pynode

    def text_of(self, node: A.Node) -> str:
        src = self.source or ""
        starts = self._line_starts
        if starts is None:
            starts = [0]
            for line in src.splitlines(keepends=True):
                starts.append(starts[-1] + len(line))
            self._line_starts = starts

        def offset(line: int, col: int) -> int:
            return starts[min(line - 1, len(starts) - 1)] + col - 1

        return src[offset(node.line, node.col) : offset(node.end_line, node.end_col)]

    # -- names ---------------------------------------------------------------------------

    def fresh(self, base: str = "t") -> str:
        self.counter += 1
        return f"${base}{self.counter}"

    def new_pyname(self, name: str) -> str:
        if name not in self.used:
            self.used.add(name)
            return name
        i = 2
        while f"{name}${i}" in self.used:
            i += 1
        pyname = f"{name}${i}"
        self.used.add(pyname)
        return pyname

    def declare(self, name: str, mutable: bool = False, is_fn: bool = False, num: bool = False) -> Binding:
        scope = self.scope
        if scope.top and self.session:
            prev = scope.names.get(name)
            if prev is not None and prev.is_global:
                if prev.mutable != mutable or prev.is_fn != is_fn:
                    self.rekinded.append(name)  # the same value may now be a let mut, or not
                prev.mutable = mutable
                prev.is_fn = is_fn
                prev.num = num and not mutable
                self.main_func.globals.add(prev.pyname)
                scope.declared.append(prev)
                return prev
            b = Binding(self.new_pyname(name), mutable, is_fn, self.func, is_global=True, num=num and not mutable)
            self.main_func.globals.add(b.pyname)
        else:
            b = Binding(self.new_pyname(name), mutable, is_fn, self.func, num=num and not mutable)
        scope.names[name] = b
        scope.declared.append(b)
        return b

    def access(self, b: Binding, func: Func) -> None:
        """Make binding ``b`` readable from ``func`` (captured by value if immutable)."""
        if b.func is func or b.mutable or b.is_fn:
            return
        if b.is_global and func is self.main_func:
            return
        if b.pyname in func.captures:
            return
        func.captures[b.pyname] = b
        if func.parent is not None:
            self.access(b, func.parent)

    # -- emission helpers ----------------------------------------------------------------

    def emit(self, stmt: py.stmt) -> None:
        self.out.append(stmt)

    def into(self, out: list[py.stmt]) -> _Into:
        """``with self.into(buf):`` emits into ``buf``."""
        return _Into(self, out)

    def new_scope(self) -> _NewScope:
        """``with self.new_scope():`` compiles in a nested block scope."""
        return _NewScope(self)
