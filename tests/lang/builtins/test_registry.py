"""The registry's lazy machinery agrees with what inspect and a full load would give."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from typing import Any

from conch.lang.builtins import _index
from conch.lang.builtins.registry import (
    EMPTY,
    REGISTRY,
    Builtin,
    Param,
    _function_parameters,
    all_builtins,
    build_index,
)


def _members() -> list[Builtin]:
    return [m for b in all_builtins() for m in (b.overloads or [b])]


def test_the_name_index_is_current() -> None:
    assert build_index() == _index.INDEX, (
        "src/conch/lang/builtins/_index.py is out of date: run\n"
        "  python -c 'from conch.lang.builtins.registry import write_index; write_index()'"
    )


def _params_by_inspect(b: Builtin) -> tuple[list[Param], Any]:
    """The parameters as the registry derived them with inspect.signature."""
    sig = inspect.signature(b.impl)
    declared = b.declared or {}
    out = []
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            continue
        ann = declared.get(p.name, p.annotation)
        type_name = ann if isinstance(ann, str) and ann else "Any"
        if p.kind is p.VAR_POSITIONAL:
            out.append(Param(p.name, type_name, False, None, variadic=True))
        elif p.default is p.empty:
            out.append(Param(p.name, type_name, True))
        else:
            out.append(Param(p.name, type_name, False, p.default))
    return out, sig.return_annotation


def test_parameters_read_from_code_objects_match_inspect() -> None:
    for b in _members():
        params, ret = _params_by_inspect(b)
        assert b.params == params, b.name
        read = _function_parameters(b.impl)[1]
        assert read == (ret if ret is not inspect.Signature.empty else EMPTY), b.name


def test_wrappers_keep_the_implementation_signature() -> None:
    for b in _members():
        wrapper = inspect.signature(b.fn)
        impl = inspect.signature(b.impl)
        got = [(p.name, p.kind, p.default) for p in wrapper.parameters.values()]
        want = [(p.name, p.kind if p.kind is not p.POSITIONAL_ONLY else p.POSITIONAL_OR_KEYWORD,
                 p.default) for p in impl.parameters.values()]
        assert got == want, b.name


def _in_fresh_process(code: str) -> Any:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_reading_one_name_imports_only_its_modules_and_order_does_not_matter() -> None:
    # collections before filesystem, the reverse of load_all's order
    lazy = _in_fresh_process(
        "import json, sys\n"
        "from conch.lang.builtins.registry import REGISTRY, load_all\n"
        "REGISTRY['len']\n"
        "mods = sorted(m for m in sys.modules if m.startswith('conch.lang.builtins.'))\n"
        "entries = {k: REGISTRY[k].to_dict() for k in ('append', 'find')}\n"
        "load_all()\n"
        "print(json.dumps({'mods': mods, 'entries': entries, 'names': sorted(REGISTRY)}))\n"
    )
    assert lazy["mods"] == [
        "conch.lang.builtins._index",
        "conch.lang.builtins.collections",
        "conch.lang.builtins.registry",
        "conch.lang.builtins.types",
    ]
    eager = {k: REGISTRY[k].to_dict() for k in ("append", "find")}
    assert json.loads(json.dumps(eager)) == lazy["entries"]
    assert lazy["names"] == sorted(REGISTRY)


def test_membership_and_get_of_unknown_names() -> None:
    assert "no_such_builtin" not in REGISTRY
    assert REGISTRY.get("no_such_builtin") is None
    assert "len" in REGISTRY and REGISTRY.get("len") is REGISTRY["len"]


def _shapes() -> list[Any]:
    import functools

    def plain(a: Any, /, b: Any, c: Any = 1, *rest: Any, d: Any, e: Any = "x", **kw: Any) -> Any: ...

    def kwonly(a: Any, *, b: Any = None) -> Any: ...

    @functools.wraps(kwonly)
    def wrapped(*args: Any, **kwargs: Any) -> Any: ...

    return [plain, kwonly, wrapped, functools.partial(plain, 1), lambda x=2: x]


def test_code_object_reading_matches_inspect_on_every_shape() -> None:
    kinds = {
        inspect.Parameter.POSITIONAL_ONLY: 0,
        inspect.Parameter.POSITIONAL_OR_KEYWORD: 0,
        inspect.Parameter.VAR_POSITIONAL: 1,
        inspect.Parameter.KEYWORD_ONLY: 2,
        inspect.Parameter.VAR_KEYWORD: 3,
    }
    for fn in _shapes():
        sig = inspect.signature(fn)
        want = [
            (p.name, kinds[p.kind], EMPTY if p.default is p.empty else p.default,
             EMPTY if p.annotation is p.empty else p.annotation)
            for p in sig.parameters.values()
        ]
        ret = EMPTY if sig.return_annotation is sig.empty else sig.return_annotation
        assert _function_parameters(fn) == (want, ret), fn
