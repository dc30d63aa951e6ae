"""A session's state as data: each binding's value encoded as JSON, and decoded back in
another process, on another machine, by another conch of the same encoding version.

A binding is saved as one document ``{name, type, mutable, kind, value}`` (``kind``: ``let``,
``let mut`` or ``fn``; ``type``: the conch type name), and ``value`` is::

    {"conch": 1,                    the encoding's version
     "data": TREE,                  the value
     "tags": [PATH, ...],           where in this document a tagged value stands
     "fns": [FN, ...],              the conch functions the value reaches
     "cells": {ID: TREE, ...},      the contents of the cells (captured ``let mut``s) they share
     "unset": [ID, ...]}            cells not yet given a value

TREE is plain JSON: conch's Null, Bool, String, finite Float, Int within ±(2^53 − 1), Array
and Record (key order kept) are themselves. Everything else is a one-key object at a path
listed in ``tags``: ``{"$int": "…"}`` (a bigger Int, in decimal, or ``0x…`` hexadecimal beyond
what Python reads back in decimal), ``{"$float": "NaN" | "Infinity" | "-Infinity"}`` (orjson
would write ``null`` for them), ``{"$range": [start, stop, step]}``, ``{"$error": {…}}`` (an
Error value's fields), ``{"$str": …}`` (a String holding lone surrogates, which UTF-8 cannot:
its UTF-8-with-surrogates bytes as Latin-1 characters), ``{"$builtin": name}`` and
``{"$fn": index}``. Because only the listed paths are tags, a Record that happens to look like
one (``{"$int": "5"}``) is just a Record, and decoding touches nothing else: a value without
tags is exactly what ``orjson.loads`` gives. The paths are in pre-order, so decoding them in
reverse turns every tag's contents into values before the tag itself.

A function is its conch source text (the compiler puts it in each function of a session's
program, as its docstring: a constant, nothing done per call) and what it captured::

    {"src": "fn(x) => x * k", "name": "lambda", "qualname": …,
     "byval": {"k": TREE},          names captured by value (conch closures capture values)
     "byref": {"n": ID},            names captured by reference (``let mut``s, local ``fn``s):
                                    cells, shared by every function that captured them
     "defaults": [TREE, ...],       its parameters' default values, as evaluated
     "globals": ["g", ...]}         the session's bindings it names (looked up when called)

Decoding compiles the source again where those names are bound (the cells are those of the
restoring session, so two closures over one ``let mut`` share it again, across documents
too: a cell's ID is the session's), in a checked form when the restoring session runs with
limits. Recursive and mutually recursive functions, closures over closures, and functions
calling the session's other functions by name all come back working.

What cannot be saved is named with a reason, never dropped: a lazy Array whose elements are
not computed yet (computing them could run effects, or forever), a value that is not a conch
value (a host object), a function made outside a session (its source was not kept), a value
nested too deep for JSON, or one over the caller's size limit.

Fast path. Most data is plain JSON; one ``orjson.dumps`` (C) proves it (no big Int, no
surrogate, no host object) but for one thing: orjson writes NaN and the infinities as
``null``, so when the output holds ``null`` the floats are checked at C speed (``_finite``).
Only a value that fails is walked in Python, and even then its plain parts are skipped whole.

What a run changed, and a session's saving and restoring of its bindings, are in
:mod:`conch.lang.tracking`.
"""

from __future__ import annotations

import _ast as py
import contextlib
import itertools
import math
import operator
from types import CellType, CodeType, FunctionType
from typing import Any

import orjson

from conch.lang import ast as A
from conch.lang import emit as E
from conch.lang.compiler import Compiler
from conch.lang.emit import FILENAME, Binding, Func, Scope, compile_quietly, fix_missing_locations
from conch.lang.errors import ConchError
from conch.lang.parser import parse, parse_expression
from conch.lang.record import record
from conch.lang.values import ErrorValue, LazyList

VERSION = 1
_MAX_EXACT = 2**53 - 1
# Python reads back decimal Ints of up to 4300 digits (sys.int_info); hexadecimal has no limit.
_DECIMAL_BITS = 13_000
_OPTS = (orjson.OPT_STRICT_INTEGER | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME
         | orjson.OPT_PASSTHROUGH_DATACLASS)
_SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# Below this length a list or record is walked directly rather than first tried whole.
_TRY_WHOLE = 16
_CHUNK = 256  # a long Array that is not plain data is looked at in chunks of this many


class Unsaved(Exception):
    """A value that cannot be saved, and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.lazy: list[LazyList] = []


class Damaged(Exception):
    """A saved document that cannot be restored, and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- plain data -----------------------------------------------------------------------------

_is = operator.is_


def _finite(value: Any) -> bool:
    """Whether no Float in ``value`` (plain data: lists, tuples, dicts, scalars) is NaN or
    infinite. Each level's values are gathered, sorted out by type and checked, all in C; a
    Table's values column by column (every n-th value of its rows', n its first row's width:
    any records are checked so, but a Table's columns each hold one type)."""
    todo = [value]
    isfinite = math.isfinite
    while todo:
        v = todo.pop()
        t = type(v)
        if t is float:
            if not isfinite(v):
                return False
            continue
        if t is dict:
            v = list(v.values())
        elif t is not list and t is not tuple:
            continue
        kinds = set(map(type, v))
        if float in kinds:
            # isfinite takes Ints and Bools too
            numbers = v if kinds <= _NUMBERS else _of_type(v, float)
            if not all(map(isfinite, numbers)):
                return False
        if dict in kinds:
            dicts = v if len(kinds) == 1 else list(_of_type(v, dict))
            flat = list(itertools.chain.from_iterable(map(dict.values, dicts)))
            width = len(dicts[0]) or 1
            todo += [flat[i::width] for i in range(width)] if width > 1 else [flat]
        for seq in (list, tuple):
            if seq in kinds:
                todo.append(list(itertools.chain.from_iterable(_of_type(v, seq))))
    return True


_NUMBERS = {float, int, bool}


def _of_type(items: list[Any] | tuple[Any, ...], kind: type) -> Any:
    return itertools.compress(items, map(_is, map(type, items), itertools.repeat(kind)))


def plain_json(value: Any) -> bytes | None:
    """``value`` as JSON when JSON holds it exactly as plain data (see the module's text),
    else None."""
    try:
        data = orjson.dumps(value, option=_OPTS)
    except TypeError:  # orjson.JSONEncodeError: a host object, a big Int, a surrogate, depth
        return None
    if b"null" in data and not _finite(value):
        return None
    return data


def _int_text(v: int) -> str:
    return str(v) if v.bit_length() < _DECIMAL_BITS else hex(v)


# -- the registry of cells ------------------------------------------------------------------


class Cells:
    """A session's cells (captured ``let mut``s) by ID, so that one cell reached from two
    bindings is one cell in both documents, and one again after a restore."""

    def __init__(self) -> None:
        self.by_obj: dict[int, tuple[CellType, str]] = {}  # id(cell): (cell, ID); holds the cell
        self.by_id: dict[str, CellType] = {}
        self.next = 1

    def id_of(self, cell: CellType) -> str:
        found = self.by_obj.get(id(cell))
        if found is not None:
            return found[1]
        while str(self.next) in self.by_id:
            self.next += 1
        cid = str(self.next)
        self.next += 1
        self.add(cell, cid)
        return cid

    def add(self, cell: CellType, cid: str) -> None:
        self.by_obj[id(cell)] = (cell, cid)
        self.by_id[cid] = cell

    def keep_only(self, cells: set[int]) -> None:
        """Forget the cells no binding reaches any more (``cells``: their ids)."""
        for key in [k for k in self.by_obj if k not in cells]:
            _, cid = self.by_obj.pop(key)
            self.by_id.pop(cid, None)


# -- encoding -------------------------------------------------------------------------------


_BUILTIN_NAMES: dict[int, str] | None = None


def _builtin_name(fn: Any) -> str | None:
    global _BUILTIN_NAMES
    if _BUILTIN_NAMES is None:
        from conch.lang.builtins.registry import REGISTRY

        _BUILTIN_NAMES = {id(b.fn): name for name, b in REGISTRY.items()}
    name = _BUILTIN_NAMES.get(id(fn))
    if name is None:
        return None
    from conch.lang.builtins.registry import REGISTRY

    entry = REGISTRY.get(name)
    return name if entry is not None and entry.fn is fn else None


def function_source(fn: Any) -> str | None:
    """The conch source text of a function a session's program made, or None."""
    code = getattr(fn, "__code__", None)
    if type(fn) is not FunctionType or code is None or code.co_filename != FILENAME:
        return None
    doc = fn.__doc__
    return doc if type(doc) is str else None


def _global_names(code: CodeType) -> list[str]:
    """The conch names a function's code (and the functions inside it) looks up as globals:
    the session's bindings (and names no binding had yet, looked up when called)."""
    names: set[str] = set()
    todo = [code]
    while todo:
        c = todo.pop()
        names.update(c.co_names)
        todo.extend(x for x in c.co_consts if type(x) is CodeType)
    builtins = {n[3:] for n in names if n.startswith("$b:")}
    return sorted({n.split("$")[0] for n in names if not n.startswith("$")} - builtins)


def _where(name: str, path: list[Any]) -> str:
    """``path`` (in a document) in conch's words, for a reason."""
    if not path or path[0] != "data":
        return f"a function in {name}"
    out = name
    for key in path[1:]:
        if type(key) is int:
            out += f"[{key}]"
        elif key.startswith("$"):
            continue
        else:
            out += f".{key}" if key.isidentifier() else f"[{key!r}]"
    return out


class _Encoder:
    """The walk of a value that is not plain data (see the module's text)."""

    def __init__(self, name: str, cells: Cells) -> None:
        self.name = name
        self.registry = cells
        self.tags: list[list[Any]] = []
        self.fns: list[dict[str, Any]] = []
        self.fn_index: dict[int, int] = {}
        self.cells: dict[str, Any] = {}
        self.unset: list[str] = []
        self.reached: list[CellType] = []
        self.path: list[Any] = ["data"]
        self.todo: list[tuple[int, FunctionType]] = []
        self.lazy: list[LazyList] = []

    def fail(self, what: str) -> Unsaved:
        return Unsaved(f"{_where(self.name, self.path)}: {what}")

    def tag(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.tags.append(list(self.path))
        return obj

    def encode(self, value: Any) -> dict[str, Any]:
        data = self.tree(value)
        # functions and cells, each a part of the document of its own (breadth first: those
        # they reach join the queue)
        i = 0
        while i < len(self.todo):
            self.function_entry(*self.todo[i])
            i += 1
        enc: dict[str, Any] = {"conch": VERSION, "data": data}
        if self.tags:
            enc["tags"] = self.tags
        if self.fns:
            enc["fns"] = self.fns
        if self.cells:
            enc["cells"] = self.cells
        if self.unset:
            enc["unset"] = self.unset
        return enc

    def tree(self, v: Any) -> Any:
        t = type(v)
        if t is str:
            if v.isascii():
                return v
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return self.tag({"$str": v.encode("utf-8", "surrogatepass").decode("latin-1")})
            return v
        if t is int:
            if -_MAX_EXACT <= v <= _MAX_EXACT:
                return v
            return self.tag({"$int": _int_text(v)})
        if t is float:
            if math.isfinite(v):
                return v
            return self.tag({"$float": "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")})
        if v is None or t is bool:
            return v
        if t is list or t is tuple:
            if len(v) >= _TRY_WHOLE and plain_json(v) is not None:
                return v
            return self.items(v)
        if t is dict:
            if len(v) >= _TRY_WHOLE and plain_json(v) is not None:
                return v
            return self.fields(v)
        if t is LazyList:
            cache = v._cache
            if cache is None:
                err = self.fail("a lazy Array whose elements are not computed yet (computing them "
                                "could run effects, or never end); use all of it once (len(x)) "
                                "or build it as an Array, and it is saved after that run")
                self.lazy.append(v)
                raise err
            return self.tree(cache)
        if t is ErrorValue:
            self.tags.append(list(self.path))
            self.path.append("$error")
            try:
                return {"$error": self.fields(v)}
            finally:
                self.path.pop()
        if t is range:
            self.tags.append(list(self.path))
            self.path.append("$range")
            try:
                return {"$range": self.items((v.start, v.stop, v.step))}
            finally:
                self.path.pop()
        if callable(v):
            return self.function(v)
        # subclasses, from Python code: conch sees them as their base type (values.type_of)
        if isinstance(v, str):
            return self.tree(str.__str__(v))  # the text (str() of a str enum is its member's name)
        if isinstance(v, int):
            return self.tree(int.__index__(v))
        if isinstance(v, float):
            return self.tree(float.__float__(v))
        if isinstance(v, dict):
            return self.fields(v)
        raise self.fail(f"a host object of type {t.__name__}, not a conch value")

    def items(self, v: Any) -> list[Any]:
        if len(self.path) > 200:
            raise self.fail("nested more than 200 levels deep")
        path = self.path
        path.append(0)
        out: list[Any] = []
        try:
            # a long Array in chunks: those that are plain data taken whole (one bad element
            # in a big Table costs a walk of its chunk, not of the Table)
            step = _CHUNK if len(v) > _CHUNK else len(v) or 1
            for start in range(0, len(v), step):
                chunk = v[start : start + step]
                if step == _CHUNK and plain_json(chunk) is not None:
                    out += chunk
                    continue
                for i, x in enumerate(chunk, start):
                    path[-1] = i
                    out.append(self.tree(x))
        finally:
            path.pop()
        return out

    def fields(self, v: dict[Any, Any]) -> dict[str, Any]:
        if len(self.path) > 200:
            raise self.fail("nested more than 200 levels deep")
        path = self.path
        path.append("")
        out = {}
        try:
            for k, x in v.items():
                if type(k) is not str:
                    raise self.fail(f"a Record with a key that is not a String ({k!r})")
                path[-1] = k
                out[k] = self.tree(x)
        finally:
            path.pop()
        return out

    def function(self, f: Any) -> dict[str, Any]:
        index = self.fn_index.get(id(f))
        if index is None:
            if function_source(f) is None:
                name = _builtin_name(f)
                if name is not None:
                    return self.tag({"$builtin": name})
                if type(f) is FunctionType and f.__code__.co_filename == FILENAME:
                    raise self.fail("a function made outside a session (its source was not kept)")
                raise self.fail(f"a function of the host ({getattr(f, '__name__', type(f).__name__)}), "
                                "not a conch function or builtin")
            index = len(self.fns)
            self.fn_index[id(f)] = index
            self.fns.append({})
            self.todo.append((index, f))
        return self.tag({"$fn": index})

    def function_entry(self, index: int, f: FunctionType) -> None:
        code = f.__code__
        entry: dict[str, Any] = {"src": f.__doc__, "name": f.__name__, "qualname": f.__qualname__}
        self.path = ["fns", index, "byval", ""]
        byval: dict[str, Any] = {}
        for pyname, value in (f.__kwdefaults__ or {}).items():
            conch = pyname.split("$")[0]
            self.path[-1] = conch
            byval[conch] = self.tree(value)
        entry["byval"] = byval
        self.path = ["fns", index, "defaults"]
        entry["defaults"] = self.items(f.__defaults__ or ())
        byref: dict[str, str] = {}
        for pyname, cell in zip(code.co_freevars, f.__closure__ or (), strict=True):
            byref[pyname.split("$")[0]] = self.cell(cell)
        entry["byref"] = byref
        entry["globals"] = _global_names(code)
        self.fns[index] = entry

    def cell(self, cell: CellType) -> str:
        cid = self.registry.id_of(cell)
        if cid in self.cells or cid in self.unset:
            return cid
        self.reached.append(cell)
        try:
            contents = cell.cell_contents
        except ValueError:
            self.unset.append(cid)
            return cid
        self.cells[cid] = None  # taken, so that a cycle through this cell ends here
        saved = self.path
        self.path = ["cells", cid]
        try:
            self.cells[cid] = self.tree(contents)
        finally:
            self.path = saved
        return cid


@record(eq=False)
class Encoded:
    """A value's encoding, its JSON size and the cells it reaches."""

    value: dict[str, Any]
    size: int
    cells: tuple[CellType, ...]
    data: bytes | None = None  # the JSON of ``value``'s data when the value is plain data


def encode(value: Any, name: str = "value", cells: Cells | None = None,
           max_bytes: int | None = None) -> Encoded:
    """Encode one binding's value (see the module's text); :class:`Unsaved` if it cannot be."""
    data = plain_json(value)
    if data is not None:
        size = len(data) + 20
        if max_bytes is not None and size > max_bytes:
            raise Unsaved(f"its saved form would take {size} bytes, over the limit of {max_bytes}")
        return Encoded({"conch": VERSION, "data": value}, size, (), data)
    enc = _Encoder(name, cells if cells is not None else Cells())
    try:
        value_enc = enc.encode(value)
    except Unsaved as exc:
        exc.lazy = enc.lazy
        raise
    except RecursionError:
        raise Unsaved("nested too deeply to save") from None
    try:
        size = len(orjson.dumps(value_enc))
    except TypeError as exc:  # depth beyond what orjson writes
        raise Unsaved(f"it cannot be written as JSON: {exc}") from None
    if max_bytes is not None and size > max_bytes:
        raise Unsaved(f"its saved form would take {size} bytes, over the limit of {max_bytes}")
    return Encoded(value_enc, size, tuple(enc.reached))


def cells_in(value: Any) -> tuple[CellType, ...]:
    """The cells a value reaches through the functions in it (for telling when a closure's
    captured ``let mut`` changed although the binding still holds the same value)."""
    if plain_json(value) is not None:
        return ()
    enc = _Encoder("value", Cells())
    with contextlib.suppress(Unsaved, RecursionError):  # the cells met before it failed
        enc.encode(value)
    return tuple(enc.reached)


# -- decoding -------------------------------------------------------------------------------


class Restorer:
    """Decodes the documents of one restore into a session's namespace: the functions
    compiled where the session's bindings are known, the cells shared across documents."""

    def __init__(self, namespace: dict[str, Any], bindings: dict[str, Binding], checked: bool) -> None:
        self.namespace = namespace
        self.bindings = bindings
        self.checked = checked
        self.cells: dict[str, CellType] = {}  # a document's cell ID: the cell made for it
        self.filled: set[str] = set()

    def value(self, enc: Any) -> tuple[Any, list[str]]:
        """A decoded value and the IDs of the cells its functions share."""
        if type(enc) is not dict or "conch" not in enc or "data" not in enc:
            raise Damaged("its value is not a conch value encoding")
        if enc["conch"] != VERSION:
            raise Damaged(f"its value is in encoding version {enc['conch']!r}; this conch reads version {VERSION}")
        tags = enc.get("tags")
        if not tags:
            return enc["data"], []
        try:
            fns = enc.get("fns") or []
            cells = enc.get("cells") or {}
            unset = enc.get("unset") or []
            made = [self.function(entry) for entry in fns]
            for path in reversed(tags):
                node = enc
                for key in path[:-1]:
                    node = node[key]
                node[path[-1]] = self.tag(node[path[-1]], made)
            for f, entry in zip(made, fns, strict=True):
                defaults = entry.get("defaults") or []
                f.__defaults__ = tuple(defaults) if defaults else None
                self.kwdefaults(f, entry.get("byval") or {})
            for cid, contents in cells.items():
                if cid not in self.filled:
                    self.cell(cid).cell_contents = contents
                    self.filled.add(cid)
        except Damaged:
            raise
        except ConchError as exc:
            raise Damaged(f"a function in it does not compile: {exc.kind}: {exc.message}") from None
        except Exception as exc:  # whatever a damaged document makes fail: reported, not fatal
            raise Damaged(f"its value's encoding is inconsistent ({type(exc).__name__}: {exc})") from None
        return enc["data"], [*cells, *unset]

    def cell(self, cid: str) -> CellType:
        cell = self.cells.get(cid)
        if cell is None:
            cell = self.cells[cid] = CellType()
        return cell

    def tag(self, obj: Any, made: list[FunctionType]) -> Any:
        if type(obj) is not dict or len(obj) != 1:
            raise Damaged("its value's encoding is inconsistent (a tag is not a one-key object)")
        ((key, v),) = obj.items()
        if key == "$int":
            return int(v, 0)
        if key == "$float":
            return _SPECIAL[v]
        if key == "$range":
            return range(*v)
        if key == "$error":
            return ErrorValue(v)
        if key == "$str":
            return v.encode("latin-1").decode("utf-8", "surrogatepass")
        if key == "$fn":
            return made[v]
        if key == "$builtin":
            from conch.lang.builtins.registry import REGISTRY

            builtin = REGISTRY.get(v)
            if builtin is None:
                raise Damaged(f"it names a builtin this conch does not have: {v}")
            return builtin.fn
        raise Damaged(f"its value holds a tag this conch does not know: {key}")

    def function(self, entry: dict[str, Any]) -> FunctionType:
        src = entry["src"]
        lam, named = _parse_function(src)
        by_ref: dict[str, str] = entry.get("byref") or {}
        by_val = list(entry.get("byval") or {})
        scope = {}
        for name in entry.get("globals") or ():
            b = self.bindings.get(name)
            # by name, as when it was made: mutable so that one it assigns may be assigned
            scope[name] = Binding(b.pyname if b is not None else name, True, True, Func(None), True)
        compiler = Compiler(checked=self.checked, session_globals=scope, source=src)
        code, builtins = compile_closure(compiler, lam, named, list(by_ref), by_val)
        for key, fn in builtins.items():
            self.namespace.setdefault(key, fn)
        closure = []
        for pyname in code.co_freevars:
            cid = by_ref.get(pyname.split("$")[0])
            if cid is None:
                raise Damaged(f"a function in it does not capture what it was saved with ({pyname})")
            closure.append(self.cell(str(cid)))
        kwonly = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
        if sorted(n.split("$")[0] for n in kwonly) != sorted(by_val):
            raise Damaged("a function in it does not capture what it was saved with")
        f = FunctionType(code, self.namespace, str(entry.get("name") or "lambda"), None, tuple(closure))
        if isinstance(entry.get("qualname"), str):
            f.__qualname__ = entry["qualname"]
        return f

    @staticmethod
    def kwdefaults(f: FunctionType, byval: dict[str, Any]) -> None:
        code = f.__code__
        kwonly = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
        if kwonly:
            f.__kwdefaults__ = {n: byval[n.split("$")[0]] for n in kwonly}


def decode(enc: Any, namespace: dict[str, Any] | None = None, checked: bool = False) -> Any:
    """A value :func:`encode` encoded (its ``value``), on its own: its functions' globals are
    ``namespace`` (a fresh one when None); :class:`Damaged` if it cannot be decoded."""
    if namespace is None:
        from conch.lang import runtime

        namespace = dict(runtime.HELPERS)
    if type(enc) is dict and enc.get("tags"):
        enc = orjson.loads(orjson.dumps(enc))  # decoding replaces tags in place
    return Restorer(namespace, {}, checked).value(enc)[0]


def compile_closure(compiler: Compiler, lam: A.Lambda, named: bool, by_ref: list[str],
                    by_value: list[str]) -> tuple[CodeType, dict[str, Any]]:
    """The code object of the function ``lam`` compiled as if made inside a function that
    binds ``by_ref`` (the names it captures by reference: its cells) and ``by_value`` (those
    it captures by value: its keyword-only defaults), and the builtins it needs. Every other
    name resolves as in ``compiler``: its session globals, the builtins. ``named``: a
    ``fn name(...)`` (which counts recursion depth in a checked run); its own name resolves
    as any other. The caller makes the function object, with its own cells and values."""
    env = Func(compiler.main_func)
    compiler.func = env
    compiler.scope = Scope(env, compiler.scope)
    label = "$restored"
    body: list[py.stmt] = []
    with compiler.into(body):
        for name in by_ref:
            compiler.emit(E.assign(compiler.declare(name, mutable=True).pyname, E.const(None)))
        for name in by_value:
            compiler.emit(E.assign(compiler.declare(name).pyname, E.const(None)))
        compiler.function(lam, label if named else None, label)
    fdef = py.FunctionDef(
        name="$env",
        args=py.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
        body=body,
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    fdef.lineno, fdef.col_offset, fdef.end_lineno, fdef.end_col_offset = 1, 0, 1, 0
    module = py.Module(body=[fdef], type_ignores=[])
    fix_missing_locations(module)
    code = compile_quietly(module, 0)  # docstrings kept even under python -OO
    (env_code,) = (c for c in code.co_consts if type(c) is CodeType)
    (fn_code,) = (c for c in env_code.co_consts if type(c) is CodeType and c.co_name == label)
    return fn_code, compiler.builtins


def _parse_function(src: Any) -> tuple[A.Lambda, bool]:
    if type(src) is not str:
        raise Damaged("a function in it has no source text")
    try:
        prog = parse(src)
        node: A.Node | None = prog.stmts[0] if len(prog.stmts) == 1 else None
    except ConchError:
        node = None
    if node is None or not isinstance(node, A.FnDef | A.Lambda):
        try:
            node = parse_expression(src)
        except ConchError as exc:
            raise Damaged(f"a function's source does not parse: {exc.message}") from None
    if isinstance(node, A.FnDef):
        return node.fn, True
    if isinstance(node, A.Lambda):
        return node, False
    raise Damaged("a function's source is not a function")
