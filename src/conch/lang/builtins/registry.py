"""The builtin registry: one declaration per builtin, checked calls, documentation that runs.

A builtin is a Python function decorated with :func:`builtin`. Its parameters and return
type are read from the annotations, which name conch types (see :mod:`conch.lang.builtins.types`);
the decorator generates a thin wrapper with the same signature that checks every argument's
type and the effect policy, so a wrong call is a ``TypeError`` naming the parameter.
"""

from __future__ import annotations

import inspect
import keyword
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from conch.lang import values
from conch.lang.context import EFFECTS, current
from conch.lang.errors import ConchError

CATEGORIES = ("filesystem", "collections", "strings", "math", "data", "system", "ai", "http")

_MISSING: Any = object()


@dataclass(frozen=True)
class Example:
    """A program and what it must produce. ``result`` is compared as JSON; when the result
    cannot be known in advance (``uuid``, ``now``) give ``type`` instead."""

    code: str
    result: Any = _MISSING
    type: str | None = None

    @property
    def has_result(self) -> bool:
        return self.result is not _MISSING

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code}
        if self.has_result:
            out["result"] = values.to_json_value(self.result)
        if self.type is not None:
            out["type"] = self.type
        return out


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    required: bool
    default: Any = None
    variadic: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "required": self.required,
            "default": values.to_json_value(self.default) if not self.required else None,
            "variadic": self.variadic,
        }


@dataclass
class Builtin:
    name: str
    category: str
    description: str
    params: list[Param]
    returns: str
    effect: str
    examples: list[Example]
    aliases: tuple[str, ...]
    impl: Callable[..., Any]
    # Builtins of different categories sharing a name (``append``, ``find``): the entry in
    # REGISTRY dispatches on the type of the first argument to one of these.
    overloads: list[Builtin] = field(default_factory=list, repr=False)
    _fn: Callable[..., Any] | None = field(default=None, repr=False)
    _sig: inspect.Signature | None = field(default=None, repr=False)

    @property
    def fn(self) -> Callable[..., Any]:
        """The checked wrapper, generated on first use: compiling ~150 wrappers up front
        would cost every ``conch -c`` start-up tens of milliseconds."""
        wrapper = self._fn
        if wrapper is None:
            wrapper = self._fn = _make_wrapper(self, self._sig or inspect.signature(self.impl))
        return wrapper

    @fn.setter
    def fn(self, value: Callable[..., Any]) -> None:
        self._fn = value

    @property
    def signature(self) -> str:
        parts = []
        for p in self.params:
            text = f"{'...' if p.variadic else ''}{p.name}: {p.type}"
            if not p.required and not p.variadic:
                # to_json-style, so that a String default shows quoted: sep: String = ","
                text += f" = {values.render([p.default])[1:-1]}"
            parts.append(text)
        return f"{self.name}({', '.join(parts)}) -> {self.returns}"

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "category": self.category}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "category": self.category,
            "signature": self.signature,
            "examples": [e.code for e in self.examples],
            "example_results": [e.to_dict() for e in self.examples],
            "parameters": [p.to_dict() for p in self.params],
            "returns": self.returns,
            "effect": self.effect,
            "aliases": list(self.aliases),
            **({"overloads": [o.to_dict() for o in self.overloads]} if self.overloads else {}),
        }


class _Registry(dict[str, "Builtin"]):
    """A dict that imports the category modules on its first read, so that a program naming
    no builtin (``conch -c '1 + 1'``) does not pay for importing ~150 of them."""

    __slots__ = ()

    def get(self, key: str, default: Any = None) -> Any:
        if not _loaded:
            load_all()
        return dict.get(self, key, default)

    def __getitem__(self, key: str) -> Builtin:
        if not _loaded:
            load_all()
        return dict.__getitem__(self, key)

    def __contains__(self, key: object) -> bool:
        if not _loaded:
            load_all()
        return dict.__contains__(self, key)

    def __iter__(self) -> Iterator[str]:
        if not _loaded:
            load_all()
        return dict.__iter__(self)

    def __len__(self) -> int:
        if not _loaded:
            load_all()
        return dict.__len__(self)

    def keys(self) -> Any:
        if not _loaded:
            load_all()
        return dict.keys(self)

    def values(self) -> Any:
        if not _loaded:
            load_all()
        return dict.values(self)

    def items(self) -> Any:
        if not _loaded:
            load_all()
        return dict.items(self)

    def copy(self) -> dict[str, Builtin]:
        if not _loaded:
            load_all()
        return dict(dict.items(self))


REGISTRY: dict[str, Builtin] = _Registry()
"""Every builtin by name, aliases included (an alias maps to the same Builtin). The category
modules are imported on first read (or by :func:`load_all`)."""


def all_builtins() -> list[Builtin]:
    """Each builtin once, sorted by category then name."""
    load_all()
    unique = {id(b): b for b in REGISTRY.values()}
    return sorted(unique.values(), key=lambda b: (b.category, b.name))


def lookup(name: str) -> Builtin | None:
    load_all()
    return REGISTRY.get(name)


_loaded = False
_loading = False
_load_lock = threading.RLock()


def load_all() -> None:
    """Import every category module so that their builtins register."""
    global _loaded, _loading
    if _loaded:
        return
    # Other threads wait here until everything is imported rather than see a half-filled
    # registry; the importing thread itself may read the registry meanwhile (re-entry).
    with _load_lock:
        if _loaded or _loading:
            return
        _loading = True
        try:
            import importlib

            for module in CATEGORIES:
                try:
                    importlib.import_module(f"conch.lang.builtins.{module}")
                except ModuleNotFoundError as exc:
                    if exc.name != f"conch.lang.builtins.{module}":
                        raise
            _loaded = True
        finally:
            _loading = False


# -- type checks -------------------------------------------------------------------------

_CHECKS: dict[str, Callable[[Any], bool]] = {
    "Any": lambda v: True,
    "Null": lambda v: v is None,
    "None": lambda v: v is None,
    "Bool": lambda v: type(v) is bool,
    "Int": lambda v: type(v) is int,
    "Float": lambda v: type(v) is float,
    "Number": lambda v: type(v) is int or type(v) is float,
    "String": lambda v: type(v) is str,
    "Array": values.is_array,
    "Table": values.is_array,
    "Record": lambda v: isinstance(v, dict),
    "Range": lambda v: type(v) is range,
    "Function": callable,
    "Error": lambda v: type(v) is values.ErrorValue,
}


def _checker(type_name: str) -> Callable[[Any], bool] | None:
    """A predicate for a declared type (``String | Array``, ``Int?``), or None for Any."""
    names = [t.strip() for t in type_name.replace("?", " | Null").split("|")]
    if "Any" in names:
        return None
    preds = [_CHECKS[n] for n in names]
    if len(preds) == 1:
        return preds[0]
    return lambda v: any(p(v) for p in preds)


# The same checks as Python expressions, inlined in generated wrappers: a builtin called once
# per element of a large pipeline (upper, split, join) should not pay a call per parameter.
_INLINE: dict[str, str] = {
    "Null": "{v} is None",
    "None": "{v} is None",
    "Bool": "_type({v}) is _bool",
    "Int": "_type({v}) is _int",
    "Float": "_type({v}) is _float",
    "Number": "_type({v}) is _int or _type({v}) is _float",
    "String": "_type({v}) is _str",
    "Array": "_isinstance({v}, _array_types)",
    "Table": "_isinstance({v}, _array_types)",
    "Record": "_isinstance({v}, _dict)",
    "Range": "_type({v}) is _range",
    "Function": "_callable({v})",
    "Error": "_type({v}) is _error_value",
}
# Python's own names under private aliases: the wrapper of the builtin ``int`` is itself
# called ``int`` in the generated namespace.
_INLINE_NAMES: dict[str, Any] = {
    "_type": type,
    "_bool": bool,
    "_int": int,
    "_float": float,
    "_str": str,
    "_dict": dict,
    "_range": range,
    "_isinstance": isinstance,
    "_callable": callable,
}


def _inline_check(type_name: str, var: str) -> str | None:
    """A Python expression true when ``var`` has the declared type, or None for Any."""
    names = [t.strip() for t in type_name.replace("?", " | Null").split("|")]
    if "Any" in names:
        return None
    return " or ".join(f"({_INLINE[n].format(v=var)})" for n in names)


def _type_error(builtin: str, param: str, expected: str, got: Any) -> ConchError:
    return ConchError(
        "TypeError",
        f"{builtin}: parameter '{param}' expects {expected}, got {values.type_of(got)}",
    )


def _make_wrapper(b: Builtin, sig: inspect.Signature) -> Callable[..., Any]:
    """Generate a wrapper with the implementation's exact signature that checks types."""
    checks: dict[str, Any] = {}
    lines: list[str] = []
    params_src: list[str] = []
    call_args: list[str] = []
    seen_kwonly = False
    for p in sig.parameters.values():
        pname = p.name
        if p.kind is p.VAR_POSITIONAL:
            params_src.append(f"*{pname}")
            call_args.append(f"*{pname}")
            seen_kwonly = True
        elif p.kind is p.VAR_KEYWORD:
            params_src.append(f"**{pname}")
            call_args.append(f"**{pname}")
        else:
            if p.kind is p.KEYWORD_ONLY and not seen_kwonly:
                params_src.append("*")
                seen_kwonly = True
            if p.default is inspect.Parameter.empty:
                params_src.append(pname)
            else:
                checks[f"_d_{pname}"] = p.default
                params_src.append(f"{pname}=_d_{pname}")
            call_args.append(f"{pname}={pname}" if p.kind is p.KEYWORD_ONLY else pname)
    for param in b.params:
        if param.variadic:
            test = _inline_check(param.type, "_v")
            if test is None:
                continue
            lines.append(f"    for _v in {param.name}:")
            lines.append(f"        if not ({test}):")
            lines.append(f"            raise _terr({b.name!r}, {param.name!r}, {param.type!r}, _v)")
            continue
        test = _inline_check(param.type, param.name)
        if test is None:
            continue
        cond = f"not ({test})"
        if not param.required:
            cond = f"{param.name} is not _d_{param.name} and {cond}"
        lines.append(f"    if {cond}:")
        lines.append(f"        raise _terr({b.name!r}, {param.name!r}, {param.type!r}, {param.name})")
    if b.effect not in ("pure",):
        lines.insert(0, f"    _current().check_effect({b.effect!r}, {b.name!r})")
    fname = b.name if b.name.isidentifier() and not keyword.iskeyword(b.name) else "builtin"
    src = f"def {fname}({', '.join(params_src)}):\n"
    src += "\n".join(lines) + ("\n" if lines else "")
    src += f"    return _impl({', '.join(call_args)})\n"
    namespace: dict[str, Any] = {
        "_impl": b.impl,
        "_terr": _type_error,
        "_current": current,
        "_array_types": values.ARRAY_TYPES,
        "_error_value": values.ErrorValue,
        **_INLINE_NAMES,
        **checks,
    }
    exec(compile(src, f"<builtin {b.name}>", "exec"), namespace)
    wrapper: Callable[..., Any] = namespace[fname]
    wrapper.__doc__ = b.description
    wrapper.conch_name = b.name  # type: ignore[attr-defined]
    wrapper.conch_builtin = b  # type: ignore[attr-defined]
    return wrapper


def builtin(
    name: str,
    *,
    category: str,
    description: str,
    examples: Sequence[Example | tuple[str, Any]],
    effect: str = "pure",
    aliases: Sequence[str] = (),
    params: dict[str, str] | None = None,
    returns: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a builtin.

    Parameter types come from the annotations (conch type names such as ``Array``,
    ``String``, ``Int | Float``); ``params`` overrides them by name. Every builtin needs at
    least one example; the test suite runs them all.
    """

    def decorate(impl: Callable[..., Any]) -> Callable[..., Any]:
        if category not in CATEGORIES:
            raise AssertionError(f"{name}: unknown category {category!r}")
        if effect not in EFFECTS:
            raise AssertionError(f"{name}: unknown effect {effect!r}")
        if not examples:
            raise AssertionError(f"{name}: at least one example is required")
        sig = inspect.signature(impl)
        declared = params or {}
        plist: list[Param] = []
        for p in sig.parameters.values():
            if p.kind is p.VAR_KEYWORD:
                continue
            ann = declared.get(p.name, p.annotation)
            type_name = ann if isinstance(ann, str) and ann else "Any"
            if p.kind is p.VAR_POSITIONAL:
                plist.append(Param(p.name, type_name, False, None, variadic=True))
            elif p.default is inspect.Parameter.empty:
                plist.append(Param(p.name, type_name, True))
            else:
                plist.append(Param(p.name, type_name, False, p.default))
        ret = returns or (sig.return_annotation if isinstance(sig.return_annotation, str) else "Any")
        exs = [e if isinstance(e, Example) else Example(e[0], e[1]) for e in examples]
        b = Builtin(
            name=name,
            category=category,
            description=description,
            params=plist,
            returns=ret,
            effect=effect,
            examples=exs,
            aliases=tuple(aliases),
            impl=impl,
        )
        b._sig = sig
        for key in (name, *aliases):
            existing = dict.get(REGISTRY, key)
            REGISTRY[key] = b if existing is None else _overload(key, existing, b)
        return impl

    return decorate


def _overload(key: str, existing: Builtin, new: Builtin) -> Builtin:
    """One entry for builtins of different categories that share a name (SPEC lists
    ``append`` and ``find`` under both filesystem and collections), chosen per call by the
    type of the first argument."""
    members = [*(existing.overloads or [existing]), new]
    firsts: list[tuple[Callable[[Any], bool], Builtin]] = []
    for m in members:
        if m is not new and m.category == new.category:
            raise AssertionError(f"builtin {key!r} registered twice")
        pred = _checker(m.params[0].type) if m.params and not m.params[0].variadic else None
        if pred is None:
            raise AssertionError(f"{key}: an overloaded builtin must type its first parameter")
        firsts.append((pred, m))

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if args:
            for pred, m in firsts:
                if pred(args[0]):
                    return m.fn(*args, **kwargs)
            expected = " or ".join(m.params[0].type for m in members)
            raise _type_error(key, members[0].params[0].name, expected, args[0])
        for pred, m in firsts:
            first = m.params[0]
            if first.name in kwargs and pred(kwargs[first.name]):
                return m.fn(**kwargs)
        for _, m in firsts:
            if not m.params[0].required:
                return m.fn(**kwargs)
        raise ConchError("TypeError", f"{key}: missing argument '{members[0].params[0].name}'")

    head = members[0]
    combined = Builtin(
        name=key,
        category=head.category,
        description=" / ".join(m.description for m in members),
        params=head.params,
        returns=head.returns if all(m.returns == head.returns for m in members) else "Any",
        effect=head.effect,
        examples=[e for m in members for e in m.examples],
        aliases=(),
        impl=head.impl,
        overloads=members,
    )
    dispatch.__doc__ = combined.description
    dispatch.__name__ = key if key.isidentifier() else "builtin"
    dispatch.conch_name = key  # type: ignore[attr-defined]
    dispatch.conch_builtin = combined  # type: ignore[attr-defined]
    combined.fn = dispatch
    return combined
