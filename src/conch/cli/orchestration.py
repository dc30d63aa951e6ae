"""``conch tasks``, ``conch threads`` and ``conch workflows``: talk to a running agent server (``conch serve``).

The server is ``--url`` (default ``http://<host>:<port>`` from the configuration) and the
configured ``api_key`` is sent as a bearer token. Every command takes ``--json``.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from conch.cli.remote import JsonOpt, UrlOpt, echo_json, request

API = "/api/v1/orchestration"

tasks_app = typer.Typer(help="Agent tasks on the agent server.", no_args_is_help=True)
workflows_app = typer.Typer(help="Workflows on the agent server.", no_args_is_help=True)
threads_app = typer.Typer(help="Threads of agent tasks on the agent server.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(tasks_app, name="tasks")
    app.add_typer(workflows_app, name="workflows")
    app.add_typer(threads_app, name="threads")


def _call(url: str | None, method: str, path: str, body: Any = None) -> Any:
    return request(url, method, path, timeout=60, json=body)[0]


def _print(data: Any, as_json: bool, columns: list[str]) -> None:
    if as_json:
        echo_json(data)
        return
    from rich.console import Console
    from rich.table import Table

    rows = data if isinstance(data, list) else [data]
    table = Table(show_header=True, header_style="bold", box=None)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*(_cell(row.get(col)) for col in columns))
    Console().print(table)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)[:80]
    return str(value)


def _print_with_steps(
    data: dict[str, Any], as_json: bool, columns: list[str], step_columns: list[str]
) -> None:
    """A task or a workflow, then (unless ``--json``, where they are in the JSON) its steps."""
    _print(data, as_json, columns)
    if not as_json and data["steps"]:
        _print(data["steps"], False, step_columns)


# -- tasks --------------------------------------------------------------------------------

TASK_COLUMNS = ["id", "status", "agent", "goal", "result", "duration_ms", "created_at"]
TASK_STEP_COLUMNS = ["index", "action", "args", "observation", "elapsed_ms"]


@tasks_app.command("create")
def tasks_create(
    goal: Annotated[str, typer.Argument(help="What the agent is asked to do.")],
    tool: Annotated[
        list[str] | None,
        typer.Option("--tool", help="A builtin the task may call (repeat for more; default: the agent's)."),
    ] = None,
    max_steps: Annotated[int | None, typer.Option("--max-steps", help="The step budget.")] = None,
    agent: Annotated[str | None, typer.Option("--agent", help="Run as this agent.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="The model (default: the agent's or the server's).")] = None,
    thread: Annotated[
        str | None, typer.Option("--thread", help="Continue (or start) this thread's conversation.")
    ] = None,
    protocol: Annotated[
        Literal["native", "json", "auto"] | None,
        typer.Option(
            "--protocol",
            help="Tool calls through the model API's tools (native) or as JSON actions (json); "
            "auto (the server's default): native when the model lists tools.",
        ),
    ] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="Wait until it finishes or waits for a person.")
    ] = True,
) -> None:
    """Create and start a task; by default wait for it and show its steps."""
    import time

    body: dict[str, Any] = {"goal": goal}
    for key, value in (
        ("tools", tool), ("max_steps", max_steps), ("agent", agent), ("model", model),
        ("thread_id", thread), ("protocol", protocol),
    ):  # fmt: skip
        if value is not None:
            body[key] = value
    task = _call(url, "POST", f"{API}/tasks", body)
    if wait:
        while task["status"] in ("pending", "running"):
            time.sleep(0.3)
            task = _call(url, "GET", f"{API}/tasks/{task['id']}")
    _print_task(task, as_json)
    if wait and task["status"] not in ("succeeded", "waiting"):
        raise typer.Exit(1)


@tasks_app.command("list")
def tasks_list(
    url: UrlOpt = None,
    as_json: JsonOpt = False,
    status: Annotated[str | None, typer.Option(help="Only tasks with this status.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (newest first).")] = 100,
) -> None:
    """List tasks, newest first."""
    query = f"?limit={limit}" + (f"&status={status}" if status else "")
    _print(_call(url, "GET", f"{API}/tasks{query}"), as_json, TASK_COLUMNS)


@tasks_app.command("show")
def tasks_show(task_id: str, url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """One task with its steps."""
    task = _call(url, "GET", f"{API}/tasks/{task_id}")
    _print_task(task, as_json)


def _print_task(task: dict[str, Any], as_json: bool) -> None:
    """A task with its steps, then (unless ``--json``) its error and the calls it waits on."""
    _print_with_steps(task, as_json, TASK_COLUMNS, TASK_STEP_COLUMNS)
    if not as_json and task.get("error"):
        typer.echo(f"error: {task['error'].get('kind')}: {task['error'].get('message')}")
    if not as_json:
        for call in task.get("pending") or []:
            typer.echo(
                f"waiting: {call['call_id']} {call['tool']}"
                f"({json.dumps(call['args'], ensure_ascii=False)}) [{call['effect']}]: "
                f"{call['reason']}"
            )


@tasks_app.command("cancel")
def tasks_cancel(task_id: str, url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """Cancel a pending, running or waiting task."""
    _print(_call(url, "POST", f"{API}/tasks/{task_id}/cancel"), as_json, TASK_COLUMNS)


CallIdOpt = Annotated[
    str | None,
    typer.Option("--call-id", help="Which pending call (when several are pending)."),
]
AllOpt = Annotated[
    bool, typer.Option("--all", help="Decide every pending call of the task the same way."),
]


def _decide(url: str | None, task_id: str, decision: str, body: dict[str, Any],
            call_id: str | None, every: bool) -> Any:
    """One decision (``call_id`` names the call when several wait), or with ``every`` the
    same decision for each call the task waits on, in the order they are pending."""
    if not every:
        return _call(url, "POST", f"{API}/tasks/{task_id}/{decision}",
                     {**body, **({"call_id": call_id} if call_id is not None else {})})
    if call_id is not None:
        typer.echo("error: --all decides every pending call; leave out --call-id", err=True)
        raise typer.Exit(2)
    task = _call(url, "GET", f"{API}/tasks/{task_id}")
    pending = [p["call_id"] for p in task.get("pending") or []]
    if not pending:
        typer.echo(f"error: task {task_id} waits on no call (status {task.get('status')})",
                   err=True)
        raise typer.Exit(1)
    for pending_id in pending:
        task = _call(url, "POST", f"{API}/tasks/{task_id}/{decision}",
                     {**body, "call_id": pending_id})
    return task


@tasks_app.command("approve")
def tasks_approve(
    task_id: str,
    args: Annotated[
        str | None,
        typer.Option("--args", help="Run the call with these arguments instead (JSON object)."),
    ] = None,
    call_id: CallIdOpt = None,
    every: AllOpt = False,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Approve the tool call a waiting task waits on (or, with --all, every one); the task
    goes on once nothing is pending."""
    body: dict[str, Any] = {}
    if args is not None:
        if every:
            typer.echo("error: --args edits one call; name it with --call-id, not --all", err=True)
            raise typer.Exit(2)
        try:
            body["args"] = json.loads(args)
        except ValueError as exc:
            typer.echo(f"error: --args: not JSON ({exc})", err=True)
            raise typer.Exit(2) from None
    _print(_decide(url, task_id, "approve", body, call_id, every), as_json, TASK_COLUMNS)


@tasks_app.command("reject")
def tasks_reject(
    task_id: str,
    message: Annotated[
        str | None,
        typer.Option("--message", help="What the model is told instead of the call's result."),
    ] = None,
    call_id: CallIdOpt = None,
    every: AllOpt = False,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Reject the tool call a waiting task waits on (or, with --all, every one); the task
    goes on without it."""
    body: dict[str, Any] = {}
    if message is not None:
        body["message"] = message
    _print(_decide(url, task_id, "reject", body, call_id, every), as_json, TASK_COLUMNS)


@tasks_app.command("fork")
def tasks_fork(
    task_id: str,
    checkpoint: Annotated[
        int,
        typer.Option("--checkpoint", help="Keep steps 0..N-1 of the task; the fork goes on from step N."),
    ],
    message: Annotated[
        str | None,
        typer.Option("--message", help="A user message added after the kept steps."),
    ] = None,
    tool_result: Annotated[
        str | None,
        typer.Option("--tool-result", help="Replaces the last kept step's tool result."),
    ] = None,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", help="The fork's step budget (kept steps count).")
    ] = None,
    thread: Annotated[
        str | None, typer.Option("--thread", help="Start this new thread with the fork.")
    ] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a new task from a checkpoint of a task (the original stays as it was)."""
    body: dict[str, Any] = {"checkpoint": checkpoint}
    for key, value in (
        ("message", message), ("tool_result", tool_result), ("max_steps", max_steps),
        ("thread_id", thread),
    ):  # fmt: skip
        if value is not None:
            body[key] = value
    task = _call(url, "POST", f"{API}/tasks/{task_id}/fork", body)
    _print(task, as_json, [*TASK_COLUMNS[:2], "forked_from", "fork_checkpoint", *TASK_COLUMNS[2:]])


# -- threads ------------------------------------------------------------------------------


@threads_app.command("show")
def threads_show(thread_id: str, url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """A thread's tasks, oldest first."""
    thread = _call(url, "GET", f"{API}/threads/{thread_id}")
    if as_json:
        echo_json(thread)
        return
    _print(thread["tasks"], False, TASK_COLUMNS)


# -- workflows ----------------------------------------------------------------------------

WF_COLUMNS = ["id", "name", "status", "created_at", "finished_at"]
STEP_COLUMNS = ["id", "status", "attempts", "result", "error"]


def _load_definition(path: Path) -> Any:
    text = path.read_text()
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        typer.echo(f"error: {path}: {exc}", err=True)
        raise typer.Exit(2)


@workflows_app.command("run")
def workflows_run(
    file: Annotated[
        Path,
        typer.Argument(help="Workflow definition (.toml or .json).", exists=True, dir_okay=False),
    ],
    url: UrlOpt = None,
    as_json: JsonOpt = False,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until it finishes.")] = True,
) -> None:
    """Create and start a workflow from a file; by default wait for it and show its steps."""
    import time

    wf = _call(url, "POST", f"{API}/workflows", _load_definition(file))
    if wait:
        while wf["status"] in ("pending", "running"):
            time.sleep(0.3)
            wf = _call(url, "GET", f"{API}/workflows/{wf['id']}")
    _print_with_steps(wf, as_json, WF_COLUMNS, STEP_COLUMNS)
    if wait and wf["status"] != "succeeded":
        raise typer.Exit(1)


@workflows_app.command("list")
def workflows_list(
    url: UrlOpt = None,
    as_json: JsonOpt = False,
    status: Annotated[str | None, typer.Option(help="Only workflows with this status.")] = None,
) -> None:
    """List workflows, newest first."""
    query = f"?status={status}" if status else ""
    _print(_call(url, "GET", f"{API}/workflows{query}"), as_json, WF_COLUMNS)


@workflows_app.command("show")
def workflows_show(workflow_id: str, url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """One workflow with every step."""
    wf = _call(url, "GET", f"{API}/workflows/{workflow_id}")
    _print_with_steps(wf, as_json, WF_COLUMNS, STEP_COLUMNS)


@workflows_app.command("cancel")
def workflows_cancel(workflow_id: str, url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """Cancel a running workflow (running steps stop, pending ones are skipped)."""
    _print(_call(url, "POST", f"{API}/workflows/{workflow_id}/cancel"), as_json, WF_COLUMNS)
