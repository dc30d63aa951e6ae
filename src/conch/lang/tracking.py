"""What a session's run changed of its bindings, and their saving and restoring: the
session's side of :mod:`conch.lang.snapshot` (which encodes and decodes one value).
"""

from __future__ import annotations

import gc
import itertools
import operator
from types import CellType
from typing import Any

import orjson

from conch.lang.emit import Binding, Func
from conch.lang.record import record
from conch.lang.snapshot import (
    VERSION,
    Cells,
    Damaged,
    Restorer,
    Unsaved,
    cells_in,
    encode,
    plain_json,
)
from conch.lang.values import LazyList, type_of

# What a saved binding may be declared as
_KINDS = ("let", "let mut", "fn")
# An empty cell's contents
_MISSING: Any = object()


@record(eq=False)
class Mark:
    """What a session's bindings held at one moment (:meth:`Tracker.mark`): their names and
    values, in order, and the contents of the cells their closures share."""

    names: list[str]
    values: tuple[Any, ...]
    cells: list[tuple[str, CellType, Any]]


@record
class Changes:
    """The bindings a run created or replaced, and those it removed."""

    changed: list[str]
    removed: list[str]


def _contents(cell: CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _MISSING


class Tracker:
    """What a session keeps for saving its state: its cells' IDs, the cells each binding's
    value reaches, the types of its values, and the bindings left unsaved for a lazy Array
    (saved once it has been computed).

    Telling what a run changed is an identity test per binding (conch values are immutable:
    a binding changed iff it holds another object), made in C over the namespace: a run that
    changes one of 100 small bindings is marked, compared and saved in a few microseconds."""

    def __init__(self) -> None:
        self.cells = Cells()
        # pyname: the value whose cells are known (``with_cells``); every binding's, between
        # runs that are saved
        self.scanned: dict[str, Any] = {}
        self.verified: tuple[Any, ...] = (_MISSING, _MISSING)  # the values when all were last scanned
        self.last: tuple[int, tuple[Any, ...]] = (-1, ())  # the session's runs, and values then
        self.pending: set[str] = set()  # found changed by changed_since, not looked at since
        self.with_cells: dict[str, tuple[CellType, ...]] = {}  # name: the cells its value reaches
        self.types: dict[str, tuple[Any, str]] = {}
        self.lazy: dict[str, tuple[Any, list[LazyList]]] = {}
        self.dirty: set[str] = set()
        self._order: tuple[int, list[str], list[str], Any] = (-1, [], [], None)

    def order(self, bindings: dict[str, Binding]) -> tuple[list[str], list[str], Any]:
        """The bindings' names and Python names in order, and a function giving their values
        from a namespace as a tuple (in C). Bindings are only ever added: kept while as many."""
        n, names, pynames, values = self._order
        if n != len(bindings):
            names = list(bindings)
            pynames = [b.pyname for b in bindings.values()]
            # two more keys that are always there (helpers), so that it always gives a tuple
            values = operator.itemgetter(*pynames, "$add", "$eq")
            self._order = (len(bindings), names, pynames, values)
        return names, pynames, values

    @staticmethod
    def values(getter: Any, pynames: list[str], namespace: dict[str, Any]) -> tuple[Any, ...]:
        """The bindings' values in order (and two helpers after them: compare as equal)."""
        try:
            vals: tuple[Any, ...] = getter(namespace)
        except KeyError:  # a binding whose value is gone (never, from a run)
            return (*(namespace.get(p, _MISSING) for p in pynames), _MISSING, _MISSING)
        return vals

    def type_of(self, name: str, value: Any) -> str:
        known = self.types.get(name)
        if known is not None and known[0] is value:
            return known[1]
        kind = type_of(value)
        self.types[name] = (value, kind)
        return kind

    def note(self, name: str, pyname: str, value: Any, cells: tuple[CellType, ...]) -> None:
        self.scanned[pyname] = value
        if self.pending:
            self.pending.discard(name)
        if cells:
            self.with_cells[name] = cells
        elif self.with_cells:
            self.with_cells.pop(name, None)

    def mark(self, namespace: dict[str, Any], bindings: dict[str, Binding], runs: int) -> Mark:
        names, pynames, getter = self.order(bindings)
        last = self.last
        if last[0] == runs and len(last[1]) == len(names) + 2:
            # no run since changed_since looked: its values, and when every binding it found
            # changed has been saved (or found unsaveable) since, every binding's cells known
            now = last[1]
            if not self.pending:
                self.verified = now
                return Mark(names, now, self.watched())
        else:
            now = self.values(getter, pynames, namespace)
        # every binding's cells known: those whose value is not the one last verified are
        # looked at (found in C), and scanned if not yet
        verified = self.verified
        if len(verified) != len(now):
            verified = verified[:-2] + (_MISSING,) * (len(now) - len(verified)) + verified[-2:]
        scanned = self.scanned
        for i in itertools.compress(range(len(names)), map(operator.is_not, now, verified)):
            value = now[i]
            if scanned.get(pynames[i], _MISSING) is not value:
                self.note(names[i], pynames[i], value, cells_in(value))
        self.verified = now
        return Mark(names, now, self.watched())

    def watched(self) -> list[tuple[str, CellType, Any]]:
        """Each cell a binding's closures share, and its contents now."""
        return [(name, cell, _contents(cell)) for name, reached in self.with_cells.items() for cell in reached]

    def changed_since(self, mark: Mark, namespace: dict[str, Any], bindings: dict[str, Binding],
                      runs: int) -> Changes:
        names, pynames, getter = self.order(bindings)
        now = self.values(getter, pynames, namespace)
        self.last = (runs, now)
        n = len(mark.names)
        removed: list[str] = []
        if names is mark.names or names[:n] == mark.names:  # bindings are only added, at the end
            changed = list(itertools.compress(names, map(operator.is_not, now, mark.values)))
            if len(names) > n:
                changed += [name for name in names[n:] if name not in changed]
        else:
            before = dict(zip(mark.names, mark.values, strict=False))
            changed = [name for name, v in zip(names, now, strict=False) if before.get(name, _MISSING) is not v]
            removed = [name for name in mark.names if name not in bindings]
        extra = [name for name, cell, contents in mark.cells if _contents(cell) is not contents]
        if self.lazy:
            for name, (value, lazies) in self.lazy.items():
                b = bindings.get(name)
                if b is not None and namespace.get(b.pyname) is value and all(x._cache is not None for x in lazies):
                    extra.append(name)
        if self.dirty:
            extra += self.dirty
        if extra:
            wanted = set(changed).union(extra)
            changed = [name for name in names if name in wanted]
        self.pending = set(changed)
        return Changes(changed, removed)

    def export(self, namespace: dict[str, Any], bindings: dict[str, Binding], names: list[str] | None,
               max_bytes: int | None, raw: bool) -> tuple[list[Any], list[dict[str, str]]]:
        docs: list[Any] = []
        unsaved: list[dict[str, str]] = []
        for name in (list(bindings) if names is None else names):
            b = bindings.get(name)
            value = namespace.get(b.pyname, _MISSING) if b is not None else _MISSING
            if b is None or value is _MISSING:
                unsaved.append({"name": name, "reason": "the session has no such binding"})
                continue
            data = plain_json(value)
            if data is not None and (max_bytes is None or len(data) + 20 <= max_bytes):
                enc: dict[str, Any] = {"conch": VERSION, "data": value}  # plain data: itself
                self.note(name, b.pyname, value, ())
            else:
                try:
                    encoded = encode(value, name, self.cells, max_bytes)
                except Unsaved as exc:
                    unsaved.append({"name": name, "reason": exc.reason})
                    self.note(name, b.pyname, value, cells_in(value))
                    if exc.lazy:
                        self.lazy[name] = (value, exc.lazy)
                    continue
                enc = encoded.value
                self.note(name, b.pyname, value, encoded.cells)
            if self.lazy:
                self.lazy.pop(name, None)
            if self.dirty:
                self.dirty.discard(name)
            head = {"name": name, "type": self.type_of(name, value), "mutable": b.mutable,
                    "kind": "fn" if b.is_fn else ("let mut" if b.mutable else "let")}
            if not raw:
                head["value"] = enc
                docs.append(head)
            elif data is not None:
                head["value"] = orjson.Fragment(b'{"conch":%d,"data":%s}' % (VERSION, data))
                docs.append(orjson.dumps(head))
            else:
                head["value"] = enc
                docs.append(orjson.dumps(head))
        if self.cells.by_obj:
            self.cells.keep_only({id(c) for name, cells in self.with_cells.items() if name in bindings for c in cells})
        return docs, unsaved

    def restore(self, namespace: dict[str, Any], bindings: dict[str, Binding], docs: list[Any],
                checked: bool) -> list[dict[str, str]]:
        # Parsing makes no reference cycles for the collector to find, and its passes over
        # the many new objects of a resume would cost it a sixth of its time.
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._restore(namespace, bindings, docs, checked)
        finally:
            if enabled:
                gc.enable()

    def _restore(self, namespace: dict[str, Any], bindings: dict[str, Binding], docs: list[Any],
                 checked: bool) -> list[dict[str, str]]:
        damaged: list[tuple[int, dict[str, str]]] = []  # in the order of the documents
        parsed: list[tuple[int, str, dict[str, Any], Binding, Binding | None]] = []
        used = {b.pyname for b in bindings.values()}
        for i, raw in enumerate(docs):
            try:
                doc = orjson.loads(raw) if isinstance(raw, bytes | bytearray | memoryview | str) else raw
            except orjson.JSONDecodeError as exc:
                damaged.append((i, {"name": "?", "reason": f"not JSON: {exc}"}))
                continue
            if type(doc) is dict and doc is raw and type(doc.get("value")) is dict and doc["value"].get("tags"):
                # decoding replaces tags in place: the caller's document stays as it was
                doc = {**doc, "value": orjson.loads(orjson.dumps(doc["value"]))}
            name = doc.get("name") if type(doc) is dict else None
            if type(name) is not str or not name.isidentifier() or "$" in name:
                damaged.append((i, {"name": str(name) if name is not None else "?",
                                    "reason": "a binding document needs the name of a conch binding"}))
                continue
            kind = doc.get("kind", "let mut" if doc.get("mutable") else "let")
            if kind not in _KINDS or "value" not in doc:
                damaged.append((i, {"name": name,
                                    "reason": "a binding document needs a kind (let, let mut, fn) and a value"}))
                continue
            old = bindings.get(name)
            if old is not None:
                pyname = old.pyname
            else:
                pyname = name
                i = 2
                while pyname in used:
                    pyname = f"{name}${i}"
                    i += 1
                used.add(pyname)
            b = Binding(pyname, kind == "let mut", kind == "fn", Func(None), True)
            bindings[name] = b  # known to the functions compiled below, by name
            parsed.append((i, name, doc, b, old))
        restorer = Restorer(namespace, bindings, checked)
        for i, name, doc, b, old in parsed:
            try:
                value, cids = restorer.value(doc["value"])
            except Damaged as exc:
                damaged.append((i, {"name": name, "reason": exc.reason}))
                if old is not None:
                    bindings[name] = old
                else:
                    del bindings[name]
                continue
            namespace[b.pyname] = value
            reached = []
            for cid in cids:
                cell = restorer.cells[cid]
                reached.append(cell)
                if self.cells.by_obj.get(id(cell)) is None:
                    if cid in self.cells.by_id:
                        # the ID is another cell's in this session: this binding's next save
                        # gives the cell an ID of its own
                        self.cells.id_of(cell)
                        self.dirty.add(name)
                    else:
                        self.cells.add(cell, cid)
                elif self.cells.by_obj[id(cell)][1] != cid:
                    self.dirty.add(name)
            self.note(name, b.pyname, value, tuple(reached))
        damaged.sort(key=lambda d: d[0])
        return [d for _, d in damaged]
