"""The ``agent`` builtin (category ``ai``): run an agent loop from conch code.

``agent({goal, tools, max_steps, model?})`` asks the model for one JSON action at a time
(:mod:`conch.orchestration.loop`), runs each tool call as a builtin call in the current run
(in the server that is the sandbox worker running the program, under the request's limits)
and returns ``{id, status, result, steps, error}``. In the server the run is recorded as an
orchestration task (``origin: "builtin"``), so it appears in ``GET /orchestration/tasks``: the
sandbox worker sends the record to the server, which writes it (a worker cannot open the
database).
Models are reached through the inference server's OpenAI-compatible API (``models_url``).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from typing import Any

from conch.lang.builtins.registry import Example, builtin, lookup
from conch.lang.builtins.types import Record
from conch.lang.context import current
from conch.lang.errors import ConchError
from conch.lang.values import render

_FIELDS = ("goal", "tools", "max_steps", "model", "agent")


def _spec(spec: dict[str, Any]) -> tuple[str, list[str], int, str | None]:
    extra = sorted(set(spec) - set(_FIELDS))
    if extra:
        raise ConchError(
            "ValueError",
            f"agent: unknown field {', '.join(extra)}",
            hint=f"fields: {', '.join(_FIELDS)}",
        )
    goal = spec.get("goal")
    if not isinstance(goal, str) or not goal:
        raise ConchError("TypeError", "agent: `goal` must be a non-empty String")
    tools = spec.get("tools")
    if tools is None:
        from conch.agents.registry import default_tools

        tools = default_tools()
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise ConchError("TypeError", "agent: `tools` must be an Array of builtin names")
    unknown = [t for t in tools if lookup(t) is None]
    if unknown:
        raise ConchError("NameError", f"agent: unknown tool {', '.join(map(repr, unknown))}")
    max_steps = spec.get("max_steps", 10)
    if type(max_steps) is not int or max_steps < 0:
        raise ConchError("TypeError", "agent: `max_steps` must be a non-negative Int")
    model = spec.get("model")
    if model is not None and not isinstance(model, str):
        raise ConchError("TypeError", 'agent: `model` must be a String like "local:NAME"')
    return goal, list(tools), max_steps, model


def _call_tool(name: str, args: dict[str, Any]) -> dict[str, Any]:
    b = lookup(name)
    assert b is not None
    try:
        value = b.fn(**args)
    except ConchError as exc:
        return {"success": False, "error": {"kind": exc.kind, "message": exc.message}}
    except Exception as exc:
        from conch.lang.errors import from_python

        err = from_python(exc)
        return {"success": False, "error": {"kind": err.kind, "message": err.message}}
    return {"success": True, "result": render(value)}


def _run(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # Called from inside an event loop (an embedding application): a thread of its own.
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


@builtin(
    "agent",
    category="ai",
    effect="model",
    returns="Record",
    description="Run an agent loop: the model reaches `goal` by calling the `tools` (builtin "
    "names) one JSON action at a time, at most `max_steps` steps. Returns `{id, status, "
    "result, steps, error}`; `status` is `succeeded` or `failed` (`error.kind` LimitError "
    "when the steps run out). Optional `model` (`provider:name`, default: the configured "
    "default model).",
    examples=[
        Example('agent({goal: "Answer at once", tools: ["len"], max_steps: 0}).status', "failed"),
        Example(
            'agent({goal: "Answer at once", tools: [], max_steps: 0}).error.kind', "LimitError"
        ),
    ],
)
def agent(spec: Record) -> dict[str, Any]:
    from conch.agents.registry import DEFAULT_PROMPT, qualified_model
    from conch.config import get_settings
    from conch.orchestration.loop import ModelError, run_agent_loop
    from conch.orchestration.models import ModelClient

    goal, tools, max_steps, model = _spec(spec)
    ctx = current()
    in_server = ctx.settings is not None
    settings = ctx.settings if in_server else get_settings()
    model = qualified_model(model or settings.default_model)
    timeout = 300.0
    if ctx.deadline is not None:
        timeout = max(1.0, ctx.deadline - time.monotonic())
    store: Any = None
    task_id = f"task_{uuid.uuid4().hex[:16]}"
    if in_server and max_steps > 0:
        if ctx.records is not None:  # a sandbox worker: the server records the task
            store = _HostRecords(ctx.records)
            store.insert(task_id, goal, tools, max_steps, model, timeout)
        else:
            store = _record(settings, task_id, goal, tools, max_steps, model, timeout)

    async def main() -> dict[str, Any]:
        client = ModelClient(settings.models_url, timeout=timeout)
        usage: dict[str, int] = {}

        async def chat(messages: list[dict[str, Any]], schema: dict[str, Any]) -> Any:
            return await client.chat(model, messages, schema)

        async def call_tool(name: str, args: dict[str, Any]) -> dict[str, Any]:
            return _call_tool(name, args)

        async def on_step(step: dict[str, Any]) -> None:
            for key, value in (step.get("usage") or {}).items():
                usage[key] = usage.get(key, 0) + value
            if store is not None:
                store.add_task_step(task_id, step, dict(usage))

        try:
            out = await run_agent_loop(
                goal=goal,
                tools=tools,
                max_steps=max_steps,
                system=DEFAULT_PROMPT,
                chat=chat,
                call_tool=call_tool,
                on_step=on_step,
                observation_chars=settings.agent_observation_chars,
            )
            status, result, error, steps = out.status, out.result, out.error, out.steps
            usage = out.usage
        except ModelError as exc:
            status, result, steps = "failed", None, []
            error = {"kind": "ProviderError", "message": str(exc)}
        finally:
            await client.close()
        if store is not None:
            store.finish_task(task_id, status, result=result, error=error, usage=usage)
        return {"id": task_id, "status": status, "result": result, "steps": steps, "error": error}

    return _run(main())  # type: ignore[no-any-return]


class _HostRecords:
    """The task record of a run in a sandbox worker, kept by the server: the worker sends
    each change over its channel (``Context.records``) and never opens the database."""

    def __init__(self, send: Any) -> None:
        self.send = send

    def insert(self, task_id: str, goal: str, tools: list[str], max_steps: int, model: str,
               timeout: float) -> None:
        self.send("task.insert", {"id": task_id, "goal": goal, "tools": tools,
                                  "max_steps": max_steps, "model": model, "timeout": timeout})

    def add_task_step(self, task_id: str, step: dict[str, Any], usage: dict[str, int]) -> None:
        self.send("task.step", {"id": task_id, "step": step, "usage": usage})

    def finish_task(self, task_id: str, status: str, *, result: Any, error: Any,
                    usage: dict[str, int]) -> None:
        self.send("task.finish", {"id": task_id, "status": status, "result": result,
                                  "error": error, "usage": usage})


def _record(
    settings: Any,
    task_id: str,
    goal: str,
    tools: list[str],
    max_steps: int,
    model: str,
    timeout: float,
) -> Any:
    """The task record of a run with host settings but no host to keep it (a Dask worker):
    written to the orchestration tables directly."""
    from conch import db
    from conch.orchestration.store import Store

    store = Store(db.engine_for(settings.effective_database_url))
    now = time.time()
    store.insert_task(
        {
            "id": task_id,
            "goal": goal,
            "tools": tools,
            "max_steps": max_steps,
            "agent": "default",
            "model": model,
            "status": "pending",
            "steps": [],
            "result": None,
            "error": None,
            "usage": {},
            "created_at": now,
            "started_at": None,
            "finished_at": None,
            "origin": "builtin",
            "owner": f"builtin:{os.getpid()}",
            # The run cannot outlive the request's wall time; after that it was interrupted.
            "lease_until": now + timeout + 60,
        }
    )
    store.start_task(task_id, f"builtin:{os.getpid()}", now + timeout + 60)
    return store
