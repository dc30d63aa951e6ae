"""The interactive shell: ``conch`` with no arguments.

One :class:`conch.lang.Session` keeps bindings across inputs. Input continues on the next
line while brackets or a string are open or the line ends with ``|`` or another binary
operator; Esc-Enter always inserts a newline. Tab completes builtins, variables, keywords and,
after ``rec.``, the keys of a bound Record (or the columns of a bound Table).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.lexers import PygmentsLexer
from rich.console import Console

from conch.cli.render import print_value
from conch.lang.builtins.registry import Builtin, all_builtins, lookup
from conch.lang.context import Context
from conch.lang.errors import ConchError, from_python
from conch.lang.highlight import CONSTANTS, KEYWORDS, ConchLexer

PROMPT = "conch> "
CONTINUATION = "  ...> "

COMMANDS = {
    ":help": "`:help` lists the builtins, `:help NAME` shows one (signature, examples)",
    ":quit": "leave the shell (also :q, :exit, Ctrl-D)",
}

_OPERATOR_END = re.compile(
    r"(\|\||&&|=>|==|!=|<=|>=|=~|\*\*|//|[|+\-*/%=<>,]|\b(?:and|or|not|in))$"
)
# `rec.nested.na` -> ("rec.nested.", "na"); `ma` -> ("", "ma")
_WORD_BEFORE = re.compile(r"((?:[A-Za-z_]\w*\??\.)*)(\w*)$")


def is_complete(text: str) -> bool:
    """Whether ``text`` is a whole input, or the user is still typing (open bracket or
    string, or a trailing ``|`` or binary operator)."""
    depth = 0
    i = 0
    n = len(text)
    code_end = 0  # index after the last character that is not a comment or space
    while i < n:
        ch = text[i]
        if ch == "#":
            while i < n and text[i] != "\n":
                i += 1
            continue
        # a triple-quoted string or a raw one ('...') ends at the first closing quote(s)
        closer = '"""' if text.startswith('"""', i) else "'" if ch == "'" else None
        if closer is not None:
            end = text.find(closer, i + len(closer))
            if end < 0:
                return False
            i = code_end = end + len(closer)
            continue
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    i += 1
                elif text[i] == "\n":
                    break
                i += 1
            if i >= n:
                return False
            i += 1
            code_end = i
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if not ch.isspace():
            code_end = i + 1
        i += 1
    if depth > 0:
        return False
    tail = text[:code_end].rstrip()
    return not _OPERATOR_END.search(tail)


class ConchCompleter(Completer):
    """Builtins, variables and keywords; ``name.`` completes a bound Record's keys."""

    def __init__(self, repl: Repl) -> None:
        self.repl = repl

    def get_completions(
        self, document: Document, complete_event: CompleteEvent
    ) -> Iterator[Completion]:
        before = document.text_before_cursor
        match = _WORD_BEFORE.search(before)
        if match is None:
            return
        path, prefix = match.group(1), match.group(2)
        if path:
            start = match.start()
            if start > 0 and before[start - 1] in ".)]":
                return  # a field of a computed value: nothing known to complete
            yield from self._fields(path.rstrip(".").rstrip("?"), prefix)
            return
        if not prefix:
            return
        seen: set[str] = set()
        for name in self._names():
            if name.startswith(prefix) and name not in seen:
                seen.add(name)
                yield Completion(name, start_position=-len(prefix), display_meta=self._meta(name))

    def _names(self) -> Iterable[str]:
        yield from sorted(self.repl.variables())
        yield from sorted(KEYWORDS + CONSTANTS)
        yield from sorted(self.repl.builtin_names())

    def _meta(self, name: str) -> str:
        if name in self.repl.variables():
            return "variable"
        if name in KEYWORDS or name in CONSTANTS:
            return "keyword"
        b = lookup(name)
        return b.category if b is not None else ""

    def _fields(self, path: str, word: str) -> Iterator[Completion]:
        parts = re.split(r"\??\.", path)
        value: Any = self.repl.variables().get(parts[0])
        for part in parts[1:]:
            value = value.get(part) if isinstance(value, dict) else None
        keys: list[str] = []
        if isinstance(value, dict):
            keys = [str(k) for k in value]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            keys = [str(k) for k in value[0]]  # a Table: `.col` projects a column
        for key in keys:
            if key.startswith(word) and key.isidentifier():
                yield Completion(key, start_position=-len(word), display_meta="field")


def help_text(name: str | None) -> str:
    """The text of ``:help`` (all builtins by category) or ``:help NAME``."""
    if not name:
        lines = ["Commands:"]
        lines += [f"  {cmd:<8} {text}" for cmd, text in COMMANDS.items()]
        lines.append("")
        lines.append("Builtins (`:help NAME` for one):")
        by_cat: dict[str, list[str]] = {}
        for b in all_builtins():
            by_cat.setdefault(b.category, []).append(b.name)
            for member in b.overloads[1:]:
                by_cat.setdefault(member.category, []).append(b.name)
        for cat in sorted(by_cat):
            lines.append(f"  {cat}: {', '.join(sorted(set(by_cat[cat])))}")
        return "\n".join(lines)
    found = lookup(name)
    if found is None:
        from conch.lang.errors import did_you_mean

        hint = did_you_mean(name, (x.name for x in all_builtins()))
        return f"no builtin named {name!r}" + (f"; {hint}" if hint else "")
    return "\n\n".join(_describe(m) for m in (found.overloads or [found]))


def _describe(b: Builtin) -> str:
    from conch.lang import values

    lines = [b.signature, f"  {b.description}", f"  category: {b.category}, effect: {b.effect}"]
    if b.aliases:
        lines.append(f"  aliases: {', '.join(b.aliases)}")
    if b.examples:
        lines.append("  examples:")
        for ex in b.examples:
            if ex.has_result:
                shown = values.render(ex.result)
                result = shown if type(ex.result) is not str else repr(ex.result)
            else:
                result = f"<{ex.type}>"
            lines.append(f"    {ex.code}")
            lines.append(f"      --> {result}")
    return "\n".join(lines)


class Repl:
    def __init__(
        self,
        console: Console | None = None,
        history: History | None = None,
        context: Context | None = None,
    ) -> None:
        from conch.lang import Session

        self.console = console or Console()
        self.history = history or InMemoryHistory()
        if context is None:
            from conch.host import shell_host

            context = Context(host=shell_host())
        self.session = Session(context=context)
        self._builtins: list[str] | None = None

    # -- state for completion -----------------------------------------------------------------
    def variables(self) -> dict[str, Any]:
        found = getattr(self.session, "variables", None)
        if callable(found):
            found = found()
        return dict(found) if isinstance(found, dict) else {}

    def builtin_names(self) -> list[str]:
        if self._builtins is None:
            from conch.lang.builtins.registry import REGISTRY

            all_builtins()
            self._builtins = sorted(REGISTRY)
        return self._builtins

    # -- one input ---------------------------------------------------------------------------
    def execute(self, text: str) -> bool:
        """Run one input; False when the user asked to leave."""
        stripped = text.strip()
        if not stripped:
            return True
        if stripped.startswith(":"):
            return self._command(stripped)
        try:
            value = self.session.run(text)
            if value is not None:
                print_value(value, self.console)
        except ConchError as err:
            self._error(err, text)
        except KeyboardInterrupt:
            self.console.print("interrupted", style="yellow")
        except RecursionError as exc:
            self._error(from_python(exc), text)
        return True

    def _error(self, err: ConchError, source: str) -> None:
        self.console.print(err.render(source), style="red", markup=False, highlight=False)

    def _command(self, text: str) -> bool:
        cmd, _, arg = text.partition(" ")
        if cmd in (":quit", ":q", ":exit"):
            return False
        if cmd in (":help", ":h", ":?"):
            self.console.print(help_text(arg.strip() or None), markup=False, highlight=False)
            return True
        self.console.print(
            f"unknown command {cmd}; try :help or :quit", style="yellow", markup=False
        )
        return True

    # -- the loop ----------------------------------------------------------------------------
    def key_bindings(self) -> KeyBindings:
        kb = KeyBindings()

        @kb.add("enter")
        def _enter(event: KeyPressEvent) -> None:
            buf = event.current_buffer
            if buf.complete_state is not None and buf.complete_state.current_completion:
                buf.apply_completion(buf.complete_state.current_completion)
                return
            if is_complete(buf.text):
                buf.validate_and_handle()
            else:
                buf.insert_text("\n")

        @kb.add("escape", "enter")
        def _newline(event: KeyPressEvent) -> None:
            event.current_buffer.insert_text("\n")

        return kb

    def prompt_session(self, **kwargs: Any) -> PromptSession[str]:
        return PromptSession(
            message=PROMPT,
            multiline=True,
            prompt_continuation=lambda width, line, soft: CONTINUATION,
            history=self.history,
            lexer=PygmentsLexer(ConchLexer),
            completer=ConchCompleter(self),
            complete_while_typing=False,
            key_bindings=self.key_bindings(),
            enable_history_search=False,
            **kwargs,
        )

    def loop(self, **kwargs: Any) -> int:
        session = self.prompt_session(**kwargs)
        while True:
            try:
                text = session.prompt()
            except KeyboardInterrupt:
                continue
            except EOFError:
                return 0
            if not self.execute(text):
                return 0


def history_path(config: str | None = None) -> Path:
    from conch.config import load_settings

    settings = load_settings(config)
    return settings.data_dir / "history"


def run_repl(config: str | None = None) -> int:
    path = history_path(config)
    history: History
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        history = FileHistory(str(path))
    except OSError:
        history = InMemoryHistory()
    repl = Repl(history=history)
    from conch import __version__

    repl.console.print(
        f"conch {__version__} - :help for help, :quit to leave", style="dim", highlight=False
    )
    return repl.loop()
