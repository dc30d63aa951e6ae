"""The public API of the language: compile once, run many times.

A :class:`Program` holds two code objects built from one syntax tree: a plain one (the
shell: no limits, no overhead) and, built on first need, a checked one whose function
entries and loop iterations count steps and watch the clock, recursion depth and
cancellation (the server).
"""

from __future__ import annotations

import itertools
import sys
import time

from conch.lang import ast as A
from conch.lang import context as ctxmod
from conch.lang import runtime
from conch.lang.compiler import MAIN, Compiled, Compiler
from conch.lang.context import Context
from conch.lang.emit import FILENAME
from conch.lang.errors import ConchError, did_you_mean, from_python
from conch.lang.parser import parse, parse_expression
from conch.lang.values import LazyList

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import TracebackType
    from typing import Any

    StatementHook = Callable[[int, int, str], None]

# Conch functions are Python functions: allow conch recursion well beyond 1000 levels.
if sys.getrecursionlimit() < 8000:
    sys.setrecursionlimit(8000)



def _noop(i: int) -> None:
    return None


# -- error translation -------------------------------------------------------------------

_PY_TYPES = {
    "NoneType": "Null",
    "bool": "Bool",
    "int": "Int",
    "float": "Float",
    "str": "String",
    "list": "Array",
    "tuple": "Array",
    "LazyList": "Array",
    "dict": "Record",
    "ErrorValue": "Error",
    "range": "Range",
    "function": "Function",
    "builtin_function_or_method": "Function",
    "generator": "Array",
}


def _conch_types(text: str) -> str:
    import re

    return re.sub(r"'(\w+)'", lambda m: _PY_TYPES.get(m.group(1), m.group(0)), text)


def _fix_message(exc: BaseException, err: ConchError) -> None:
    """Rewrite Python's wording of operator failures in conch terms."""
    import re  # only on a failure: the re module costs start-up time

    text = str(exc)
    if isinstance(exc, NameError):
        name = getattr(exc, "name", None) or (re.findall(r"'([^']+)'", text) or ["?"])[0]
        name = name.split("$")[0]
        err.kind = "NameError"
        if isinstance(exc, UnboundLocalError):
            err.message = f"'{name}' is used before it is defined"
        else:
            err.message = f"unknown name '{name}'"
        return
    if not isinstance(exc, TypeError):
        return
    m = re.match(r"unsupported operand type\(s\) for (\S+): '(\w+)' and '(\w+)'", text)
    if m:
        op = m.group(1).replace("** or pow()", "**")
        a, b = (_PY_TYPES.get(x, x) for x in m.group(2, 3))
        err.message = f"cannot apply '{op}' to {a} and {b}"
        return
    m = re.match(r"'(\S+)' not supported between instances of '(\w+)' and '(\w+)'", text)
    if m:
        a, b = (_PY_TYPES.get(x, x) for x in m.group(2, 3))
        err.message = f"cannot compare {a} with {b} using '{m.group(1)}'"
        return
    m = re.match(r"bad operand type for unary (\S+): '(\w+)'", text)
    if m:
        op = "!" if m.group(1) == "~" else m.group(1)
        err.message = f"cannot apply unary '{op}' to {_PY_TYPES.get(m.group(2), m.group(2))}"
        return
    m = re.match(r"'(\w+)' object is not callable", text)
    if m:
        err.message = f"{_PY_TYPES.get(m.group(1), m.group(1))} is not a function"
        return
    m = re.match(r"(\S+?)\(\) (.*)", text)
    if m:
        fname = m.group(1).split("$")[0]
        rest = m.group(2).replace("positional argument", "argument")
        err.message = f"{fname}() {_conch_types(rest)}"
        return
    err.message = _conch_types(text)


def _position(tb: TracebackType | None) -> tuple[int | None, int | None]:
    found: tuple[Any, int] | None = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == FILENAME:
            found = (code, tb.tb_lasti)
        tb = tb.tb_next
    if found is None:
        return None, None
    code, lasti = found
    for line, _end_line, col, _end_col in itertools.islice(code.co_positions(), lasti // 2, lasti // 2 + 1):
        if line is not None and col is not None:
            return line, col + 1
    return None, None


def translate(exc: BaseException) -> ConchError:
    """The conch error for an exception raised while running compiled code."""
    if isinstance(exc, ConchError):
        err = exc
    else:
        err = from_python(exc)
        _fix_message(exc, err)
        if isinstance(exc, RecursionError):
            err.hint = "conch functions may call themselves a few thousand levels deep"
    if err.line is None:
        line, col = _position(exc.__traceback__)
        err.at(line, col)
    return err


def _catch(exc: BaseException) -> Any:
    err = translate(exc)
    if err.kind in ("LimitError", "CancelledError"):
        raise err
    from conch.lang.values import ErrorValue

    return ErrorValue.from_error(err)


# -- limits ------------------------------------------------------------------------------


def has_limits(ctx: Context) -> bool:
    lim = ctx.limits
    return (lim.steps is not None or lim.wall_time_s is not None or lim.recursion is not None
            or lim.collection_size is not None)


def _checks(ctx: Context) -> dict[str, Any]:
    lim = ctx.limits
    max_steps = lim.steps if lim.steps is not None else -1
    max_depth = lim.recursion if lim.recursion is not None else -1
    deadline = ctx.deadline
    cancelled = ctx.cancelled
    monotonic = time.monotonic
    steps = 0
    depth = 0
    # The step that breaks the limit (never reached without one).
    over = max_steps + 1 if max_steps >= 0 else -1

    def tick() -> None:
        # Once per call and loop iteration (per element of a fused pipeline): the step limit
        # is exact; cancellation and the clock are looked at every 16th step, which bounds
        # how late they are noticed to microseconds and halves what a step costs.
        nonlocal steps
        steps += 1
        if steps == over:
            raise ConchError("LimitError", f"step limit of {max_steps} exceeded",
                             hint="function calls and loop iterations count as steps")
        if not steps & 15:
            if cancelled.is_set():
                raise ConchError("CancelledError", "the run was cancelled")
            if deadline is not None and monotonic() > deadline:
                raise ConchError("TimeoutError", f"the run took longer than {lim.wall_time_s} s")

    def batch(n: int) -> bool:
        # Whether ``n`` steps may be taken at once (a fused stage over a chunk of a list, its
        # bodies making no steps of their own): none of them reaches the step limit. Looks at
        # cancellation and the clock, once, when one of those steps would have.
        if steps + n >= over >= 0:
            return False
        if (steps & 15) + n > 15:
            if cancelled.is_set():
                raise ConchError("CancelledError", "the run was cancelled")
            if deadline is not None and monotonic() > deadline:
                raise ConchError("TimeoutError", f"the run took longer than {lim.wall_time_s} s")
        return True

    def add(n: int) -> None:
        # The steps a batch took (all of a chunk, or up to the element that failed).
        nonlocal steps
        steps += n

    def enter() -> None:
        nonlocal depth
        depth += 1
        if depth > max_depth >= 0:
            depth = 0
            raise ConchError("LimitError", f"recursion limit of {max_depth} exceeded")
        tick()

    def leave() -> None:
        nonlocal depth
        if depth > 0:
            depth -= 1

    checks: dict[str, Any] = {"$tick": tick, "$enter": enter, "$leave": leave, "$mul": runtime.mul_bounded,
                              "$batch": batch, "$steps": add}
    if lim.collection_size is not None:
        checks["$add"] = runtime.add_bounded
    return checks


def _guard_lazy(value: LazyList, ctx: Context) -> LazyList:
    """Re-enter the run's context and translate errors while a lazy result is consumed."""

    def gen() -> Iterator[Any]:
        it = iter(value)
        while True:
            with ctxmod.using(ctx):
                try:
                    item = next(it)
                except StopIteration:
                    return
                except ConchError:
                    raise
                except Exception as exc:
                    raise translate(exc) from None
            yield item

    return LazyList(gen())


# -- programs ----------------------------------------------------------------------------


class compiling:  # a class named as a function: ``with compiling():``
    """Report the host compiler's own limits (very deep nesting) as conch syntax errors."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, RecursionError):
            raise ConchError("SyntaxError", "the program is nested too deeply", line=1, column=1) from None
        if isinstance(exc, SyntaxError):
            raise ConchError("SyntaxError", exc.msg, line=exc.lineno, column=(exc.offset or 0) + 1 or None) from None


class Program:
    """A compiled conch program."""

    def __init__(self, source: str, tree: A.Program, variables: frozenset[str] = frozenset(),
                 fuse: bool = True) -> None:
        self.source = source
        self.tree = tree
        self._known = variables
        self._fuse = fuse
        with compiling():
            self._plain: Compiled = Compiler(known_globals=variables, fuse=fuse).compile_program(tree)
        self._checked: Compiled | None = None
        self._texts: list[str] | None = None

    @property
    def statement_count(self) -> int:
        return len(self.tree.stmts)

    def statement_texts(self) -> list[str]:
        if self._texts is None:
            lines = self.source.splitlines(keepends=True)
            offsets = [0]
            for ln in lines:
                offsets.append(offsets[-1] + len(ln))

            def off(line: int, col: int) -> int:
                return offsets[min(line - 1, len(lines))] + col - 1 if lines else 0

            self._texts = [
                self.source[off(s.line, s.col) : off(s.end_line, s.end_col)].strip() for s in self.tree.stmts
            ]
        return self._texts

    def _compiled(self, checked: bool) -> Compiled:
        if not checked:
            return self._plain
        if self._checked is None:
            with compiling():
                compiler = Compiler(checked=True, known_globals=self._known, fuse=self._fuse)
                self._checked = compiler.compile_program(self.tree)
        return self._checked

    def run(
        self,
        context: Context | None = None,
        variables: dict[str, Any] | None = None,
        on_statement: StatementHook | None = None,
    ) -> Any:
        ctx = context or ctxmod.current()
        compiled = self._compiled(has_limits(ctx))
        namespace: dict[str, Any] = dict(runtime.HELPERS)
        namespace.update(compiled.builtins)
        if variables:
            namespace.update(variables)
        try:
            return execute(compiled, namespace, ctx, on_statement, self.statement_texts if on_statement else None)
        finally:
            # ``$main`` and its namespace (its globals) refer to each other: a cycle, which
            # would keep the run's input and values alive until the garbage collector's next
            # pass, and make that pass walk them (milliseconds a pass on a server's 10k
            # inputs). Functions the value may hold keep the namespace; none needs ``$main``.
            namespace.pop(MAIN, None)


def execute(
    compiled: Compiled,
    namespace: dict[str, Any],
    ctx: Context,
    on_statement: StatementHook | None,
    texts: Callable[[], list[str]] | None,
    session: bool = False,
) -> Any:
    _check_names(compiled, namespace, session)
    namespace["$catch"] = _catch
    outer_deadline = ctx.deadline
    if ctx.limits.wall_time_s is not None:
        deadline = time.monotonic() + ctx.limits.wall_time_s
        # a run started by a builtin of a run in progress ends no later than that run
        ctx.deadline = deadline if outer_deadline is None else min(deadline, outer_deadline)
    try:
        if has_limits(ctx):
            namespace.update(_checks(ctx))
        if on_statement is not None and texts is not None:
            all_texts = texts()
            total = len(all_texts)
            hook = on_statement

            def onst(i: int) -> None:
                hook(i, total, all_texts[i])

            namespace["$onst"] = onst
        else:
            namespace["$onst"] = _noop
        with ctxmod.using(ctx):
            try:
                exec(compiled.code, namespace)
                value = namespace[MAIN]()
            except ConchError as err:
                raise translate(err) from None
            except Exception as exc:
                raise translate(exc) from None
            if type(value) is LazyList:
                value = _guard_lazy(value, ctx)
        return value
    finally:
        ctx.deadline = outer_deadline


def _check_names(compiled: Compiled, namespace: dict[str, Any], session: bool = False) -> None:
    for u in compiled.unresolved:
        # A session's function may name a function a later input defines: it is looked up
        # when called (an unknown name then is a NameError at that point).
        if u.name not in namespace and not (session and u.in_function):
            raise ConchError(
                "NameError",
                f"unknown name '{u.name}'",
                line=u.line,
                column=u.col,
                hint=did_you_mean(u.name, list(u.candidates) + [k for k in namespace if "$" not in k]),
            )


def compile_program(source: str, variables: frozenset[str] | set[str] | None = None, fuse: bool = True) -> Program:
    """Parse and compile ``source``; a SyntaxError is raised as a ConchError with its position.

    ``variables`` names values that will be supplied to :meth:`Program.run` (optional: any
    unknown name is looked up at run time). ``fuse=False`` compiles pipelines stage by stage
    as written (see :mod:`conch.lang.fusion`): the same results, for comparing.
    """
    with compiling():
        tree = parse(source)
    return Program(source, tree, frozenset(variables or ()), fuse=fuse)


def run(source: str, context: Context | None = None, variables: dict[str, Any] | None = None,
        fuse: bool = True) -> Any:
    return compile_program(source, frozenset(variables or ()), fuse).run(context=context, variables=variables)


# -- pipeline stages ---------------------------------------------------------------------

_STAGE_INPUT = "$input"


class Stage:
    """A compiled pipeline stage: ``stage(value)`` is ``value | <text>``."""

    def __init__(self, text: str) -> None:
        self.text = text
        with compiling():
            tree = A.Program([_feed(parse_expression(text))])
        tree.line, tree.col = 1, 1
        self.program = Program(text, tree, frozenset({_STAGE_INPUT}))

    def __call__(self, value: Any, context: Context | None = None,
                 variables: dict[str, Any] | None = None) -> Any:
        """``variables``: names the stage may use besides the builtins (a session's)."""
        if variables:
            return self.program.run(context=context, variables={**variables, _STAGE_INPUT: value})
        return self.program.run(context=context, variables={_STAGE_INPUT: value})


def _feed(node: A.Node) -> A.Node:
    """``input | node``, with the input entering the first stage of a pipeline chain."""
    if isinstance(node, A.Pipe):
        pipe = A.Pipe(_feed(node.left), node.right)
    else:
        pipe = A.Pipe(A.Raw(_STAGE_INPUT), node)
    pipe.line, pipe.col, pipe.end_line, pipe.end_col = node.line, node.col, node.end_line, node.end_col
    return pipe


def compile_stage(text: str) -> Stage:
    return Stage(text)

