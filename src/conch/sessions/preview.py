"""A short text showing what a saved binding holds, read from its saved document alone.

The studio's variables panel shows each binding of a session with a preview. It is made
here, from the document the last completed run saved (``conch.lang.snapshot`` describes the
format), rather than by evaluating the name in the session: reading a document runs nothing,
so a preview cannot resume a paused session, count as a run, move its expiry, or force a
lazy value (which could run effects). What it shows is exactly what a resume would bring back.

The text is conch's literal syntax, cut at ``max_chars`` with ``…``: ``42``, ``"text"``,
``[1, 2, 3]``, ``{name: "a", size: 2}``, a function's source, ``range(0, 10)``. The walk stops
once the budget is spent, so a large value costs its parsing, not its rendering.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

PREVIEW_CHARS = 160
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Full(Exception):
    """The budget is spent: stop walking."""


class _Out:
    def __init__(self, limit: int) -> None:
        self.parts: list[str] = []
        self.left = limit
        self.cut = False

    def add(self, text: str) -> None:
        if len(text) > self.left:
            self.parts.append(text[: max(self.left, 0)])
            self.cut = True
            raise _Full
        self.parts.append(text)
        self.left -= len(text)


def _oneline(src: str) -> str:
    return " ".join(src.split())


def _tag(value: dict[str, Any], fns: list[dict[str, Any]]) -> str:
    (key, inner), = value.items()
    if key == "$int":
        return str(inner)
    if key == "$float":
        return {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}.get(str(inner), str(inner))
    if key == "$range":
        start, stop, step = inner
        return f"range({start}, {stop})" if step == 1 else f"range({start}, {stop}, {step})"
    if key == "$error":
        fields = inner if isinstance(inner, dict) else {}
        return f"Error({json.dumps(str(fields.get('message', '')), ensure_ascii=False)})"
    if key == "$str":
        raw = str(inner).encode("latin-1", "replace").decode("utf-8", "replace")
        return json.dumps(raw, ensure_ascii=False)
    if key == "$builtin":
        return str(inner)
    if key == "$fn":
        try:
            return _oneline(str(fns[int(inner)]["src"]))
        except (IndexError, KeyError, TypeError, ValueError):
            return "fn …"
    return key


def _walk(tree: Any, path: tuple[Any, ...], tags: set[tuple[Any, ...]], fns: list[dict[str, Any]],
          out: _Out) -> None:  # fmt: skip
    if path in tags and isinstance(tree, dict) and len(tree) == 1:
        out.add(_tag(tree, fns))
    elif tree is None:
        out.add("null")
    elif tree is True or tree is False:
        out.add("true" if tree else "false")
    elif isinstance(tree, int | float):
        out.add(json.dumps(tree))
    elif isinstance(tree, str):
        out.add(json.dumps(tree, ensure_ascii=False))
    elif isinstance(tree, list):
        out.add("[")
        for i, item in enumerate(tree):
            if i:
                out.add(", ")
            _walk(item, (*path, i), tags, fns, out)
        out.add("]")
    elif isinstance(tree, dict):
        out.add("{")
        for i, (k, v) in enumerate(tree.items()):
            if i:
                out.add(", ")
            out.add((k if _IDENT.fullmatch(k) else json.dumps(k, ensure_ascii=False)) + ": ")
            _walk(v, (*path, k), tags, fns, out)
        out.add("}")
    else:
        out.add(repr(tree))


def preview(doc: dict[str, Any], max_chars: int = PREVIEW_CHARS) -> dict[str, Any]:
    """``{preview, length}`` of a saved binding's document: the value as conch literal text
    (at most ``max_chars`` characters, ``…`` ending a cut one), and its number of elements
    (an Array's or Table's items, a Record's fields, a String's characters; None for other
    types)."""
    value = doc.get("value") if isinstance(doc, dict) else None
    if not isinstance(value, dict) or "data" not in value:
        return {"preview": None, "length": None}
    data = value["data"]
    tags = {tuple(p[1:]) for p in value.get("tags") or [] if p and p[0] == "data"}
    fns = value.get("fns") or []
    out = _Out(max_chars)
    with contextlib.suppress(_Full):
        _walk(data, (), tags, fns, out)
    text = "".join(out.parts) + ("…" if out.cut else "")
    countable = isinstance(data, list | str) or (isinstance(data, dict) and () not in tags)
    length = len(data) if countable else None
    return {"preview": text, "length": length}
