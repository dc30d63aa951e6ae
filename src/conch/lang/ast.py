"""The conch syntax tree. Every node carries the span of the source it came from.

``line``/``col`` are the 1-based start; ``end_line``/``end_col`` the position just after
it. Nodes whose failure is best reported at an operator (``a / b``, ``a.b``, ``a[i]``)
also carry ``op_line``/``op_col``.
"""

from __future__ import annotations

from conch.lang.record import fields, repr_of

# typing, dataclasses and inspect cost milliseconds at start-up: only type checkers see them
TYPE_CHECKING = False
if TYPE_CHECKING:
    from dataclasses import KW_ONLY
    from typing import Any, TypeVar, dataclass_transform

    _T = TypeVar("_T", bound=type)
else:
    from conch.lang.record import dataclass_transform


_SPAN = ("line", "col", "end_line", "end_col")  # every node's, keyword-only


@dataclass_transform()
def node(cls: _T) -> _T:
    """Give a node class an ``__init__`` taking its annotated fields in order, the span
    keyword-only: a :func:`~conch.lang.record.record` in all but the written-out ``__init__``,
    which for some forty node classes would cost milliseconds of compiling at import."""
    names, defaults = fields(cls, skip=_SPAN)

    def __init__(self: Any, *args: Any, line: int = 0, col: int = 0, end_line: int = 0, end_col: int = 0, **kwargs: Any) -> None:
        if len(args) > len(names):
            raise TypeError(f"{cls.__name__} takes {len(names)} fields")
        for name, value in zip(names, args, strict=False):
            setattr(self, name, value)
        for name in names[len(args) :]:
            if name in kwargs:
                setattr(self, name, kwargs.pop(name))
            elif name in defaults:
                setattr(self, name, defaults[name])
            else:
                raise TypeError(f"{cls.__name__} needs {name!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__} has no field {next(iter(kwargs))!r}")
        self.line, self.col, self.end_line, self.end_col = line, col, end_line, end_col

    cls.__init__ = __init__  # type: ignore[misc]
    cls.__repr__ = repr_of(cls, names)  # type: ignore[assignment]
    return cls


@node
class Node:
    """Where in the source a piece of syntax stands (see the module's text)."""

    _: KW_ONLY
    line: int = 0
    col: int = 0
    end_line: int = 0
    end_col: int = 0


@node
class OpNode(Node):
    """A node whose failure is reported at its operator (``a / b``, ``a.b``, ``a[i]``)."""

    _: KW_ONLY
    op_line: int = 0
    op_col: int = 0


# -- expressions -------------------------------------------------------------------------


@node
class Literal(Node):
    value: Any


@node
class Interp(Node):
    parts: list[str | Node]


@node
class Name(Node):
    name: str


@node
class Raw(Node):
    """A Python name supplied by the host (the input of a pipeline stage)."""

    pyname: str


@node
class ArrayLit(Node):
    items: list[Node]


@node
class RecordLit(Node):
    entries: list[tuple[str, Node]]


@node
class Unary(Node):
    op: str  # "-", "!"
    operand: Node


@node
class Binary(OpNode):
    op: str
    left: Node
    right: Node


@node
class RangeLit(OpNode):
    start: Node
    end: Node
    inclusive: bool


@node
class Field(OpNode):
    obj: Node
    name: str
    optional: bool


@node
class Index(OpNode):
    obj: Node
    index: Node | None
    # ``x[a..]`` and ``x[..b]``: an open slice (``index`` is then None)
    start: Node | None = None
    stop: Node | None = None
    inclusive: bool = False


@node
class Call(Node):
    func: Node
    args: list[Node]
    kwargs: list[tuple[str, Node]]


@node
class Pipe(Node):
    left: Node
    right: Node


class Param:
    __slots__ = ("col", "default", "line", "name")

    def __init__(self, name: str, default: Node | None, line: int, col: int) -> None:
        self.name = name
        self.default = default
        self.line = line
        self.col = col


@node
class Lambda(Node):
    params: list[Param]
    body: Node | Block  # an expression, or a block
    name: str | None = None


@node
class Block(Node):
    stmts: list[Node]


@node
class If(Node):
    cond: Node
    then: Block
    orelse: Block | If | None


class MatchArm:
    __slots__ = ("body", "guard", "pattern")

    def __init__(self, pattern: Pattern, guard: Node | None, body: Node) -> None:
        self.pattern = pattern
        self.guard = guard
        self.body = body


@node
class Match(Node):
    subject: Node
    arms: list[MatchArm]


@node
class Try(Node):
    body: Block
    name: str | None
    handler: Block


# -- statements --------------------------------------------------------------------------


@node
class Let(Node):
    target: Pattern
    mutable: bool
    value: Node


@node
class Assign(Node):
    name: str
    op: str  # "=", "+=", ...
    value: Node


@node
class FnDef(Node):
    name: str
    fn: Lambda


@node
class For(Node):
    var: Pattern
    iterable: Node
    body: Block


@node
class While(Node):
    cond: Node
    body: Block


@node
class Break(Node):
    pass


@node
class Continue(Node):
    pass


@node
class Return(Node):
    value: Node | None


@node
class Throw(Node):
    value: Node


# -- patterns ----------------------------------------------------------------------------


@node
class Pattern(Node):
    pass


@node
class PWild(Pattern):
    pass


@node
class PBind(Pattern):
    name: str


@node
class PLit(Pattern):
    value: Any


@node
class PRange(Pattern):
    start: Any
    end: Any
    inclusive: bool


@node
class PArray(Pattern):
    items: list[Pattern]
    rest: str | None  # the name after ``..`` ("_" or "" when unnamed)
    has_rest: bool = False


@node
class PRecord(Pattern):
    fields: list[tuple[str, Pattern]]


@node
class POr(Pattern):
    options: list[Pattern]


@node
class Program(Node):
    stmts: list[Node]
