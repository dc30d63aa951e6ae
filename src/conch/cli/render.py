"""Showing values to people: rich tables for Tables, readable text for everything else."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from conch.lang import values


def _cell(value: Any) -> Text:
    if value is None:
        return Text("null", style="dim")
    if value is True or value is False:
        return Text("true" if value else "false", style="magenta")
    if type(value) in (int, float):
        return Text(values.render(value), style="cyan")
    if type(value) is str:
        return Text(value)
    return Text(values.render(value), style="green")


def table_of(rows: list[dict[str, Any]]) -> Table:
    table = Table(show_header=True, header_style="bold", show_lines=False)
    table.add_column("#", style="dim", justify="right")
    first = rows[0]
    for key in first:
        numeric = all(type(r[key]) in (int, float) for r in rows)
        table.add_column(str(key), justify="right" if numeric else "left")
    for i, row in enumerate(rows):
        table.add_row(str(i), *(_cell(row[k]) for k in first))
    return table


def print_value(value: Any, console: Console | None = None) -> None:
    """Print a value for a person: a Table as a table, a String as is, others as JSON."""
    console = console or Console()
    if isinstance(value, values.LazyList | range):
        value = values.as_list(value)
    if values.type_of(value) == "Table":
        console.print(table_of(value))
        return
    if type(value) is str:
        console.print(value, markup=False, highlight=False, soft_wrap=True)
        return
    console.print(values.render_pretty(value), markup=False, highlight=True, soft_wrap=True)
