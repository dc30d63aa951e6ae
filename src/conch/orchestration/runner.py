"""The task runner: agent tasks created, forked, run in the background, cancelled, and
resumed once a person decides on their waiting tool calls.

A task is run by the server that created it (it holds the task's lease) or that took it over
(:mod:`.keeper`); each run is a :class:`~.task_run.TaskRun`. A tool call that the task's
approval policy says ``ask`` for stops the task (``waiting``) until a person approves or
rejects it (or its approval timeout rejects it), through any server; the one that records
the decision resumes the task.

Tenants. A task is made with its ``owner`` (the tenant of the key that made it) and that
key's id; every reader and action takes the caller's ``tenant`` (``None``: the admin, who
sees every tenant's) and answers ``404`` for another tenant's task, as for none at all. A
decision on a pending call is reported to ``on_decision`` (the audit log) with its ``actor``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from conch.orchestration.agents import DEFAULT_AGENT, AgentRegistry, AgentSpec, qualified_model
from conch.orchestration.approvals import check_call_args, merge, parse_policy
from conch.orchestration.checkpoints import fork
from conch.orchestration.errors import Conflict, Invalid, NotFound
from conch.orchestration.executor import Executor
from conch.orchestration.loop import transcript
from conch.orchestration.models import ModelClient
from conch.orchestration.protocols import unknown_tools
from conch.orchestration.runtime import Runtime, new_id
from conch.orchestration.task_run import TaskDeps, TaskRun, TaskSessions

log = logging.getLogger("conch.orchestration")

# (actor, task id, the decided call {call_id, tool, args, ...}, decision, edited args, message):
# told of every decision once it is recorded (the web layer writes it to the audit log).
OnDecision = Callable[[Any, str, dict[str, Any], str, dict[str, Any] | None, str | None], None]


def _sees(tenant: str | None, owner: str | None) -> bool:
    """Whether a caller of ``tenant`` (``None``: the admin) sees a thing of ``owner``."""
    return tenant is None or tenant == owner


def _conversation(task: Any, notes: dict[int, list[str]]) -> list[dict[str, Any]]:
    """The conversation a finished task of a thread leaves to the next one."""
    return transcript(
        task.goal, list(task.steps), history=task.history, notes=notes,
        native=task.protocol == "native",
    )  # fmt: skip


class TaskRunner:
    """Agent tasks on this server: their runs, and the decisions they wait for."""

    def __init__(
        self,
        rt: Runtime,
        agents: AgentRegistry,
        models: ModelClient,
        executor: Executor,
        policy: dict[str, Any],
        sessions: TaskSessions | None = None,
    ) -> None:
        self.rt = rt
        self.deps = TaskDeps(agents, models, executor, self.step_status, sessions)
        self.tasks = rt.stores.tasks
        # The server's approval policy, under every agent's and task's.
        self.policy = policy
        self.running: dict[str, asyncio.Task[Any]] = {}  # task id -> its run
        # Tasks beyond this many wait (pending) for a free slot: each running task keeps the
        # event loop busy for a moment at every model reply and tool result, and the server
        # must keep answering other requests promptly however many tasks are queued.
        slots = max(1, rt.settings.orchestration_max_concurrent_tasks)
        self._slots = asyncio.Semaphore(slots)
        self.on_decision: OnDecision | None = None

    # -- creating -------------------------------------------------------------------------

    async def create_task(
        self,
        *,
        goal: str,
        tools: list[str] | None,
        max_steps: int,
        agent: str | None = None,
        model: str | None = None,
        origin: str = "api",
        approvals: Any = None,
        approval_timeout_s: float | None = None,
        thread_id: str | None = None,
        protocol: str | None = None,
        owner: str | None = None,
        key_id: str | None = None,
        session: str | None = None,
    ) -> dict[str, Any]:
        """Record a task of tenant ``owner`` (made by key ``key_id``, whose limits its model
        turns count against) and start it in the background; returns the task record. In a
        thread (``thread_id``) it starts from the conversation of the thread's last task
        (``409`` while a task of the thread is active). ``protocol``: ``native`` or ``json``
        forces the tool-call protocol; ``auto`` (or None) chooses it when the task starts
        (the model's tool support).

        ``session``: its tool calls run in that session (its files, its bindings). The tasks
        of a thread share one by default (``thread_sessions``): the session of the thread's
        earlier tasks, or a new one for its first."""
        agent_id = agent or DEFAULT_AGENT
        spec = await self.rt.db(self.deps.agents.get, agent_id, owner)
        if spec is None:
            raise Invalid(f"agent: no agent {agent_id!r}", where="agent")
        if tools is None:
            tools = list(spec.tools)
        bad = unknown_tools(tools)
        if bad:
            raise Invalid(f"tools: unknown builtin {', '.join(map(repr, bad))}", where="tools")
        if max_steps < 1:
            raise Invalid("max_steps: must be at least 1", where="max_steps")
        if protocol not in (None, "auto", "native", "json"):
            raise Invalid("protocol: must be native, json or auto", where="protocol")
        if approval_timeout_s is None:
            approval_timeout_s = self.rt.settings.approval_timeout_s
        session, made = await self._session_for(session, thread_id, owner)
        task_id = new_id("task")
        row = {
            **self._new_row(task_id),
            "goal": goal, "tools": tools, "max_steps": max_steps, "agent": agent_id,
            "model": qualified_model(model or spec.model), "usage": {}, "origin": origin,
            "approvals": merge(self.policy, spec.approvals, parse_policy(approvals)),
            "approval_timeout_s": approval_timeout_s, "thread_id": thread_id,
            # Forced, or chosen (and recorded) when the task starts.
            "protocol": None if protocol == "auto" else protocol,
            "tenant": owner, "key_id": key_id, "session": session,
        }  # fmt: skip
        try:
            record = await self.rt.db(
                functools.partial(self.tasks.insert_task, row, continues=_conversation)
            )
        except BaseException:
            if made and session is not None and self.deps.sessions is not None:
                await self.deps.sessions.discard(session)
            raise
        # In a thread its history was made in the store: the run reads the row back.
        self.launch(task_id, spec, row if thread_id is None else None, resume=False)
        return record  # type: ignore[no-any-return]

    async def _session_for(
        self, session: str | None, thread_id: str | None, owner: str | None
    ) -> tuple[str | None, bool]:
        """The session a new task's calls run in (one of tenant ``owner``'s), and whether it
        was made for the task."""
        sessions = self.deps.sessions
        if session is not None:
            if sessions is None:
                raise Invalid("session: this server runs no sessions", where="session")
            await sessions.check(session, tenant=owner)
            return session, False
        if thread_id is None or sessions is None or not self.rt.settings.thread_sessions:
            return None, False
        earlier = await self.rt.db(self.tasks.thread_session, thread_id)
        if earlier is not None:
            return earlier, False
        return await sessions.create(tenant=owner), True

    def _new_row(self, task_id: str) -> dict[str, Any]:
        """The columns every new task starts with: pending, held by this server."""
        return {
            "id": task_id, "status": "pending", "steps": [], "result": None, "error": None,
            "created_at": time.time(), "started_at": None, "finished_at": None,
            "owner": self.rt.instance, "lease_until": self.rt.lease(), "pending": None,
            "wait_until": None,
        }  # fmt: skip

    async def fork_task(
        self,
        task_id: str,
        *,
        checkpoint: int,
        tool_result: str | None = None,
        message: str | None = None,
        max_steps: int | None = None,
        thread_id: str | None = None,
        tenant: str | None = None,
        owner: str | None = None,
        key_id: str | None = None,
    ) -> dict[str, Any]:
        """Start a new task from task ``task_id``'s steps ``0..checkpoint-1`` (its history
        up to step ``checkpoint``), with the last kept call's result replaced by
        ``tool_result`` and ``message`` added after them. The fork replays the copied
        checkpoint of the kept steps: no model turn before the fork point is asked again and
        no tool call runs again. The original is not changed (it may be running)."""
        loaded = await self.rt.db(self.rt.stores.checkpoints.checkpoint, task_id)
        if loaded is None or not _sees(tenant, loaded[0].tenant):
            raise NotFound(f"no task {task_id!r}")
        original, entries = loaded
        steps, copied = fork(
            list(original.steps), entries, checkpoint, tool_result=tool_result, message=message,
            native=original.protocol == "native",
        )  # fmt: skip
        if max_steps is None:
            max_steps = original.max_steps
        if max_steps <= checkpoint:
            raise Invalid(
                f"max_steps: the fork keeps {checkpoint} steps and counts them: give "
                f"max_steps above {checkpoint}",
                where="max_steps",
            )
        usage: dict[str, int] = {}
        for step in steps:
            for key, value in (step.get("usage") or {}).items():
                usage[key] = usage.get(key, 0) + value
        new = new_id("task")
        session = None
        if original.session is not None and self.deps.sessions is not None:
            session = await self.deps.sessions.fork(original.session, tenant=owner)
        row = {
            **self._new_row(new),
            **{c: getattr(original, c) for c in ("goal", "tools", "agent", "model", "history")},
            # The same protocol: the copied checkpoint is replayed in it.
            **{c: getattr(original, c) for c in ("approvals", "approval_timeout_s", "protocol")},
            "max_steps": max_steps, "steps": steps, "usage": usage, "origin": "api",
            "thread_id": thread_id, "forked_from": task_id, "fork_checkpoint": checkpoint,
            "tenant": owner, "key_id": key_id, "session": session,
        }  # fmt: skip
        try:
            record = await self.rt.db(functools.partial(
                self.tasks.insert_task, row, copied, new_thread=thread_id is not None))
        except BaseException:
            if session is not None and self.deps.sessions is not None:
                await self.deps.sessions.discard(session)
            raise
        self.launch(new, None, row, resume=False)
        return record  # type: ignore[no-any-return]

    # -- running --------------------------------------------------------------------------

    def launch(
        self, task_id: str, spec: AgentSpec | None, row: dict[str, Any] | None, *, resume: bool
    ) -> None:
        """Run a task in the background: a new one (``pending``), or one this server has
        just claimed in status ``running`` (``resume``: from its checkpoint)."""
        if self.rt.closing:
            return  # the task keeps its lease until it runs out; then it is taken over
        previous = self.running.get(task_id)
        if previous is not None:
            # Its last run is still returning (it has just stopped to wait, and the decision
            # came at once): start once that one is done (and gone from ``running``).
            previous.add_done_callback(lambda _t: self.launch(task_id, spec, row, resume=resume))
            return
        run = asyncio.get_running_loop().create_task(self._run(task_id, spec, row, resume))
        self.running[task_id] = run
        run.add_done_callback(lambda _t: self.running.pop(task_id, None))

    async def _run(
        self, task_id: str, spec: AgentSpec | None, row: dict[str, Any] | None, resume: bool
    ) -> None:
        stream = f"task:{task_id}"
        try:
            async with self._slots:
                await TaskRun(self.rt, self.deps, task_id, spec, row).run(resume=resume)
        except asyncio.CancelledError:
            if self.rt.closing:
                # Give it back: the next server to look resumes it from its checkpoint.
                leases = self.rt.stores.leases
                await asyncio.shield(self.rt.db(leases.release_task, task_id, self.rt.instance))
            raise
        except Exception as exc:  # a bug must not leave the task running forever
            log.exception("task %s crashed", task_id)
            await self.rt.db(
                self.tasks.finish_task,
                task_id,
                "failed",
                error={"kind": "InternalError", "message": f"{type(exc).__name__}: {exc}"},
            )
        finally:
            self.rt.notify(stream)

    async def step_status(self, task_id: str, row: dict[str, Any], status: str) -> None:
        """A workflow step's task waits for a person, or goes on: tell the workflow."""
        if row.get("origin", "workflow") != "workflow":
            return
        wf_id = await self.rt.db(self.rt.stores.workflows.task_step_event, task_id, status)
        if wf_id is not None:
            self.rt.notify(f"workflow:{wf_id}")

    # -- reading and cancelling -----------------------------------------------------------

    async def get_task(self, task_id: str, tenant: str | None = None) -> dict[str, Any]:
        """The task, if ``tenant`` (``None``: any) may see it."""
        record = await self.rt.found("task", self.tasks.get_task, task_id)
        if not _sees(tenant, record.get("tenant")):
            raise NotFound(f"no task {task_id!r}")
        return record

    async def get_thread(self, thread_id: str, tenant: str | None = None) -> dict[str, Any]:
        """A thread: its tasks, oldest first (``404`` for a thread with none)."""
        tasks = await self.rt.db(self.tasks.thread, thread_id, tenant)
        if not tasks:
            raise NotFound(f"no thread {thread_id!r}")
        return {"id": thread_id, "tasks": tasks}

    async def task_checkpoint(self, task_id: str, tenant: str | None = None) -> list[dict[str, Any]]:
        """The task's checkpoint entries, in order."""
        if tenant is not None:
            await self.get_task(task_id, tenant)
        entries = await self.rt.db(self.rt.stores.checkpoints.checkpoint_entries, task_id)
        if entries is None:
            raise NotFound(f"no task {task_id!r}")
        return entries  # type: ignore[no-any-return]

    async def wait_task(self, task_id: str, timeout: float | None = None) -> dict[str, Any]:
        """The task record once it has finished (``TimeoutError`` after ``timeout`` s)."""
        return await self.rt.finished(f"task:{task_id}", self.get_task, task_id, timeout)

    async def cancel_task(self, task_id: str, tenant: str | None = None) -> dict[str, Any]:
        """Cancel a pending, running or waiting task (``409`` once it has finished)."""
        if tenant is not None:
            await self.get_task(task_id, tenant)
        record = await self.rt.db(
            self.tasks.finish_task,
            task_id,
            "cancelled",
            error={"kind": "CancelledError", "message": "the task was cancelled"},
        )
        if record is None:
            current = await self.get_task(task_id)
            raise Conflict(f"task {task_id!r} already {current['status']}")
        run = self.running.get(task_id)
        if run is not None:
            run.cancel()
        self.rt.notify(f"task:{task_id}")
        return record  # type: ignore[no-any-return]

    # -- approvals ------------------------------------------------------------------------

    async def approve_task(
        self,
        task_id: str,
        *,
        args: dict[str, Any] | None = None,
        call_id: str | None = None,
        tenant: str | None = None,
        actor: Any = None,
    ) -> dict[str, Any]:
        """Approve a waiting task's pending call (``args``: run it with these instead); the
        task resumes here. ``409`` unless it is waiting."""

        def check(item: dict[str, Any], edited: Any) -> tuple[str, str] | None:
            return check_call_args(item["tool"], edited)

        return await self._decide(task_id, tenant, actor, approve=True, call_id=call_id,
                                  args=args, check=check)  # fmt: skip

    async def reject_task(
        self,
        task_id: str,
        *,
        message: str | None = None,
        call_id: str | None = None,
        tenant: str | None = None,
        actor: Any = None,
    ) -> dict[str, Any]:
        """Reject a waiting task's pending call: the model is told ``message`` instead of
        its result, and the task goes on. ``409`` unless it is waiting."""
        return await self._decide(task_id, tenant, actor, approve=False, call_id=call_id,
                                  message=message)  # fmt: skip

    async def _decide(
        self, task_id: str, tenant: str | None = None, actor: Any = None, **kw: Any
    ) -> dict[str, Any]:
        before = await self.get_task(task_id, tenant)
        key_id = getattr(actor, "key_id", None)
        if key_id is not None:
            kw["key"] = {"id": str(key_id), "name": str(getattr(actor, "name", "") or key_id)}
        decide = self.rt.stores.checkpoints.decide
        got = await self.rt.db(
            functools.partial(
                decide, task_id, owner=self.rt.instance, lease_until=self.rt.lease(), **kw
            )
        )
        if self.on_decision is not None:
            self._report(before, got["record"], actor, kw)
        if got["resumed"]:
            await self.step_status(task_id, got["record"], "running")
            self.launch(task_id, None, None, resume=True)
        self.rt.notify(f"task:{task_id}")
        return got["record"]  # type: ignore[no-any-return]

    def _report(
        self, before: dict[str, Any], after: dict[str, Any], actor: Any, kw: dict[str, Any]
    ) -> None:
        """Tell ``on_decision`` which call was decided (the one pending before that is not
        pending after), how, and with what arguments."""
        assert self.on_decision is not None
        still = {p.get("call_id") for p in after.get("pending") or []}
        decided = [p for p in before.get("pending") or [] if p.get("call_id") not in still]
        wanted = kw.get("call_id")
        for item in decided:
            if wanted is not None and item.get("call_id") != wanted:
                continue
            decision = "approved" if kw.get("approve") else "rejected"
            if kw.get("by") == "timeout":
                decision = "timed_out"
            try:
                self.on_decision(actor, before["id"], item, decision, kw.get("args"),
                                 kw.get("message"))  # fmt: skip
            except Exception:  # the decision stands; the report is what failed
                log.exception("reporting the decision on task %s", before["id"])
            break

    async def approval_timer(self) -> None:
        """Reject the pending calls of tasks that waited longer than their approval
        timeout (on whichever server notices first: the decision is conditional)."""
        while True:
            await asyncio.sleep(min(1.0, max(0.2, self.rt.lease_s / 3)))
            try:
                overdue = self.rt.stores.checkpoints.overdue_waits
                for task_id, pending in await self.rt.db(overdue, time.time()):
                    for item in pending:
                        with contextlib.suppress(Conflict, NotFound, Invalid):
                            await self._decide(
                                task_id,
                                approve=False,
                                call_id=item["call_id"],
                                message=f"no decision on this call of {item['tool']} within "
                                "the task's approval timeout: it was not run",
                                by="timeout",
                            )
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("approval timeouts")
