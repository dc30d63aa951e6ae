"""A session's bindings as documents, in the sandbox worker: the one place the worker meets
the language's API for saving and restoring a :class:`conch.lang.Session`.

The worker of a session keeps one ``Session`` for as long as it is bound. Around each run it
takes a mark, and after it asks which bindings the run changed; it sends their documents
(``{name, type, mutable, kind, value}``, JSON) back in the run's ``done`` frame for the server
to save, and names those that cannot be saved (``[{name, reason}]``). When a session is
resumed, the documents saved last come back and are restored into a fresh ``Session``.

Making a document from a conch value, and a value from a document, is the language's job
(``Session.mark``, ``changed_since``, ``export``, ``restore``). Where the language offers that
API it is used as it is. Where it does not (an older language module), this adapter saves
what is plain data (Null, Bool, finite Float, Int within ±(2^53 − 1), String, and Arrays and
Records of them), in the very document format the language uses for plain data, and names
everything else as unsaved; so documents saved by either read back in both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import orjson

from conch.lang import Session, values

ENCODING = 1
_MAX_EXACT = 2**53 - 1
_NATIVE = all(
    hasattr(Session, name) for name in ("mark", "changed_since", "export", "restore")
)


class Bindings:
    """The bindings of one session's ``Session`` as documents (see the module doc)."""

    def __init__(self, session: Session | None = None) -> None:
        # Any: the saving API is the language's newer one, absent from older modules
        self.session: Any = session if session is not None else Session()
        self.native = _NATIVE

    def mark(self) -> Any:
        """What the bindings hold now, for :meth:`changes` after a run."""
        if self.native:
            return self.session.mark()
        ns = self.session.namespace
        return {name: ns.get(b.pyname) for name, b in self.session.bindings.items()}

    def changes(self, mark: Any) -> tuple[list[str], list[str]]:
        """``(changed, removed)``: the bindings made or given a new value since ``mark``."""
        if self.native:
            found = self.session.changed_since(mark)
            return list(found.changed), list(found.removed)
        ns = self.session.namespace
        changed = [
            name for name, b in self.session.bindings.items()
            if name not in mark or mark[name] is not ns.get(b.pyname)
        ]  # fmt: skip
        return changed, [name for name in mark if name not in self.session.bindings]

    def export(
        self, names: Iterable[str], *, max_bytes: int | None = None
    ) -> tuple[list[bytes], list[dict[str, str]]]:
        """The documents of ``names`` as JSON bytes, and ``[{name, reason}]`` for those that
        cannot be saved."""
        names = list(names)
        if self.native:
            docs, named = self.session.export(names, max_bytes=max_bytes, raw=True)
            return [bytes(d) for d in docs], list(named)
        out: list[bytes] = []
        unsaved: list[dict[str, str]] = []
        ns = self.session.namespace
        for name in names:
            b = self.session.bindings.get(name)
            if b is None or b.pyname not in ns:
                unsaved.append({"name": name, "reason": "the session has no such binding"})
                continue
            value = ns[b.pyname]
            why = _not_plain(value)
            if why is not None:
                unsaved.append({"name": name, "reason": why})
                continue
            kind = "fn" if b.is_fn else ("let mut" if b.mutable else "let")
            doc = orjson.dumps({
                "name": name, "type": values.type_of(value), "mutable": b.mutable,
                "kind": kind, "value": {"conch": ENCODING, "data": value},
            })  # fmt: skip
            if max_bytes is not None and len(doc) > max_bytes:
                unsaved.append({
                    "name": name,
                    "reason": f"its value takes {len(doc)} bytes, over the {max_bytes} a "
                              "binding may take",
                })  # fmt: skip
                continue
            out.append(doc)
        return out, unsaved

    def restore(self, docs: list[Any]) -> list[dict[str, str]]:
        """Bring back the bindings of ``docs``; ``[{name, reason}]`` for those that could not
        be (the others are restored)."""
        if self.native:
            return list(self.session.restore(docs))
        from conch.lang.emit import Binding, Func

        damaged: list[dict[str, str]] = []
        used = {b.pyname for b in self.session.bindings.values()}
        for raw in docs:
            doc = orjson.loads(raw) if isinstance(raw, bytes | str) else raw
            name = doc.get("name") if isinstance(doc, dict) else None
            if not isinstance(name, str) or not name.isidentifier() or "$" in name:
                damaged.append({"name": str(name), "reason": "not a binding document"})
                continue
            value = doc.get("value")
            kind = doc.get("kind", "let mut" if doc.get("mutable") else "let")
            if (not isinstance(value, dict) or value.get("conch") != ENCODING
                    or "data" not in value or set(value) - {"conch", "data"}
                    or kind not in ("let", "let mut")):
                damaged.append({
                    "name": name,
                    "reason": "saved in a form this version of conch cannot read (only plain "
                              "data)",
                })  # fmt: skip
                continue
            old = self.session.bindings.get(name)
            pyname = old.pyname if old is not None else name
            n = 2
            while old is None and pyname in used:
                pyname, n = f"{name}${n}", n + 1
            used.add(pyname)
            self.session.namespace[pyname] = value["data"]
            self.session.bindings[name] = Binding(pyname, kind == "let mut", False, Func(None), True)
        return damaged

    def summary(self) -> list[dict[str, str]]:
        """``[{name, type}]`` of the bindings, in the order they were made."""
        ns = self.session.namespace
        return [
            {"name": name, "type": values.type_of(ns[b.pyname])}
            for name, b in self.session.bindings.items() if b.pyname in ns
        ]  # fmt: skip


def _not_plain(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` is not plain data this adapter can save (None: it is)."""
    if depth > 200:
        return "its value is nested too deeply to be saved"
    if value is None or value is True or value is False or type(value) is str:
        return None
    t = type(value)
    if t is int:
        return None if -_MAX_EXACT <= value <= _MAX_EXACT else "an Int this large cannot be saved"
    if t is float:
        return None if math.isfinite(value) else "a NaN or infinite Float cannot be saved"
    if t is list:
        for item in value:
            why = _not_plain(item, depth + 1)
            if why is not None:
                return why
        return None
    if t is dict:
        for key, item in value.items():
            if type(key) is not str:
                return "a Record with keys that are not Strings cannot be saved"
            why = _not_plain(item, depth + 1)
            if why is not None:
                return why
        return None
    if isinstance(value, values.LazyList):
        return "a lazy Array whose elements are not computed yet cannot be saved"
    return f"a {values.type_of(value)} cannot be saved by this version of conch (only plain data)"
