"""The typer app behind ``conch COMMAND`` (the fast path for ``-c`` and ``run`` is in
:mod:`conch.cli.run`).

Sub-commands written in other modules are attached by :data:`SUBCOMMANDS`. A module either
defines ``register(app: typer.Typer) -> None``, or exports one of the listed attributes: a
``typer.Typer`` (added as a group, or as a plain command when it holds a single command and
no callback) or a function (added as a command).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import typer

from conch.cli.run import run_file

# (command name, module, attributes tried in order). A module that is not written yet is
# skipped; an import error inside a module that exists is not hidden.
SUBCOMMANDS: list[tuple[str, str, tuple[str, ...]]] = [
    ("serve", "conch.cli.serve", ("app", "serve")),
    ("models", "conch.cli.models", ("app",)),
    ("up", "conch.cli.up", ("app", "up")),
    ("providers", "conch.cli.providers", ("app",)),
    ("marketplace", "conch.cli.marketplace", ("app",)),
    ("mcp", "conch.cli.marketplace", ("mcp_app",)),
    ("tasks", "conch.cli.orchestration", ("register",)),
    ("keys", "conch.cli.keys", ("app",)),
    ("sessions", "conch.cli.sessions", ("register",)),
    ("lsp", "conch.cli.lsp", ("lsp",)),
]


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="conch",
        help="conch: a typed, pipeline-oriented shell language.",
        no_args_is_help=False,
        add_completion=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    @app.callback(invoke_without_command=True)
    def root(
        ctx: typer.Context,
        config: str | None = typer.Option(
            None, "--config", help="Path of conch.toml (default: the user config directory)."
        ),
        version: bool = typer.Option(False, "--version", help="Print the version and exit."),
    ) -> None:
        if config:
            os.environ["CONCH_CONFIG"] = os.path.abspath(config)
        ctx.obj = {"config": config}
        if version:
            _print_version()
            raise typer.Exit()
        if ctx.invoked_subcommand is None:
            from conch.cli.repl import run_repl

            raise typer.Exit(run_repl(config))

    @app.command("run", help="Run a script; the arguments after it are bound to `args`.")
    def run_cmd(
        file: str = typer.Argument(..., help="The script (.conch) to run."),
        args: list[str] | None = typer.Argument(None, help="Arguments for the script."),
    ) -> None:
        raise typer.Exit(run_file(file, args or []))

    @app.command("version", help="Print the version.")
    def version_cmd() -> None:
        _print_version()

    config_app = typer.Typer(help="Show the configuration.", no_args_is_help=True)

    @config_app.command("show", help="Print the effective configuration (file < CONCH_* < flags).")
    def config_show(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        from conch.config import load_settings

        root_obj = ctx.find_root().obj or {}
        settings = load_settings(root_obj.get("config"))
        data = settings.public_dict()
        from conch.sandbox.probe import probe

        layers = {name: layer.to_dict() for name, layer in probe(settings).items()}
        if as_json:
            import json

            typer.echo(json.dumps({**data, "sandbox_layers": layers}, indent=2, sort_keys=True))
            return
        _print_config(data)
        _print_layers(settings.sandbox, layers)

    app.add_typer(config_app, name="config")
    _attach_subcommands(app)
    return app


def _print_version() -> None:
    import platform

    from conch import __version__

    print(f"conch {__version__} (Python {platform.python_version()})")


def _print_config(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", box=None)
    table.add_column("setting")
    table.add_column("value")
    for key in sorted(data):
        value = data[key]
        table.add_row(key, "" if value is None else str(value))
    Console().print(table)


def _print_layers(mode: str, layers: dict[str, dict[str, Any]]) -> None:
    """The sandbox's kernel layers as this machine would give them to a server started now."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"sandbox layers (sandbox = {mode!r})", show_header=True,
                  header_style="bold", box=None, title_justify="left")
    table.add_column("layer")
    table.add_column("state")
    table.add_column("detail")
    for name, layer in layers.items():
        table.add_row(name, "on" if layer["active"] else "missing", layer["detail"])
    Console().print(table)


def _attach_subcommands(app: typer.Typer) -> None:
    registered: set[str] = set()
    for name, module_name, attrs in SUBCOMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # not written yet
            raise
        register = getattr(module, "register", None)
        if callable(register):
            if module_name not in registered:
                registered.add(module_name)
                register(app)
            continue
        for attr in attrs:
            obj = getattr(module, attr, None)
            if obj is None:
                continue
            if isinstance(obj, typer.Typer):
                _add_typer(app, obj, name)
            elif callable(obj):
                app.command(name)(obj)
            break


def _add_typer(app: typer.Typer, sub: typer.Typer, name: str) -> None:
    single = (
        len(sub.registered_commands) == 1
        and not sub.registered_groups
        and sub.registered_callback is None
    )
    if single:
        command = sub.registered_commands[0]
        if command.callback is not None:
            app.command(name, help=command.help)(command.callback)
            return
    app.add_typer(sub, name=name)
