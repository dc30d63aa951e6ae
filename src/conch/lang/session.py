"""Sessions: bindings and functions that persist from one run to the next (the REPL, and the
agent server's sessions), and their state as data (saved, restored: conch.lang.snapshot).

A module of its own so that a one-off program (``conch -c``) does not load it.
"""

from __future__ import annotations

from collections import OrderedDict

from conch.lang import context as ctxmod
from conch.lang import runtime
from conch.lang.compiler import Compiler
from conch.lang.emit import Binding
from conch.lang.interpreter import Program, compiling, execute, has_limits
from conch.lang.parser import parse

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from conch.lang.context import Context
    from conch.lang.interpreter import StatementHook
    from conch.lang.tracking import Changes, Mark, Tracker


# Compiled inputs a session keeps (a REPL's history, an agent's repeated calls).
COMPILED_KEPT = 128


class Session:
    """REPL state: bindings and functions persist from one ``run`` to the next. Its state is
    data (docs/language.md, "Saving a session's state"): :meth:`mark` before a run and
    :meth:`changed_since` after it name the bindings the run changed, :meth:`export` encodes
    them as JSON documents and :meth:`restore` brings them back, here or in another process.
    Restore under the context the session's runs will have: its functions are compiled
    checked (steps, recursion) when that context has limits."""

    def __init__(self, context: Context | None = None) -> None:
        self.context = context
        self.namespace: dict[str, Any] = dict(runtime.HELPERS)
        self.bindings: dict[str, Binding] = {}
        self._tracker: Tracker | None = None
        # runs begun: a mark taken after changed_since, with no run between, reuses its look
        self.runs = 0
        # compiled inputs (_compile), least recently used first
        self._compiled: OrderedDict[Any, Any] = OrderedDict()

    # -- its state as data (conch.lang.snapshot) -------------------------------------------

    @property
    def tracker(self) -> Tracker:
        if self._tracker is None:
            from conch.lang.tracking import Tracker

            self._tracker = Tracker()
        return self._tracker

    def mark(self) -> Mark:
        """What the bindings hold now, for :meth:`changed_since` after a run."""
        return self.tracker.mark(self.namespace, self.bindings, self.runs)

    def changed_since(self, mark: Mark) -> Changes:
        """The bindings created or given a new value since ``mark`` (new ``let``s and ``fn``s,
        reassigned ``let mut``s, whoever assigned them, and values whose closures' captured
        ``let mut``s changed), and those removed: what a save after a run must write."""
        return self.tracker.changed_since(mark, self.namespace, self.bindings, self.runs)

    def export(self, names: Iterable[str] | None = None, *, max_bytes: int | None = None,
               raw: bool = False) -> tuple[list[Any], list[dict[str, str]]]:
        """The documents ``{name, type, mutable, kind, value}`` of the bindings ``names`` (all
        when None), and ``[{name, reason}]`` for those that cannot be saved (a lazy Array not
        yet computed, a host object, one over ``max_bytes``): an earlier saved value of one
        of those is stale and should be removed from the saved state. ``raw``: each document
        as its JSON bytes (what :meth:`restore` and a store take as they are)."""
        return self.tracker.export(self.namespace, self.bindings, None if names is None else list(names),
                                   max_bytes, raw)

    def restore(self, docs: Iterable[Any]) -> list[dict[str, str]]:
        """Bring back bindings from their documents (dicts, or JSON bytes as :meth:`export`
        with ``raw`` makes them), replacing any of the same name; ``[{name, reason}]`` for
        each that could not be (damaged, or from an unknown encoding), the others restored."""
        ctx = self.context or ctxmod.current()
        self.runs += 1
        return self.tracker.restore(self.namespace, self.bindings, list(docs), has_limits(ctx))

    def bindings_summary(self) -> list[dict[str, str]]:
        """``[{name, type}]`` of the bindings, in the order they were made."""
        tracker = self.tracker
        ns = self.namespace
        return [{"name": name, "type": tracker.type_of(name, ns[b.pyname])}
                for name, b in self.bindings.items() if b.pyname in ns]

    @property
    def variables(self) -> dict[str, Any]:
        """The session's variables by conch name (for completion)."""
        return {name: self.namespace[b.pyname] for name, b in self.bindings.items() if b.pyname in self.namespace}

    def run(self, source: str, on_statement: StatementHook | None = None) -> Any:
        self.runs += 1
        ctx = self.context or ctxmod.current()
        tree, compiled, rekinded = self._compile(source, has_limits(ctx))
        self.namespace.update(compiled.builtins)
        prog_texts: Callable[[], list[str]] | None = None
        if on_statement is not None:
            prog = Program.__new__(Program)
            prog.source, prog.tree, prog._texts = source, tree, None
            prog_texts = prog.statement_texts
        try:
            return execute(compiled, self.namespace, ctx, on_statement, prog_texts, session=True)
        finally:
            # Bindings made before a failure stay, as in any REPL.
            for name, b in compiled.top_bindings.items():
                if b.pyname in self.namespace:
                    self.bindings[name] = b
            if rekinded and self._tracker is not None:
                # its kind is saved with it: a binding of the same value is still a change
                self._tracker.dirty.update(n for n in rekinded if n in self.bindings)

    def _compile(self, source: str, checked: bool) -> tuple[Any, Any, list[str]]:
        """``source`` parsed and compiled against the session's bindings: ``(tree, compiled,
        rekinded)``. Kept by the source and what it compiled against (each binding's name,
        Python name and kind, and ``checked``: a session's bindings reach the compiler as
        globals, whatever scope made them), which is all a compilation reads:
        a warm session runs the same few inputs again and again, and parsing and compiling
        them was most of a small run's time (docs/benchmarks.md, "Sessions")."""
        bindings = self.bindings
        key = (source, checked, tuple((n, b.pyname, b.mutable, b.is_fn) for n, b in bindings.items()))
        hit = self._compiled.get(key)
        if hit is not None:
            self._compiled.move_to_end(key)
            return hit  # type: ignore[no-any-return]
        with compiling():
            tree = parse(source)
        # Compile against copies so a failed compilation leaves the session as it was.
        snapshot = {name: Binding(b.pyname, b.mutable, b.is_fn, b.func, True) for name, b in bindings.items()}
        compiler = Compiler(checked=checked, session_globals=snapshot, source=source)
        with compiling():
            compiled = compiler.compile_program(tree)
        entry = (tree, compiled, list(compiler.rekinded))
        self._compiled[key] = entry
        if len(self._compiled) > COMPILED_KEPT:
            self._compiled.popitem(last=False)
        return entry
