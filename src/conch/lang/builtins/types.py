"""Conch type names for builtin annotations.

Builtin modules use ``from __future__ import annotations``, so an annotation such as
``items: Array`` reaches the registry as the string ``"Array"``, which is the conch type it
declares; these aliases only keep type checkers informed.
"""

from __future__ import annotations

# At run time the names only have to exist for the builtin modules' imports: typing would
# cost milliseconds on every start of a program that names a builtin.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Any_ = Any
    Array = Any  # list, range, LazyList
    Table = Any
    Record = dict[str, Any]
    Function = Callable[..., Any]
    String = str
    Int = int
    Float = float
    Number = int | float
    Bool = bool
    Range = range
    Null = None
else:
    Any_ = Array = Table = Record = Function = String = Int = Float = Number = Bool = Range = Null = object
