"""Builtins compiled as the Python method they call (``upper``, ``split``, ``join``,
``len``...) behind a type test whose other branch is the checked call; and the two helpers
fusion.py shares with it (a builtin's own name where it is not shadowed, a value made
reachable from compiled code).
"""

from __future__ import annotations

import _ast as py

from conch.lang import ast as A
from conch.lang import emit as E

# Not typing's: a program that names a builtin compiled here must not import typing (and re,
# functools) at start-up (tests/cli/test_cli.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from conch.lang.emit import Emitter


def builtin_name(c: Emitter, name: str) -> str | None:
    """The builtin's own name when ``name`` is one (not shadowed by a binding)."""
    if c.scope.lookup(name) is not None:
        return None
    from conch.lang.builtins.registry import REGISTRY

    b = REGISTRY.get(name)
    if b is None or b.overloads:
        return None
    return b.name


def helper(c: Emitter, key: str, value: Any) -> str:
    """``value`` made reachable from compiled code under ``key`` (its name there)."""
    # keys start with $f: apart from the runtime's helpers ($range is not Python's range)
    c.builtins[key] = value
    return key


_METHODS = {"upper": "upper", "lower": "lower", "trim": "strip"}


def _is_str(e: py.expr) -> bool:
    if isinstance(e, py.Constant):
        return type(e.value) is str
    return isinstance(e, py.JoinedStr) or getattr(e, "conch_type", None) == "String"


def inline_builtin(c: Emitter, name: str, call: py.Call, at: A.Node) -> py.expr | None:
    """``call`` (of builtin ``name``, positional arguments) as a method call behind a type
    test, its other branch the checked call: None when no such form applies."""
    args = call.args
    canonical = builtin_name(c, name)

    def method(attr: str, *margs: py.expr) -> Any:
        return lambda s: py.Call(py.Attribute(s, attr, py.Load()), list(margs), [])

    if canonical in _METHODS and len(args) == 1:
        return _guarded(c, args[0], "String", method(_METHODS[canonical]), call, at)
    if canonical == "split" and (len(args) == 1 or _literal(args[1]) not in (None, "")):
        e = _guarded(c, args[0], "String", method("split", *args[1:]), call, at)
        # a list of Strings when it returns at all: the checked call fails on anything else
        return None if e is None else _typed(e, "StringArray")
    if (canonical == "join" and getattr(args[0], "conch_type", None) == "StringArray"
            and (len(args) == 1 or _literal(args[1]) is not None)):
        sep = args[1] if len(args) == 2 else E.const("")
        return _typed(c.at(method("join", args[0])(sep), at), "String")
    if canonical == "len" and len(args) == 1:
        return _guarded(c, args[0], "Sized", lambda s: E.call("$len", [s]), call, at)
    return None


def _literal(e: py.expr) -> str | None:
    return e.value if isinstance(e, py.Constant) and type(e.value) is str else None


def _guarded(c: Emitter, arg: py.expr, kind: str, fast: Any, call: py.Call, at: A.Node) -> py.expr | None:
    if kind == "String" and _is_str(arg):
        return _typed(c.at(fast(arg), at), "String")
    if not isinstance(arg, py.Name | py.Constant):
        # the test and the call would evaluate it twice; binding it (:=) is not allowed
        # everywhere a body may stand (a comprehension's iterable)
        return None
    typ = helper(c, "$f:type", type)
    if kind == "String":
        test: py.expr = py.Compare(E.call(typ, [arg]), [py.Is()], [E.name(helper(c, "$f:str", str))])
    else:
        kinds = [helper(c, "$f:list", list), helper(c, "$f:str", str), helper(c, "$f:dict", dict)]
        test = py.BoolOp(py.Or(), [py.Compare(E.call(typ, [arg]), [py.Is()], [E.name(k)]) for k in kinds])
    e = c.at(py.IfExp(test, c.at(fast(arg), at), call), at)
    return _typed(e, kind) if kind == "String" else e


def _typed(e: py.expr, kind: str) -> py.expr:
    """Mark compiled code with what its value is known to be (read by inline_builtin)."""
    setattr(e, "conch_type", kind)  # noqa: B010 - an attribute the ast classes do not declare
    return e
