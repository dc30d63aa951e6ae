"""The house's rules, read from the code's own imports (every ``import``, lazy ones included):
rooms import only rooms below them, no two modules import each other in a loop, and no
module takes another module's private (underscore) names.

The layers, from the ground up (docs/architecture.md draws them):

    errors, config, process_role, db        the ground
    lang                                    the language: imports only itself and the ground's
                                            errors-free parts (it needs nothing of conch above)
    sandbox, lsp                            where programs run; the editor's analysis
    inference (api < models < engines < remote < serving < client), orchestration,
    sessions, keys                          domain rooms, no HTTP
    marketplace, host                       above the domains they use
    worker_process, mcp_server, migrations  entry points and assemblies
    web, cli                                the top
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# (importer prefix, prefixes it must never import)
FORBIDDEN: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("conch.lang", ("conch.orchestration", "conch.inference", "conch.web", "conch.sandbox",
                    "conch.sessions", "conch.keys", "conch.marketplace", "conch.db",
                    "conch.host", "conch.config", "conch.cli", "conch.mcp_server")),
    ("conch.sandbox", ("conch.orchestration", "conch.inference", "conch.web", "conch.host",
                       "conch.sessions", "conch.keys", "conch.marketplace", "conch.cli")),
    ("conch.inference.api", ("conch.inference.models", "conch.inference.engines",
                             "conch.inference.remote", "conch.inference.serving",
                             "conch.inference.client")),
    ("conch.inference.models", ("conch.inference.engines", "conch.inference.remote",
                                "conch.inference.serving", "conch.inference.client")),
    ("conch.inference.engines", ("conch.inference.remote", "conch.inference.serving",
                                 "conch.inference.client")),
    ("conch.inference.remote", ("conch.inference.serving", "conch.inference.client")),
    ("conch.inference.serving", ("conch.inference.client",)),
    ("conch.orchestration", ("conch.host", "conch.worker_process")),
)
DOMAINS = ("conch.lang", "conch.sandbox", "conch.inference", "conch.orchestration",
           "conch.sessions", "conch.keys", "conch.marketplace", "conch.host", "conch.lsp")
ABOVE_DOMAINS = ("conch.web", "conch.cli")


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(modules: dict[str, Path]) -> list[tuple[str, str, str | None]]:
    """(importer, imported module, name taken or None) for every import of a conch module."""
    found: list[tuple[str, str, str | None]] = []
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(mod, a.name, None) for a in node.names if a.name.startswith("conch")]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith("conch"):
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in modules:
                        found.append((mod, sub, None))
                    else:
                        found.append((mod, target, alias.name))
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_no_room_imports_a_room_above_it() -> None:
    wrong = []
    for importer, imported, _name in _imports(_modules()):
        for low, highs in FORBIDDEN:
            if _under(importer, low) and any(_under(imported, h) for h in highs):
                wrong.append(f"{importer} -> {imported}")
        if any(_under(importer, d) for d in DOMAINS) and any(
            _under(imported, w) for w in ABOVE_DOMAINS
        ):
            wrong.append(f"{importer} -> {imported}")
    assert not wrong, "imports that run back up:\n" + "\n".join(sorted(set(wrong)))


def test_no_module_takes_a_private_name_of_another() -> None:
    wrong = [
        f"{importer} takes {imported}.{name}"
        for importer, imported, name in _imports(_modules())
        if name and name.startswith("_") and not name.startswith("__") and imported != importer
    ]
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_no_import_circles() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for importer, imported, _name in _imports(modules):
        target = imported
        while target not in modules and "." in target:
            target = target.rpartition(".")[0]
        # A package's face (its __init__) handing on its own modules is not a circle.
        if target in modules and target != importer and not _under(importer, target):
            graph[importer].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not circles, "modules that import each other in a loop:\n" + "\n".join(
        " <-> ".join(c) for c in circles
    )
