"""Helpers that compiled conch code calls for the operators whose meaning differs from Python.

Each has a fast path for the common case first; everything else (integer arithmetic,
comparisons, ``in``) compiles to native Python operations and is translated on failure.
"""

from __future__ import annotations

import itertools

from conch.lang import values
from conch.lang.errors import ConchError, did_you_mean
from conch.lang.values import ErrorValue, LazyList, type_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from typing import Any

_ARRAYS = (list, range, LazyList, tuple)
_NUMBERS = (int, float)


def _type_error(message: str, hint: str | None = None) -> ConchError:
    return ConchError("TypeError", message, hint=hint)


def add(a: Any, b: Any) -> Any:
    ta = type(a)
    tb = type(b)
    if ta is tb:
        if ta is int or ta is float or ta is str or ta is list:
            return a + b
        if ta is dict:
            return {**a, **b}
    if (ta is int or ta is float) and (tb is int or tb is float):
        return a + b
    if isinstance(a, _ARRAYS) and isinstance(b, _ARRAYS):
        return values.as_list(a) + values.as_list(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **b}
    hint = None
    if ta is str or tb is str:
        hint = 'use interpolation "${a}${b}" or str() to build strings'
    raise _type_error(f"cannot add {type_of(a)} and {type_of(b)}", hint)


def add_bounded(a: Any, b: Any) -> Any:
    """``+`` for runs with a collection limit: concatenations stay within it."""
    r = add(a, b)
    tr = type(r)
    if tr is list or tr is str:
        values.check_size(len(r), "Array" if tr is list else "String")
    return r


def mul_bounded(a: Any, b: Any) -> Any:
    """``*`` for runs with a collection limit: a repeated String or Array stays within it."""
    if a is True or a is False or b is True or b is False:
        bool_operand("*", a, b)
    ta = type(a)
    tb = type(b)
    if (ta is str or ta is list) and tb is int:
        values.check_size(len(a) * b, "String" if ta is str else "Array")
    elif (tb is str or tb is list) and ta is int:
        values.check_size(len(b) * a, "String" if tb is str else "Array")
    return a * b


def eq(a: Any, b: Any) -> bool:
    if a is b:
        return True
    ta = type(a)
    if ta is type(b) and (ta is int or ta is str or ta is float):
        return bool(a == b)
    return values.equal(a, b)


def contains(item: Any, container: Any) -> bool:
    """``item in container`` with the equality of ``==`` (``true in [1]`` is false)."""
    tc = type(container)
    if tc is list or tc is range or tc is LazyList or tc is tuple:
        return values.member(item, container)
    if tc is str:
        if type(item) is not str:
            raise _type_error(f"'in' a String needs a String on the left, got {type_of(item)}",
                              "a String contains substrings: \"sh\" in \"conch shell\"")
        return item in container
    if isinstance(container, dict):
        return type(item) is str and item in container
    raise _type_error(f"'in' needs an Array, Range, String or Record on the right, got {type_of(container)}")


def not_contains(item: Any, container: Any) -> bool:
    return not contains(item, container)


def ne(a: Any, b: Any) -> bool:
    return not eq(a, b)


def truth(v: Any) -> bool:
    if v is True or v is False:
        return v
    raise _type_error(
        f"expected a Bool condition, got {type_of(v)}",
        "conditions must be true or false: compare explicitly (x != null, len(xs) > 0)",
    )


def field(obj: Any, name: str) -> Any:
    if type(obj) is dict:
        try:
            return obj[name]
        except KeyError:
            raise _missing_field(obj, name)
    if isinstance(obj, dict):
        if name in obj:
            return obj[name]
        raise _missing_field(obj, name)
    if isinstance(obj, list | LazyList | tuple):
        return [field(row, name) for row in obj]
    if obj is None:
        raise _type_error(f"cannot read field '{name}' of Null", f"use ?.{name} to get null instead")
    raise _type_error(f"cannot read field '{name}' of {type_of(obj)}", "fields belong to Records and Tables")


def opt_field(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    if isinstance(obj, list | LazyList | tuple):
        return [opt_field(row, name) for row in obj]
    raise _type_error(f"cannot read field '{name}' of {type_of(obj)}", "fields belong to Records and Tables")


def _missing_field(obj: dict[str, Any], name: str) -> ConchError:
    hint = did_you_mean(name, [str(k) for k in obj])
    if hint is None:
        keys = ", ".join(str(k) for k in list(obj)[:8])
        hint = f"the fields are: {keys}" if keys else "the record is empty"
    return ConchError("KeyError", f"no field '{name}'", hint=hint)


def index(obj: Any, i: Any) -> Any:
    to = type(obj)
    ti = type(i)
    if ti is int:
        if to is list or to is str or to is range or to is tuple:
            try:
                return obj[i]
            except IndexError:
                raise _out_of_range(i, len(obj), type_of(obj))
        if to is LazyList:
            if i >= 0:
                for item in itertools.islice(obj, i, i + 1):
                    return item
                raise _out_of_range(i, len(obj), "Array")
            items = obj.materialize()
            try:
                return items[i]
            except IndexError:
                raise _out_of_range(i, len(items), "Array")
        if isinstance(obj, dict):
            raise _type_error(f"cannot index a Record with Int {i}", 'records are indexed by field name: rec["name"]')
    elif ti is str:
        if isinstance(obj, dict):
            try:
                return obj[i]
            except KeyError:
                raise _missing_field(obj, i)
        if isinstance(obj, _ARRAYS):
            return field(obj, i)
    elif ti is range:
        if i.step != 1:
            raise ConchError("ValueError", "a slice needs a range with step 1")
        return slice_(obj, i.start, i.stop)
    elif ti is bool:
        pass
    if obj is None:
        raise _type_error("cannot index Null", "use ?. or default() for values that may be null")
    raise _type_error(f"cannot index {type_of(obj)} with {type_of(i)}")


def slice_(obj: Any, start: Any, stop: Any, inclusive: bool = False) -> Any:
    for bound in (start, stop):
        if bound is not None and type(bound) is not int:
            raise _type_error(f"slice bounds must be Int, got {type_of(bound)}")
    if inclusive and stop is not None:
        stop = None if stop == -1 else stop + 1
    to = type(obj)
    if to is list or to is str or to is tuple:
        return obj[start:stop]
    if to is range:
        return list(obj[start:stop])
    if to is LazyList:
        if (start is None or start >= 0) and stop is not None and stop >= 0:
            return list(itertools.islice(obj, start, stop))
        return obj.materialize()[start:stop]
    raise _type_error(f"cannot slice {type_of(obj)}", "Arrays and Strings can be sliced: x[1..3]")


def _out_of_range(i: int, n: int, kind: str) -> ConchError:
    return ConchError(
        "IndexError",
        f"index {i} is out of range for {kind} of length {n}",
        hint=f"valid indexes are 0 to {n - 1}, or -{n} to -1 from the end" if n else f"the {kind} is empty",
    )


_REGEX_CACHE: dict[str, re.Pattern[str]] = {}


def _regex(pattern: str) -> re.Pattern[str]:
    compiled = _REGEX_CACHE.get(pattern)
    if compiled is not None:
        return compiled
    import re  # on first use: re (and functools.lru_cache) cost start-up time

    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ConchError("ValueError", f"invalid regex {pattern!r}: {exc}") from None
    if len(_REGEX_CACHE) >= 256:
        _REGEX_CACHE.clear()
    _REGEX_CACHE[pattern] = compiled
    return compiled


def rematch(text: Any, pattern: Any) -> bool:
    if type(text) is not str or type(pattern) is not str:
        raise _type_error(f"'=~' needs a String and a regex String, got {type_of(text)} and {type_of(pattern)}")
    return _regex(pattern).search(text) is not None


_ORDER = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def bool_operand(op: str, a: Any, b: Any = None) -> Any:
    """The failure of an arithmetic or ordering operator given a Bool (Python's True is 1)."""
    hint = "a Bool is not a number: convert it explicitly with int(b) or if b { 1 } else { 0 }"
    if op in _ORDER:
        raise _type_error(f"cannot compare {type_of(a)} with {type_of(b)} using '{op}'", hint)
    if op == "unary -":
        raise _type_error(f"cannot apply unary '-' to {type_of(a)}", hint)
    raise _type_error(f"cannot apply '{op}' to {type_of(a)} and {type_of(b)}", hint)


def guard_compare(a: Any, b: Any, op: str) -> bool:
    """An ordering test inside a match guard: values of incompatible types do not match."""
    if a is True or a is False or b is True or b is False:
        return False
    try:
        return bool(_ORDER[op](a, b))
    except TypeError:
        return False


def make_range(start: Any, stop: Any, inclusive: bool) -> range:
    if type(start) is not int or type(stop) is not int:
        bad = start if type(start) is not int else stop
        raise _type_error(f"range bounds must be Int, got {type_of(bad)}", "use range(a, b, step) for steps")
    return range(start, stop + 1 if inclusive else stop)


def in_range(v: Any, lo: Any, hi: Any, inclusive: bool) -> bool:
    if type(v) is not int and type(v) is not float:
        return False
    return bool(lo <= v <= hi) if inclusive else bool(lo <= v < hi)


def as_array(v: Any) -> list[Any] | None:
    if type(v) is list:
        return v
    if isinstance(v, _ARRAYS):
        return values.as_list(v)
    return None


def is_record(v: Any) -> bool:
    return isinstance(v, dict)


def pattern_eq(v: Any, lit: Any) -> bool:
    if lit is None or lit is True or lit is False:
        return v is lit
    if type(v) is bool:
        return False
    return bool(v == lit)


def throw(v: Any) -> ConchError:
    if type(v) is ErrorValue:
        err = ConchError(v.get("kind", "UserError"), str(v.get("message", "")), hint=v.get("hint"), value=v.get("value"))
        err.line, err.column = v.get("line"), v.get("column")
        return err
    if type(v) is str:
        return ConchError("UserError", v)
    if isinstance(v, dict) and isinstance(v.get("message"), str):
        return ConchError("UserError", v["message"], value=v)
    return ConchError("UserError", values.render(v), value=v)


def no_match(v: Any) -> ConchError:
    return ConchError("ValueError", f"no pattern matches {values.render(v)[:80]}")


def pipe_call(fn: Any, value: Any) -> Any:
    if callable(fn):
        return fn(value)
    raise _type_error(f"a pipeline stage must be a function, got {type_of(fn)}",
                      "write value | f, value | f(args), value | fn(x) => ... or value | .field")


HELPERS: dict[str, Any] = {
    "$add": add,
    "$eq": eq,
    "$ne": ne,
    "$in": contains,
    "$notin": not_contains,
    "$truth": truth,
    "$field": field,
    "$ofield": opt_field,
    "$index": index,
    "$slice": slice_,
    "$rematch": rematch,
    "$range": make_range,
    "$gcmp": guard_compare,
    "$boolop": bool_operand,
    "$inrange": in_range,
    "$asarray": as_array,
    "$isrecord": is_record,
    "$peq": pattern_eq,
    "$throw": throw,
    "$nomatch": no_match,
    "$pipe": pipe_call,
    "$render": values.render,
    "$len": len,
    "$Exception": Exception,
    "$ConchError": ConchError,
}
