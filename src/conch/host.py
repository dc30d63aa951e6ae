"""The language's host: what a conch program reaches outside the language (models, agents,
task records), for each place programs run.

:mod:`conch.lang` asks for these through the :class:`~conch.lang.host.Host` on its run's
context and never imports what answers. This module answers, with one implementation for
the three places a program runs; they differ only in where models are and where an
``agent`` call's task is recorded:

- the shell (``conch -c``, ``conch run``, the REPL): :func:`shell_host`. Models in-process
  (the shell's own serving layer: local models and configured providers) unless
  ``models_url`` is set explicitly (conch.toml or ``CONCH_MODELS_URL``), then that server;
  the settings are read when a program first asks for a model; nothing is recorded.
- a sandbox worker of the agent server: :func:`server_host` with the worker's channel.
  Models at the inference server (``models_url``; a worker never loads a model); an agent
  call's task is sent to the server, which writes it (a worker cannot open the database).
- a Dask worker (the ``dask`` executor): :func:`server_host` without a channel. Models as
  for a sandbox worker; the task is written to the orchestration tables directly.

Everything above the language this reaches (the providers' client, the agent loop, its model
client and default agent, the orchestration store) is imported by the functions of the
section "what the host reaches", the one place that names those modules, and only when a
program first asks: ``conch -c '1 + 1'`` imports none of it.
"""

from __future__ import annotations

import time

from conch.lang.host import ModelRequestError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from typing import Any

    from conch.config import Settings
    from conch.lang.host import ToolCall

    # Where a sandbox worker sends what the server records for its run: (kind, data).
    RecordFn = Callable[[str, dict[str, Any]], None]

# How long an agent call of a run without a wall-time limit may take.
AGENT_TIMEOUT_S = 300.0


# -- what the host reaches: the one place that names the modules above the language ---------


def _models(settings: Settings, in_process: bool, credential: str | None = None) -> Any:
    """The client ``ai`` and ``embed`` reach models with: this process's serving layer, or
    the inference server at ``models_url`` (as ``credential``: see :class:`ConchHost`)."""
    from conch.inference.client import HTTPModels, InProcessModels

    if in_process:
        return InProcessModels.for_settings(settings)
    return HTTPModels(settings.models_url, settings.provider_timeout_s, api_key=credential)


def _credential(host: ConchHost, settings: Settings) -> str | None:
    """The key a run's model requests carry: its model pass, or (the shell) the configured
    admin key; a worker's settings hold no key."""
    return host.credential or settings.admin_key or settings.api_key


def _answer(client: Any, kind: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    from conch.inference.client import ModelCallError

    try:
        answer = client.chat(body, timeout) if kind == "chat" else client.embed(body, timeout)
    except ModelCallError as exc:
        raise ModelRequestError(exc.status, exc.message) from None
    return dict(answer)


def _default_agent() -> tuple[str, Callable[[], list[str]], Callable[[str], str]]:
    """The default agent's system prompt, its tools and the ``provider:model`` rule."""
    from conch.orchestration.agents import DEFAULT_PROMPT, default_tools, qualified_model

    return DEFAULT_PROMPT, default_tools, qualified_model


def _agent_loop() -> tuple[Any, type[Exception], Any]:
    """The JSON-action agent loop, the error a failed model call raises in it, and the
    client of the inference server's chat API it asks."""
    from conch.orchestration.loop import ModelError, run_agent_loop
    from conch.orchestration.models import ModelClient

    return run_agent_loop, ModelError, ModelClient


def _store(settings: Settings) -> Any:
    from conch import db
    from conch.orchestration.store import Database, TaskStore

    return TaskStore(Database(db.engine_for(settings.effective_database_url)))


# -- where an agent call's task is recorded --------------------------------------------------


class ChannelTasks:
    """A sandbox worker's task record: each change goes to the server over the worker's
    channel, where it is checked and written (``Orchestrator.record_builtin``)."""

    __slots__ = ("send",)

    def __init__(self, send: RecordFn) -> None:
        self.send = send

    def insert(self, task_id: str, goal: str, tools: list[str], max_steps: int, model: str,
               timeout: float) -> None:
        self.send("task.insert", {"id": task_id, "goal": goal, "tools": tools,
                                  "max_steps": max_steps, "model": model, "timeout": timeout})

    def add_step(self, task_id: str, step: dict[str, Any], usage: dict[str, int]) -> None:
        self.send("task.step", {"id": task_id, "step": step, "usage": usage})

    def finish(self, task_id: str, status: str, *, result: Any, error: Any,
               usage: dict[str, int]) -> None:
        self.send("task.finish", {"id": task_id, "status": status, "result": result,
                                  "error": error, "usage": usage})


class DatabaseTasks:
    """A Dask worker's task record: written to the orchestration tables directly (there is
    no server process beside it to send it to)."""

    __slots__ = ("_store", "settings")

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._store: Any = None

    @property
    def store(self) -> Any:
        if self._store is None:  # on the first agent call that takes a step
            self._store = _store(self.settings)
        return self._store

    def insert(self, task_id: str, goal: str, tools: list[str], max_steps: int, model: str,
               timeout: float) -> None:
        import os

        now = time.time()
        owner = f"builtin:{os.getpid()}"
        lease = now + timeout + 60  # it cannot outlive its run; after that, interrupted
        self.store.insert_task({
            "id": task_id, "goal": goal, "tools": tools, "max_steps": max_steps,
            "agent": "default", "model": model, "status": "pending", "steps": [],
            "result": None, "error": None, "usage": {}, "created_at": now,
            "started_at": None, "finished_at": None, "origin": "builtin", "owner": owner,
            "lease_until": lease,
        })  # fmt: skip
        self.store.start_task(task_id, owner, lease)

    def add_step(self, task_id: str, step: dict[str, Any], usage: dict[str, int]) -> None:
        self.store.add_task_step(task_id, step, usage)

    def finish(self, task_id: str, status: str, *, result: Any, error: Any,
               usage: dict[str, int]) -> None:
        self.store.finish_task(task_id, status, result=result, error=error, usage=usage)


# -- the host ---------------------------------------------------------------------------------


class ConchHost:
    """The :class:`~conch.lang.host.Host` of conch's own programs.

    ``settings``: the settings models and agents are configured by (None: this process's
    own, read on first need). ``in_process``: models through this process's serving layer
    rather than the inference server at ``models_url`` (the shell's choice). ``tasks``:
    where an agent call's task is recorded (None: nowhere). ``credential``: the key its
    requests to the inference server carry (a run's model pass, given by the server that
    asked for the run: :meth:`with_credential`)."""

    __slots__ = ("_settings", "credential", "in_process", "tasks")

    def __init__(self, settings: Settings | None = None, *, in_process: bool = False,
                 tasks: ChannelTasks | DatabaseTasks | None = None,
                 credential: str | None = None) -> None:
        self._settings = settings
        self.in_process = in_process
        self.tasks = tasks
        self.credential = credential

    def with_credential(self, credential: str) -> ConchHost:
        """This host for one run whose model requests carry ``credential``."""
        return ConchHost(self._settings, in_process=self.in_process, tasks=self.tasks,
                         credential=credential)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from conch.config import get_settings

            return get_settings()
        return self._settings

    # -- models ---------------------------------------------------------------------------

    def chat(self, body: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        settings = self.settings
        if not body.get("model"):
            body = {**body, "model": settings.default_model}
        return self._ask(settings, "chat", body, deadline)

    def embed(self, body: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        return self._ask(self.settings, "embed", body, deadline)

    def _ask(self, settings: Settings, kind: str, body: dict[str, Any],
             deadline: float | None) -> dict[str, Any]:
        timeout = float(settings.provider_timeout_s)
        if deadline is not None:
            timeout = min(timeout, max(0.001, deadline - time.monotonic()))
        # In the shell an explicit models_url wins over the serving layer in this process.
        in_process = self.in_process and "models_url" not in settings.model_fields_set
        return _answer(_models(settings, in_process, _credential(self, settings)), kind, body,
                       timeout)

    # -- agents ---------------------------------------------------------------------------

    def run_agent(self, *, goal: str, tools: list[str] | None, max_steps: int,
                  model: str | None, deadline: float | None,
                  call_tool: ToolCall) -> dict[str, Any]:
        import uuid

        prompt, default_tools, qualified_model = _default_agent()
        run_agent_loop, model_error, model_client = _agent_loop()
        settings = self.settings
        model = qualified_model(model or settings.default_model)
        tools = default_tools() if tools is None else tools
        timeout = AGENT_TIMEOUT_S if deadline is None else max(1.0, deadline - time.monotonic())
        task_id = f"task_{uuid.uuid4().hex[:16]}"
        # A call that may take no step is not worth a task.
        tasks = self.tasks if max_steps > 0 else None
        if tasks is not None:
            tasks.insert(task_id, goal, tools, max_steps, model, timeout)

        async def main() -> dict[str, Any]:
            client = model_client(settings.models_url, timeout=timeout,
                                  api_key=_credential(self, settings))
            usage: dict[str, int] = {}

            async def chat(messages: list[dict[str, Any]], schema: dict[str, Any]) -> Any:
                return await client.chat(model, messages, schema)

            async def tool(name: str, args: dict[str, Any]) -> dict[str, Any]:
                return call_tool(name, args)

            async def on_step(step: dict[str, Any]) -> None:
                for key, value in (step.get("usage") or {}).items():
                    usage[key] = usage.get(key, 0) + value
                if tasks is not None:
                    tasks.add_step(task_id, step, dict(usage))

            try:
                out = await run_agent_loop(
                    goal=goal, tools=tools, max_steps=max_steps, system=prompt, chat=chat,
                    call_tool=tool, on_step=on_step,
                    observation_chars=settings.agent_observation_chars,
                )
                status, result, error, steps = out.status, out.result, out.error, out.steps
                usage = out.usage
            except model_error as exc:
                status, result, steps = "failed", None, []
                error = {"kind": "ProviderError", "message": str(exc)}
            finally:
                await client.close()
            if tasks is not None:
                tasks.finish(task_id, status, result=result, error=error, usage=usage)
            return {"id": task_id, "status": status, "result": result, "steps": steps,
                    "error": error}

        return _run(main())


def _run(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Run the agent's event loop to its end from a program, which runs synchronously."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # Called from inside an event loop (an application embedding conch): a thread of its
    # own, in the caller's context (the run's, which the tool calls use).
    import contextvars
    import threading

    box: dict[str, Any] = {}
    context = contextvars.copy_context()

    def target() -> None:
        try:
            box["value"] = context.run(asyncio.run, coro)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


# -- the three hosts --------------------------------------------------------------------------


def shell_host() -> ConchHost:
    """The host of the shell (``conch -c``, ``conch run``, the REPL)."""
    return ConchHost(in_process=True)


def server_host(settings: Settings | None, records: RecordFn | None = None) -> ConchHost | None:
    """The host of a run in a sandbox worker (``records``: its channel to the server) or a
    Dask worker (no channel): the server's ``settings``; None without them (a worker
    started with no settings reaches nothing)."""
    if settings is None:
        return None
    tasks = ChannelTasks(records) if records is not None else DatabaseTasks(settings)
    return ConchHost(settings, tasks=tasks)
