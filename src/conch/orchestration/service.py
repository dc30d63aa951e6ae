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

Tenants: what is made takes its ``owner`` (the tenant of the key that made it) and the key's
id; what is read or acted on takes the caller's ``tenant`` (``None``: the admin, every
tenant's), and another tenant's thing is not found (runner.py says more).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from conch.config import Settings
from conch.orchestration.agents import (
    AgentRegistry,
    AgentSpec,
    AgentTaken,
    agent_record,
    qualified_model,
)
from conch.orchestration.approvals import parse_policy
from conch.orchestration.builtin_tasks import BuiltinTasks
from conch.orchestration.errors import Conflict, Invalid, NotFound
from conch.orchestration.executor import Executor
from conch.orchestration.keeper import LeaseKeeper
from conch.orchestration.models import Credentials, ModelClient
from conch.orchestration.protocols import unknown_tools
from conch.orchestration.runner import TaskRunner
from conch.orchestration.runtime import RunKind, Runtime
from conch.orchestration.scheduler import WorkflowScheduler
from conch.orchestration.task_run import TaskSessions

__all__ = ["Orchestrator", "RunKind"]


class Orchestrator:
    def __init__(
        self,
        settings: Settings,
        executor: Executor,
        credentials: Credentials | None = None,
        sessions: TaskSessions | None = None,
    ) -> None:
        """``credentials``: the bearer a task's model requests carry, by the key that made
        the task (:class:`~.models.ModelClient`); ``sessions``: where tasks with a session
        run."""
        from conch import db

        self.settings = settings
        self.executor = executor
        self.rt = Runtime(settings, db.engine_for(settings.effective_database_url))
        self.stores = self.rt.stores
        self.agents = AgentRegistry(self.stores.db, settings.default_model)
        self.models = ModelClient(settings.models_url, credentials=credentials)
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
        self,
        kind: RunKind,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
        tenant: str | None = None,
    ) -> list[dict[str, Any]]:
        """Tasks or workflows, newest first; ``status`` filters; ``tenant``'s only."""
        stores = self.stores
        read = stores.tasks.list_tasks if kind == "task" else stores.workflows.list_workflows
        return await self.rt.db(read, status, limit, offset, tenant)  # type: ignore[no-any-return]

    def events(
        self, stream: str, after: int = 0, *, deltas: bool = False
    ) -> AsyncIterator[tuple[int | None, str, Any]]:
        """The stream's events after number ``after``, live, until the terminal one;
        ``deltas``: a task's live-only events too (the model's turns as they are generated,
        :mod:`.live`), numbered None."""
        return self.rt.events(stream, after, live=deltas)

    # -- agents ---------------------------------------------------------------------------

    async def list_agents(self, tenant: str | None = None) -> list[dict[str, Any]]:
        specs = await self.rt.db(self.agents.list, tenant)
        busy = await self.rt.db(self.agents.busy_ids)
        return [agent_record(s, busy) for s in specs]

    async def get_agent(self, id: str, tenant: str | None = None) -> dict[str, Any]:
        spec = await self.rt.db(self.agents.get, id, tenant)
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
        owner: str | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """Register (or replace) an agent of tenant ``owner``; ``tenant``: the caller's (it
        replaces only its own agents; ``None``, the admin, any)."""
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
            tenant=owner,
        )
        try:
            await self.rt.db(self.agents.register, spec, tenant)
        except AgentTaken as exc:
            raise Conflict(str(exc), where="id") from None
        except ValueError as exc:
            raise Invalid(str(exc), where="id") from None
        return await self.get_agent(id, tenant)

    async def remove_agent(self, id: str, tenant: str | None = None) -> None:
        try:
            removed = await self.rt.db(self.agents.remove, id, tenant)
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

    async def get_task(self, task_id: str, tenant: str | None = None) -> dict[str, Any]:
        return await self.runner.get_task(task_id, tenant)

    async def cancel_task(self, task_id: str, tenant: str | None = None) -> dict[str, Any]:
        return await self.runner.cancel_task(task_id, tenant)

    async def wait_task(self, task_id: str, timeout: float | None = None) -> dict[str, Any]:
        return await self.runner.wait_task(task_id, timeout)

    async def get_thread(self, thread_id: str, tenant: str | None = None) -> dict[str, Any]:
        return await self.runner.get_thread(thread_id, tenant)

    async def task_checkpoint(
        self, task_id: str, tenant: str | None = None
    ) -> list[dict[str, Any]]:
        return await self.runner.task_checkpoint(task_id, tenant)

    async def approve_task(self, task_id: str, **kw: Any) -> dict[str, Any]:
        return await self.runner.approve_task(task_id, **kw)

    async def reject_task(self, task_id: str, **kw: Any) -> dict[str, Any]:
        return await self.runner.reject_task(task_id, **kw)

    # -- workflows (the scheduler's) ------------------------------------------------------

    async def create_workflow(
        self, body: Any, owner: str | None = None, key_id: str | None = None
    ) -> dict[str, Any]:
        return await self.scheduler.create_workflow(body, owner, key_id)

    async def get_workflow(self, wf_id: str, tenant: str | None = None) -> dict[str, Any]:
        return await self.scheduler.get_workflow(wf_id, tenant)

    async def cancel_workflow(self, wf_id: str, tenant: str | None = None) -> dict[str, Any]:
        return await self.scheduler.cancel_workflow(wf_id, tenant)

    # -- metrics --------------------------------------------------------------------------

    async def active_counts(self) -> dict[str, int]:
        """``{active_tasks, waiting_tasks}``, cheaply (the status history reads it every 2 s)."""
        return await self.rt.db(self.stores.tasks.active_counts)

    async def metrics(self, tenant: str | None = None) -> dict[str, int]:
        """The figures of the metrics route (``total_agents`` counts the built-in agent);
        ``tenant``: of that tenant's tasks and workflows and the agents it sees."""
        figures = await self.rt.db(self.stores.metrics, tenant)
        registered = figures.pop("registered_agents")
        return {"total_agents": registered + 1, **figures}
