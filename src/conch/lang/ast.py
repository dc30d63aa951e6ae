"""The conch syntax tree. Every node carries the span of the source it came from.

``line``/``col`` are the 1-based start; ``end_line``/``end_col`` the position just after
it. Nodes whose failure is best reported at an operator (``a / b``, ``a.b``, ``a[i]``)
also carry ``op_line``/``op_col``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Node:
    line: int = field(default=0, kw_only=True)
    col: int = field(default=0, kw_only=True)
    end_line: int = field(default=0, kw_only=True)
    end_col: int = field(default=0, kw_only=True)


# -- expressions -------------------------------------------------------------------------


@dataclass(eq=False)
class Literal(Node):
    value: Any


@dataclass(eq=False)
class Interp(Node):
    parts: list[str | Node]


@dataclass(eq=False)
class Name(Node):
    name: str


@dataclass(eq=False)
class Raw(Node):
    """A Python name supplied by the host (the input of a pipeline stage)."""

    pyname: str


@dataclass(eq=False)
class ArrayLit(Node):
    items: list[Node]


@dataclass(eq=False)
class RecordLit(Node):
    entries: list[tuple[str, Node]]


@dataclass(eq=False)
class Unary(Node):
    op: str  # "-", "!"
    operand: Node


@dataclass(eq=False)
class Binary(Node):
    op: str
    left: Node
    right: Node
    op_line: int = 0
    op_col: int = 0


@dataclass(eq=False)
class RangeLit(Node):
    start: Node
    end: Node
    inclusive: bool
    op_line: int = 0
    op_col: int = 0


@dataclass(eq=False)
class Field(Node):
    obj: Node
    name: str
    optional: bool
    op_line: int = 0
    op_col: int = 0


@dataclass(eq=False)
class Index(Node):
    obj: Node
    index: Node | None
    # ``x[a..]`` and ``x[..b]``: an open slice (``index`` is then None)
    start: Node | None = None
    stop: Node | None = None
    inclusive: bool = False
    op_line: int = 0
    op_col: int = 0


@dataclass(eq=False)
class Call(Node):
    func: Node
    args: list[Node]
    kwargs: list[tuple[str, Node]]


@dataclass(eq=False)
class Pipe(Node):
    left: Node
    right: Node


@dataclass(eq=False)
class Param:
    name: str
    default: Node | None
    line: int
    col: int


@dataclass(eq=False)
class Lambda(Node):
    params: list[Param]
    body: Node | Block  # an expression, or a block
    name: str | None = None


@dataclass(eq=False)
class Block(Node):
    stmts: list[Node]


@dataclass(eq=False)
class If(Node):
    cond: Node
    then: Block
    orelse: Block | If | None


@dataclass(eq=False)
class MatchArm:
    pattern: Pattern
    guard: Node | None
    body: Node


@dataclass(eq=False)
class Match(Node):
    subject: Node
    arms: list[MatchArm]


@dataclass(eq=False)
class Try(Node):
    body: Block
    name: str | None
    handler: Block


# -- statements --------------------------------------------------------------------------


@dataclass(eq=False)
class Let(Node):
    target: Pattern
    mutable: bool
    value: Node


@dataclass(eq=False)
class Assign(Node):
    name: str
    op: str  # "=", "+=", ...
    value: Node


@dataclass(eq=False)
class FnDef(Node):
    name: str
    fn: Lambda


@dataclass(eq=False)
class For(Node):
    var: Pattern
    iterable: Node
    body: Block


@dataclass(eq=False)
class While(Node):
    cond: Node
    body: Block


@dataclass(eq=False)
class Break(Node):
    pass


@dataclass(eq=False)
class Continue(Node):
    pass


@dataclass(eq=False)
class Return(Node):
    value: Node | None


@dataclass(eq=False)
class Throw(Node):
    value: Node


# -- patterns ----------------------------------------------------------------------------


@dataclass(eq=False)
class Pattern(Node):
    pass


@dataclass(eq=False)
class PWild(Pattern):
    pass


@dataclass(eq=False)
class PBind(Pattern):
    name: str


@dataclass(eq=False)
class PLit(Pattern):
    value: Any


@dataclass(eq=False)
class PRange(Pattern):
    start: Any
    end: Any
    inclusive: bool


@dataclass(eq=False)
class PArray(Pattern):
    items: list[Pattern]
    rest: str | None  # the name after ``..`` ("_" or "" when unnamed)
    has_rest: bool = False


@dataclass(eq=False)
class PRecord(Pattern):
    fields: list[tuple[str, Pattern]]


@dataclass(eq=False)
class POr(Pattern):
    options: list[Pattern]


@dataclass(eq=False)
class Program(Node):
    stmts: list[Node]
