"""The orchestrator: agent tasks, durable DAG workflows and their event streams, as the web
routes, the CLI and the MCP server see them.

State lives in the database (:mod:`.store`); the work this server has claimed runs in the
background of the server's event loop, in three parts over one :class:`~.runtime.Runtime`:

- the task runner (:mod:`.runner`, each run a :mod:`.task_run`): tasks, forks and threads,
  and the decisions on their waiting tool calls (with the approval timer);
- the workflow scheduler (:mod:`.scheduler`): claims runnable steps, runs them, records
  their outcomes;
- the lease keeper (:mod:`.keeper`): renews this server's leases, notices work cancelled
  through another server, takes over work whose server died.

``run`` steps and agent tool calls go through the executor (sandbox pool or Dask); models
are reached through the inference server's OpenAI-compatible API. This class wires the parts
together, starts and stops them, and answers for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from conch.config import Settings
from conch.orchestration.agents import AgentRegistry, AgentSpec, agent_record, qualified_model
from conch.orchestration.approvals import parse_policy
from conch.orchestration.builtin_tasks import BuiltinTasks
from conch.orchestration.errors import Conflict, Invalid, NotFound
from conch.orchestration.executor import Executor
from conch.orchestration.keeper import LeaseKeeper
from conch.orchestration.models import ModelClient
from conch.orchestration.protocols import unknown_tools
from conch.orchestration.runner import TaskRunner
from conch.orchestration.runtime import RunKind, Runtime
from conch.orchestration.scheduler import WorkflowScheduler
from conch.orchestration.task_run import TaskSessions

__all__ = ["Orchestrator", "RunKind"]


class Orchestrator:
    def __init__(
        self, settings: Settings, executor: Executor, sessions: TaskSessions | None = None
    ) -> None:
        from conch import db

        self.settings = settings
        self.executor = executor
        self.rt = Runtime(settings, db.engine_for(settings.effective_database_url))
        self.stores = self.rt.stores
        self.agents = AgentRegistry(self.stores.db, settings.default_model)
        self.models = ModelClient(settings.models_url)
        # The server's approval policy (the configuration's ``approvals``): under every
        # agent's and task's.
        try:
            policy = parse_policy(settings.approvals, where="approvals")
        except Invalid as exc:
            raise ValueError(f"configuration: {exc.message}") from None
        self.runner = TaskRunner(self.rt, self.agents, self.models, executor, policy, sessions)
        self.scheduler = WorkflowScheduler(self.rt, self.agents, executor, self.runner)
        self.keeper = LeaseKeeper(self.rt, self.runner, self.scheduler)
        self.builtin = BuiltinTasks(settings, self.stores.tasks)
        self._background: list[asyncio.Task[Any]] = []

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        await self.executor.start()
        # A SQLite database has a single server: whatever it was running when it stopped was
        # interrupted, whatever the leases say. PostgreSQL waits for leases to run out.
        single = self.stores.db.engine.dialect.name == "sqlite"
        await self.keeper.reclaim(everything=single)
        loop = asyncio.get_running_loop()
        self._background = [
            loop.create_task(self.scheduler.run(), name="orchestration-scheduler"),
            loop.create_task(self.keeper.run(), name="orchestration-leases"),
            loop.create_task(self.runner.approval_timer(), name="orchestration-approval-timeouts"),
        ]

    async def close(self) -> None:
        """Stop: running tasks are given back (the next server to look, this one restarted
        or another on the same database, resumes them from their checkpoints); running
        steps go back to pending without spending an attempt... unless a lease keeper
        elsewhere gets them first."""
        self.rt.closing = True
        for bg in self._background:
            bg.cancel()
        running = [*self.runner.running.values(), *self.scheduler.running.values()]
        for job in running:
            job.cancel()
        await asyncio.gather(*self._background, *running, return_exceptions=True)
        await self.models.close()
        await self.executor.close()
        self.rt.close()

    def record_builtin(self, worker: int, kind: str, data: Any) -> None:
        """Keep what a sandbox worker's ``agent`` call reports (:mod:`.builtin_tasks`)."""
        self.builtin.record(worker, kind, data)

    # -- runs and their events ------------------------------------------------------------

    async def list_runs(
        self, kind: RunKind, status: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[dict[str, Any]]:
        """Tasks or workflows, newest first; ``status`` filters."""
        stores = self.stores
        read = stores.tasks.list_tasks if kind == "task" else stores.workflows.list_workflows
        return await self.rt.db(read, status, limit, offset)  # type: ignore[no-any-return]

    def events(self, stream: str, after: int = 0) -> AsyncIterator[tuple[int, str, Any]]:
        """The stream's events after number ``after``, live, until the terminal one."""
        return self.rt.events(stream, after)

    # -- agents ---------------------------------------------------------------------------

    async def list_agents(self) -> list[dict[str, Any]]:
        specs = await self.rt.db(self.agents.list)
        busy = await self.rt.db(self.agents.busy_ids)
        return [agent_record(s, busy) for s in specs]

    async def get_agent(self, id: str) -> dict[str, Any]:
        spec = await self.rt.db(self.agents.get, id)
        if spec is None:
            raise NotFound(f"no agent {id!r}")
        busy = await self.rt.db(self.agents.busy_ids)
        return agent_record(spec, busy)

    async def register_agent(
        self,
        *,
        id: str,
        system_prompt: str,
        tools: list[str],
        model: str | None,
        description: str = "",
        approvals: Any = None,
    ) -> dict[str, Any]:
        bad = unknown_tools(tools)
        if bad:
            raise Invalid(f"tools: unknown builtin {', '.join(map(repr, bad))}", where="tools")
        policy = parse_policy(approvals) or None
        spec = AgentSpec(
            id=id,
            description=description,
            system_prompt=system_prompt,
            tools=tools,
            model=qualified_model(model or self.settings.default_model),
            source="registered",
            approvals=policy,
        )
        try:
            await self.rt.db(self.agents.register, spec)
        except ValueError as exc:
            raise Invalid(str(exc), where="id") from None
        return await self.get_agent(id)

    async def remove_agent(self, id: str) -> None:
        try:
            removed = await self.rt.db(self.agents.remove, id)
        except ValueError as exc:
            raise Conflict(str(exc)) from None
        if not removed:
            raise NotFound(f"no agent {id!r}")

    # -- tasks (the task runner's) --------------------------------------------------------

    async def create_task(self, **kw: Any) -> dict[str, Any]:
        """:meth:`.runner.TaskRunner.create_task`."""
        return await self.runner.create_task(**kw)

    async def fork_task(self, task_id: str, **kw: Any) -> dict[str, Any]:
        return await self.runner.fork_task(task_id, **kw)

    async def get_task(self, task_id: str) -> dict[str, Any]:
        return await self.runner.get_task(task_id)

    async def cancel_task(self, task_id: str) -> dict[str, Any]:
        return await self.runner.cancel_task(task_id)

    async def wait_task(self, task_id: str, timeout: float | None = None) -> dict[str, Any]:
        return await self.runner.wait_task(task_id, timeout)

    async def get_thread(self, thread_id: str) -> dict[str, Any]:
        return await self.runner.get_thread(thread_id)

    async def task_checkpoint(self, task_id: str) -> list[dict[str, Any]]:
        return await self.runner.task_checkpoint(task_id)

    async def approve_task(self, task_id: str, **kw: Any) -> dict[str, Any]:
        return await self.runner.approve_task(task_id, **kw)

    async def reject_task(self, task_id: str, **kw: Any) -> dict[str, Any]:
        return await self.runner.reject_task(task_id, **kw)

    # -- workflows (the scheduler's) ------------------------------------------------------

    async def create_workflow(self, body: Any) -> dict[str, Any]:
        return await self.scheduler.create_workflow(body)

    async def get_workflow(self, wf_id: str) -> dict[str, Any]:
        return await self.scheduler.get_workflow(wf_id)

    async def cancel_workflow(self, wf_id: str) -> dict[str, Any]:
        return await self.scheduler.cancel_workflow(wf_id)

    # -- metrics --------------------------------------------------------------------------

    async def metrics(self) -> dict[str, int]:
        """The figures of the metrics route (``total_agents`` counts the built-in agent)."""
        figures = await self.rt.db(self.stores.metrics)
        registered = figures.pop("registered_agents")
        return {"total_agents": registered + 1, **figures}
