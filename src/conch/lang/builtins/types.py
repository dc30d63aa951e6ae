"""Conch type names for builtin annotations.

Builtin modules use ``from __future__ import annotations``, so an annotation such as
``items: Array`` reaches the registry as the string ``"Array"``, which is the conch type it
declares; these aliases only keep type checkers informed.
"""

from __future__ import annotations

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
