"""The builtin registry: one declaration per builtin, checked calls, documentation that runs.

A builtin is a Python function decorated with :func:`builtin`. Its parameters and return
type are read from the annotations, which name conch types (see :mod:`conch.lang.builtins.types`);
the decorator generates a thin wrapper with the same signature that checks every argument's
type and the effect policy, so a wrong call is a ``TypeError`` naming the parameter.

Start-up cost matters here (``conch -c 'len([1])'`` is as common as ``1 + 1``): the decorator
only records the declaration; parameters are read from the code object and the wrapper is
generated when first asked for, and a name is looked up in :mod:`._index` so that reading
``REGISTRY["len"]`` imports the one category module that defines it.
"""

from __future__ import annotations

import _thread

from conch.lang import values
from conch.lang.builtins._index import INDEX
from conch.lang.context import EFFECTS, current
from conch.lang.errors import ConchError
from conch.lang.record import record

# Records rather than dataclasses, and no typing or inspect at run time: each of them costs
# milliseconds on every start of a program that names a builtin.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, TypeVar

    _F = TypeVar("_F", bound=Callable[..., Any])

CATEGORIES = ("filesystem", "collections", "strings", "math", "data", "system", "ai", "http")
# Builtin modules not named after their category, each with its category: agent.py holds
# ``agent`` ("ai"); a category too large for one module has its builtins by job in
# ``<category>_<job>.py``, its conventions and shared helpers in ``<category>.py``.
MODULE_CATEGORIES = {
    "agent": "ai",
    "collections_transform": "collections",
    "collections_slice": "collections",
    "collections_order": "collections",
    "collections_reshape": "collections",
    "collections_records": "collections",
    "filesystem_contents": "filesystem",
    "filesystem_edit": "filesystem",
    "filesystem_text": "filesystem",
}

_MISSING: Any = object()
EMPTY: Any = object()  # a parameter without a default


@record
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


@record
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


# Parameter kinds, as in inspect.Parameter
POSITIONAL, VAR_POSITIONAL, KEYWORD_ONLY, VAR_KEYWORD = range(4)
_CO_VARARGS = 0x04
_CO_VARKEYWORDS = 0x08


def _function_parameters(impl: Callable[..., Any]) -> tuple[list[tuple[str, int, Any, Any]], Any]:
    """((name, kind, default, annotation) per parameter, return annotation) of ``impl``, as
    ``inspect.signature`` sees them (following ``functools.wraps``). Read from the code object:
    inspect costs ~10 ms to import and tens of microseconds per builtin."""
    fn: Any = impl
    while not hasattr(fn, "__signature__"):
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is None:
            break
        fn = wrapped
    if type(fn) is not type(_function_parameters) or hasattr(fn, "__signature__"):
        return _inspect_parameters(impl)
    code = fn.__code__
    npos = code.co_argcount
    nkw = code.co_kwonlyargcount
    names = code.co_varnames
    defaults = fn.__defaults__ or ()
    kwdefaults = fn.__kwdefaults__ or {}
    annotations = fn.__annotations__
    out: list[tuple[str, int, Any, Any]] = []
    first_default = npos - len(defaults)
    for i in range(npos):
        name = names[i]
        default = defaults[i - first_default] if i >= first_default else EMPTY
        out.append((name, POSITIONAL, default, annotations.get(name, EMPTY)))
    index = npos + nkw
    if code.co_flags & _CO_VARARGS:
        name = names[index]
        out.append((name, VAR_POSITIONAL, EMPTY, annotations.get(name, EMPTY)))
        index += 1
    for name in names[npos:npos + nkw]:
        out.append((name, KEYWORD_ONLY, kwdefaults.get(name, EMPTY), annotations.get(name, EMPTY)))
    if code.co_flags & _CO_VARKEYWORDS:
        name = names[index]
        out.append((name, VAR_KEYWORD, EMPTY, annotations.get(name, EMPTY)))
    return out, annotations.get("return", EMPTY)


def _inspect_parameters(impl: Callable[..., Any]) -> tuple[list[tuple[str, int, Any, Any]], Any]:
    """What :func:`_function_parameters` gives, for callables that are not plain functions."""
    import inspect

    kinds = {
        inspect.Parameter.POSITIONAL_ONLY: POSITIONAL,
        inspect.Parameter.POSITIONAL_OR_KEYWORD: POSITIONAL,
        inspect.Parameter.VAR_POSITIONAL: VAR_POSITIONAL,
        inspect.Parameter.KEYWORD_ONLY: KEYWORD_ONLY,
        inspect.Parameter.VAR_KEYWORD: VAR_KEYWORD,
    }
    empty = inspect.Parameter.empty
    sig = inspect.signature(impl)
    params = [
        (p.name, kinds[p.kind], EMPTY if p.default is empty else p.default,
         EMPTY if p.annotation is empty else p.annotation)
        for p in sig.parameters.values()
    ]
    return params, EMPTY if sig.return_annotation is empty else sig.return_annotation


@record(eq=False)
class Builtin:
    """One builtin. ``params``, ``returns`` and the checked wrapper ``fn`` are worked out on
    first use: the declaration alone is what ~150 builtins cost at import."""

    name: str
    category: str
    description: str
    effect: str
    examples: list[Example]
    aliases: tuple[str, ...]
    impl: Callable[..., Any]
    # Builtins of different categories sharing a name (``append``, ``find``): the entry in
    # REGISTRY dispatches on the type of the first argument to one of these.
    overloads: tuple[Builtin, ...] = ()
    # The ``params`` the decorator was given: conch type names overriding annotations
    declared: dict[str, str] | None = None
    _params: list[Param] | None = None
    _returns: str | None = None
    _fn: Callable[..., Any] | None = None
    _sig: list[tuple[str, int, Any, Any]] | None = None

    def __repr__(self) -> str:
        return (
            f"Builtin(name={self.name!r}, category={self.category!r}, "
            f"description={self.description!r}, params={self.params!r}, returns={self.returns!r}, "
            f"effect={self.effect!r}, examples={self.examples!r}, aliases={self.aliases!r}, "
            f"impl={self.impl!r})"
        )

    def _key(self) -> tuple[Any, ...]:
        return (self.name, self.category, self.description, self.params, self.returns,
                self.effect, self.examples, self.aliases, self.impl, self.overloads)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Builtin)
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def parameter_specs(self) -> list[tuple[str, int, Any, Any]]:
        """``(name, kind, default, annotation)`` per parameter of the implementation: kind one
        of :data:`POSITIONAL` ... :data:`VAR_KEYWORD`, default :data:`EMPTY` when it has none."""
        sig = self._sig
        if sig is None:
            sig, ret = _function_parameters(self.impl)
            self._sig = sig
            if self._returns is None:
                self._returns = ret if isinstance(ret, str) else "Any"
        return sig

    @property
    def params(self) -> list[Param]:
        plist = self._params
        if plist is None:
            declared = self.declared or {}
            plist = []
            for name, kind, default, ann in self.parameter_specs():
                if kind == VAR_KEYWORD:
                    continue
                ann = declared.get(name, ann)
                type_name = ann if isinstance(ann, str) and ann else "Any"
                if kind == VAR_POSITIONAL:
                    plist.append(Param(name, type_name, False, None, variadic=True))
                elif default is EMPTY:
                    plist.append(Param(name, type_name, True))
                else:
                    plist.append(Param(name, type_name, False, default))
            self._params = plist
        return plist

    @params.setter
    def params(self, value: list[Param]) -> None:
        self._params = value

    @property
    def returns(self) -> str:
        if self._returns is None:
            self.parameter_specs()
        assert self._returns is not None
        return self._returns

    @returns.setter
    def returns(self, value: str) -> None:
        self._returns = value

    @property
    def fn(self) -> Callable[..., Any]:
        """The checked wrapper, generated on first use: compiling ~150 wrappers up front
        would cost every ``conch -c`` start-up tens of milliseconds."""
        wrapper = self._fn
        if wrapper is None:
            wrapper = self._fn = _make_wrapper(self, self.parameter_specs())
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
            **self.summary(),
            "signature": self.signature,
            "examples": [e.code for e in self.examples],
            "example_results": [e.to_dict() for e in self.examples],
            "parameters": [p.to_dict() for p in self.params],
            "returns": self.returns,
            "effect": self.effect,
            "aliases": list(self.aliases),
            **({"overloads": [o.to_dict() for o in self.overloads]} if self.overloads else {}),
        }


def _import_for(key: str) -> None:
    """Import the category modules still missing for ``REGISTRY[key]`` to be complete."""
    mods = INDEX.get(key)
    if mods is not None and not _imported.issuperset(mods):
        _import(mods)


def _after_load_all(method: _F) -> _F:
    """``dict``'s ``method``, called once every category module is imported."""

    def call(self: _Registry, *args: Any) -> Any:
        if not _loaded:
            load_all()
        return method(self, *args)

    return call  # type: ignore[return-value]


class _Registry(dict[str, "Builtin"]):
    """A dict that imports category modules on demand: reading one name imports the modules
    that define it (per :mod:`._index`), listing the names imports them all. A program naming
    no builtin (``conch -c '1 + 1'``) imports none, ``len([1])`` only collections."""

    __slots__ = ()

    def get(self, key: str, default: Any = None) -> Any:
        if not _loaded:
            _import_for(key)
        return dict.get(self, key, default)

    def __getitem__(self, key: str) -> Builtin:
        if not _loaded:
            _import_for(key)
        return dict.__getitem__(self, key)

    def __contains__(self, key: object) -> bool:
        if not _loaded and isinstance(key, str):
            _import_for(key)
        return dict.__contains__(self, key)

    __iter__ = _after_load_all(dict.__iter__)
    __len__ = _after_load_all(dict.__len__)
    keys = _after_load_all(dict.keys)
    values = _after_load_all(dict.values)
    items = _after_load_all(dict.items)
    copy = _after_load_all(dict.copy)  # a plain dict


REGISTRY: dict[str, Builtin] = _Registry()
"""Every builtin by name, aliases included (an alias maps to the same Builtin). A category
module is imported when one of its names is first read (all of them by :func:`load_all` or
by listing the names)."""


def all_builtins() -> list[Builtin]:
    """Each builtin once, sorted by category then name."""
    load_all()
    unique = {id(b): b for b in REGISTRY.values()}
    return sorted(unique.values(), key=lambda b: (b.category, b.name))


def lookup(name: str) -> Builtin | None:
    return REGISTRY.get(name)


_loaded = False
_imported: set[str] = set()  # category modules fully imported
_importing: set[str] = set()
_load_lock = _thread.RLock()


def _import(modules: Sequence[str]) -> None:
    # Other threads wait here until a module is imported rather than see a half-filled
    # registry; the importing thread itself may read the registry meanwhile (re-entry).
    with _load_lock:
        for module in modules:
            if module in _imported or module in _importing:
                continue
            _importing.add(module)
            try:
                __import__(f"conch.lang.builtins.{module}")
            finally:
                _importing.discard(module)
            _imported.add(module)


def load_all() -> None:
    """Import every category module so that their builtins register."""
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if _loaded or _importing:
            return
        _import((*CATEGORIES, *MODULE_CATEGORIES))
        _loaded = True


def build_index() -> dict[str, tuple[str, ...]]:
    """Name -> the category modules that register it, from the loaded registry: what
    :mod:`._index` must hold."""
    load_all()
    index: dict[str, tuple[str, ...]] = {}
    for key, b in sorted(dict.items(REGISTRY)):
        mods = {_category_module(m) for m in b.overloads or [b]}
        if None not in mods:
            index[key] = tuple(m for m in (*CATEGORIES, *MODULE_CATEGORIES) if m in mods)
    return index


def write_index() -> None:
    """Rewrite :mod:`._index` from the registry."""
    import pathlib

    def tup(mods: tuple[str, ...]) -> str:
        return "(" + ", ".join(f'"{m}"' for m in mods) + ("," if len(mods) == 1 else "") + ")"

    lines = [f'    "{k}": {tup(v)},' for k, v in build_index().items()]
    path = pathlib.Path(__file__).with_name("_index.py")
    path.write_text(_INDEX_TEMPLATE.replace("@ENTRIES@", "\n".join(lines)))


_INDEX_TEMPLATE = '''\
"""Which category modules register each builtin name, so that reading one name imports only
those modules. Generated by ``conch.lang.builtins.registry.write_index()``; a test fails when
it is out of date."""

INDEX: dict[str, tuple[str, ...]] = {
@ENTRIES@
}
'''


def _category_module(b: Builtin) -> str | None:
    module = getattr(b.impl, "__module__", "") or ""
    prefix, _, name = module.rpartition(".")
    known = name in CATEGORIES or name in MODULE_CATEGORIES
    return name if prefix == "conch.lang.builtins" and known else None


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


def type_names(type_name: str) -> list[str]:
    """The member names of a declared type: ``"String | Array"`` -> ``["String", "Array"]``,
    ``"Int?"`` -> ``["Int", "Null"]``."""
    return [t.strip() for t in type_name.replace("?", " | Null").split("|") if t.strip()]


def _checker(type_name: str) -> Callable[[Any], bool] | None:
    """A predicate for a declared type (``String | Array``, ``Int?``), or None for Any."""
    names = type_names(type_name)
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
    names = type_names(type_name)
    if "Any" in names:
        return None
    return " or ".join(f"({_INLINE[n].format(v=var)})" for n in names)


def _type_error(builtin: str, param: str, expected: str, got: Any) -> ConchError:
    return ConchError(
        "TypeError",
        f"{builtin}: parameter '{param}' expects {expected}, got {values.type_of(got)}",
    )


def _make_wrapper(b: Builtin, sig: list[tuple[str, int, Any, Any]]) -> Callable[..., Any]:
    """Generate a wrapper with the implementation's exact signature that checks types."""
    checks: dict[str, Any] = {}
    lines: list[str] = []
    params_src: list[str] = []
    call_args: list[str] = []
    seen_kwonly = False
    for pname, kind, default, _ann in sig:
        if kind == VAR_POSITIONAL:
            params_src.append(f"*{pname}")
            call_args.append(f"*{pname}")
            seen_kwonly = True
        elif kind == VAR_KEYWORD:
            params_src.append(f"**{pname}")
            call_args.append(f"**{pname}")
        else:
            if kind == KEYWORD_ONLY and not seen_kwonly:
                params_src.append("*")
                seen_kwonly = True
            if default is EMPTY:
                params_src.append(pname)
            else:
                checks[f"_d_{pname}"] = default
                params_src.append(f"{pname}=_d_{pname}")
            call_args.append(f"{pname}={pname}" if kind == KEYWORD_ONLY else pname)
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
    import keyword

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
        if category not in CATEGORIES and category not in MODULE_CATEGORIES.values():
            raise AssertionError(f"{name}: unknown category {category!r}")
        if effect not in EFFECTS:
            raise AssertionError(f"{name}: unknown effect {effect!r}")
        if not examples:
            raise AssertionError(f"{name}: at least one example is required")
        exs = [e if isinstance(e, Example) else Example(e[0], e[1]) for e in examples]
        b = Builtin(name, category, description, effect, exs, tuple(aliases), impl,
                    declared=params, _returns=returns or None)
        for key in (name, *aliases):
            existing = dict.get(REGISTRY, key)
            REGISTRY[key] = b if existing is None else _overload(key, existing, b)
        return impl

    return decorate


def _overload(key: str, existing: Builtin, new: Builtin) -> Builtin:
    """One entry for builtins of different categories that share a name (the language lists
    ``append`` and ``find`` under both filesystem and collections), chosen per call by the
    type of the first argument."""
    members = [*(existing.overloads or [existing]), new]
    # In the order of CATEGORIES whatever order the modules were imported in, so that the
    # entry (its head, the dispatch order) does not depend on which name was read first; by
    # the category declared, which a module not named after its category also gives.
    order = {m: i for i, m in enumerate(CATEGORIES)}
    members.sort(key=lambda m: order.get(m.category, len(order)))
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
        key,
        head.category,
        " / ".join(m.description for m in members),
        head.effect,
        [e for m in members for e in m.examples],
        (),
        head.impl,
        overloads=tuple(members),
        _params=head.params,
        _returns=head.returns if all(m.returns == head.returns for m in members) else "Any",
    )
    dispatch.__doc__ = combined.description
    dispatch.__name__ = key if key.isidentifier() else "builtin"
    dispatch.conch_name = key  # type: ignore[attr-defined]
    dispatch.conch_builtin = combined  # type: ignore[attr-defined]
    combined.fn = dispatch
    return combined
