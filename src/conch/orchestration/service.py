"""The orchestrator: tasks run by the agent loop, durable DAG workflows, their event streams.

State lives in the database (:mod:`conch.orchestration.store`); this object runs the work
that this server has claimed, in the background of the server's event loop:

- a task is run by the server that created it (it owns the task's lease);
- workflow steps are claimed by whichever server's scheduler gets them first, so several
  servers on one PostgreSQL database share a workflow and no step runs twice;
- a lease keeper renews this server's leases, notices work cancelled through another server,
  and takes over work whose server died (tasks resume from their checkpoints; running
  steps are retried if they have attempts left);
- a tool call that the task's approval policy says ``ask`` for stops the task (``waiting``)
  until a person approves or rejects it (or its approval timeout rejects it), through any
  server; the one that records the decision resumes the task.

``run`` steps and agent tool calls go through the executor (sandbox pool or Dask); models
are reached through the inference server's OpenAI-compatible API.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from conch.agents.registry import (
    DEFAULT_AGENT,
    DEFAULT_PROMPT,
    AgentRegistry,
    AgentSpec,
    qualified_model,
)
from conch.config import Settings
from conch.lang.builtins.registry import lookup
from conch.orchestration.approvals import (
    REPEATABLE,
    check_call_args,
    decide,
    merge,
    parse_policy,
)
from conch.orchestration.checkpoints import CheckpointError, Journal, fork
from conch.orchestration.errors import Conflict, Invalid, NotFound
from conch.orchestration.executor import Executor
from conch.orchestration.loop import (
    Interrupt,
    ModelError,
    Outcome,
    Reply,
    ToolResult,
    ToolsUnsupported,
    observation_of,
    run_agent_loop,
    run_native_loop,
    transcript,
    unknown_tools,
)
from conch.orchestration.models import ModelClient
from conch.orchestration.spec import (
    Plan,
    WorkflowRequest,
    interpolate,
    parse_workflow,
    plan,
)
from conch.orchestration.store import INTERRUPTED, TASK_DONE, CheckpointSeq, StepOutcome, Store
from conch.sandbox.pool import Job

log = logging.getLogger("conch.orchestration")

RunKind = Literal["task", "workflow"]
TERMINAL_EVENTS = frozenset({"complete", "error"})
POLL_S = 0.5


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def _conversation(task: Any, notes: dict[int, list[str]]) -> list[dict[str, Any]]:
    """The conversation a finished task of a thread leaves to the next one."""
    return transcript(
        task.goal, list(task.steps), history=task.history, notes=notes,
        native=task.protocol == "native",
    )  # fmt: skip


class Orchestrator:
    def __init__(self, settings: Settings, executor: Executor) -> None:
        from conch import db

        self.settings = settings
        self.executor = executor
        self.engine = db.engine_for(settings.effective_database_url)
        self.store = Store(self.engine)
        self.agents = AgentRegistry(self.engine, settings.default_model)
        self.models = ModelClient(settings.models_url)
        # The server's approval policy (the configuration's ``approvals``): under every
        # agent's and task's.
        try:
            self.policy = parse_policy(settings.approvals, where="approvals")
        except Invalid as exc:
            raise ValueError(f"configuration: {exc.message}") from None
        self.instance = f"{uuid.uuid4().hex[:12]}"
        # Tasks of the agent builtin under way in sandbox workers: task id -> worker pid.
        self._builtin_tasks: dict[str, int] = {}
        self.lease_s = settings.orchestration_lease_s
        self.capacity = settings.orchestration_max_concurrent_steps
        self._tasks: dict[str, asyncio.Task[Any]] = {}  # task id -> its run
        self._steps: dict[tuple[str, str], asyncio.Task[Any]] = {}
        self._plans: dict[str, Plan] = {}
        # Results of the steps this server saw succeed, by workflow: a step's scope is read
        # from here (its ancestors' results), the database only for those run elsewhere or
        # before a restart. Dropped when the workflow ends.
        self._results: dict[str, dict[str, Any]] = {}
        # Step outcomes waiting for the scheduler's next round, which records them all in
        # one transaction; each step's run waits on its future until then.
        self._outcomes: list[tuple[StepOutcome, asyncio.Future[None]]] = []
        self._background: list[asyncio.Task[Any]] = []
        self._wake = asyncio.Event()
        self._listeners: dict[str, set[asyncio.Event]] = {}
        self._closing = False
        # Tasks beyond this many wait (pending) for a free slot: each running task keeps the
        # event loop busy for a moment at every model reply and tool result, and the server
        # must keep answering other requests promptly however many tasks are queued.
        self._task_slots = asyncio.Semaphore(max(1, settings.orchestration_max_concurrent_tasks))
        # SQLite calls are local and take well under a millisecond (WAL, no fsync per
        # commit): they run on the event loop, because a thread doing them would hold the
        # interpreter lock in 5 ms slices against the loop and every request would queue
        # behind it. PostgreSQL calls wait on the network: they go to threads.
        self._inline_db = self.engine.dialect.name == "sqlite"
        self._db_threads = ThreadPoolExecutor(8, thread_name_prefix="orchestration-db")
        self.task_listeners: list[Callable[[dict[str, Any]], None]] = []

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        await self.executor.start()
        # A SQLite database has a single server: whatever it was running when it stopped was
        # interrupted, whatever the leases say. PostgreSQL waits for leases to run out.
        single = self.engine.dialect.name == "sqlite"
        await self._reclaim(everything=single)
        loop = asyncio.get_running_loop()
        self._background = [
            loop.create_task(self._scheduler(), name="orchestration-scheduler"),
            loop.create_task(self._keeper(), name="orchestration-leases"),
            loop.create_task(self._approval_timer(), name="orchestration-approval-timeouts"),
        ]

    # -- tasks of the `agent` builtin, recorded for sandbox workers ----------------------

    def record_builtin(self, worker: int, kind: str, data: Any) -> None:
        """Keep what a sandbox worker's ``agent`` call reports (``task.insert``,
        ``task.step``, ``task.finish``). The worker cannot open the database; what it sends
        is checked like any untrusted input: the row is built here from typed fields, and a
        worker may only add to and finish the tasks it inserted itself."""
        if type(data) is not dict or type(data.get("id")) is not str:
            raise ValueError(f"a {kind} record needs an object with an id")
        task_id = data["id"]
        owner = f"builtin:{worker}"
        if kind == "task.insert":
            _check_builtin_insert(data)
            now = time.time()
            timeout = min(float(data["timeout"]), self.settings.stream_wall_time_s)
            lease = now + timeout + 60  # it cannot outlive its run; after that, interrupted
            self.store.insert_task({
                "id": task_id, "goal": data["goal"], "tools": list(data["tools"]),
                "max_steps": data["max_steps"], "agent": "default", "model": data["model"],
                "status": "pending", "steps": [], "result": None, "error": None, "usage": {},
                "created_at": now, "started_at": None, "finished_at": None,
                "origin": "builtin", "owner": owner, "lease_until": lease,
            })  # fmt: skip
            self.store.start_task(task_id, owner, lease)
            self._builtin_tasks[task_id] = worker
            return
        if self._builtin_tasks.get(task_id) != worker:
            raise ValueError(f"worker {worker} did not start task {task_id!r}")
        usage = data.get("usage") or {}
        if type(usage) is not dict or not all(type(v) is int for v in usage.values()):
            raise ValueError("usage must map names to integers")
        if kind == "task.step" and type(data.get("step")) is dict:
            self.store.add_task_step(task_id, data["step"], usage)
        elif kind == "task.finish" and data.get("status") in TASK_DONE:
            error = data.get("error")
            if error is not None and type(error) is not dict:
                raise ValueError("error must be an object")
            self.store.finish_task(task_id, data["status"], result=data.get("result"),
                                   error=error, usage=usage)
            del self._builtin_tasks[task_id]
        else:
            raise ValueError(f"unknown or malformed record {kind!r}")

    async def close(self) -> None:
        """Stop: running tasks are given back (the next server to look, this one restarted
        or another on the same database, resumes them from their checkpoints); running
        steps go back to pending without spending an attempt... unless a lease keeper
        elsewhere gets them first."""
        self._closing = True
        for bg in self._background:
            bg.cancel()
        running = [*self._tasks.values(), *self._steps.values()]
        for job in running:
            job.cancel()
        await asyncio.gather(*self._background, *running, return_exceptions=True)
        await self.models.close()
        await self.executor.close()
        self._db_threads.shutdown(wait=False)

    def _lease(self) -> float:
        return time.time() + self.lease_s

    async def _db(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        if self._inline_db:
            return fn(*args, **kw)
        call = functools.partial(fn, *args, **kw)
        return await asyncio.get_running_loop().run_in_executor(self._db_threads, call)

    async def list_runs(
        self, kind: RunKind, status: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[dict[str, Any]]:
        """Tasks or workflows, newest first; ``status`` filters."""
        read = self.store.list_tasks if kind == "task" else self.store.list_workflows
        return await self._db(read, status, limit, offset)  # type: ignore[no-any-return]

    async def _found(
        self, kind: str, read: Callable[[str], dict[str, Any] | None], id: str
    ) -> dict[str, Any]:
        record = await self._db(read, id)
        if record is None:
            raise NotFound(f"no {kind} {id!r}")
        return record  # type: ignore[no-any-return]

    # -- events ---------------------------------------------------------------------------

    def _notify(self, stream: str) -> None:
        for ev in self._listeners.get(stream, ()):
            ev.set()

    async def events(self, stream: str, after: int = 0) -> AsyncIterator[tuple[int, str, Any]]:
        """The stream's events after sequence number ``after``, live, until the terminal one
        (``complete`` or ``error``); a finished run replays and ends at once."""
        ev = asyncio.Event()
        self._listeners.setdefault(stream, set()).add(ev)
        try:
            while True:
                ev.clear()
                batch = await self._db(self.store.events_after, stream, after)
                for seq, name, data in batch:
                    after = seq
                    yield seq, name, data
                    if name in TERMINAL_EVENTS:
                        return
                if batch:
                    continue
                # Other servers write to the same database: poll as well as listen.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ev.wait(), POLL_S)
        finally:
            listeners = self._listeners.get(stream)
            if listeners is not None:
                listeners.discard(ev)
                if not listeners:
                    self._listeners.pop(stream, None)

    async def _finished(
        self,
        stream: str,
        get: Callable[[str], Awaitable[dict[str, Any]]],
        id: str,
        timeout: float | None,
    ) -> dict[str, Any]:
        """``get(id)`` once ``stream`` has ended (``NotFound`` at once for an unknown id)."""

        async def until_done() -> dict[str, Any]:
            async for _seq, name, _data in self.events(stream):
                if name in TERMINAL_EVENTS:
                    break
            return await get(id)

        await get(id)
        return await asyncio.wait_for(until_done(), timeout)

    # -- agents ---------------------------------------------------------------------------

    def agent_view(self, spec: AgentSpec, busy: set[str]) -> dict[str, Any]:
        return {
            "id": spec.id,
            "status": "busy" if spec.id in busy else "idle",
            "capabilities": list(spec.tools),
            "model": qualified_model(spec.model),
            "description": spec.description,
            "system_prompt": spec.system_prompt,
            "source": spec.source,
            "version": spec.version,
            "approvals": spec.approvals or {},
        }

    async def list_agents(self) -> list[dict[str, Any]]:
        specs = await self._db(self.agents.list)
        busy = await self._db(self.agents.busy_ids)
        return [self.agent_view(s, busy) for s in specs]

    async def get_agent(self, id: str) -> dict[str, Any]:
        spec = await self._db(self.agents.get, id)
        if spec is None:
            raise NotFound(f"no agent {id!r}")
        busy = await self._db(self.agents.busy_ids)
        return self.agent_view(spec, busy)

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
            await self._db(self.agents.register, spec)
        except ValueError as exc:
            raise Invalid(str(exc), where="id") from None
        return await self.get_agent(id)

    async def remove_agent(self, id: str) -> None:
        try:
            removed = await self._db(self.agents.remove, id)
        except ValueError as exc:
            raise Conflict(str(exc)) from None
        if not removed:
            raise NotFound(f"no agent {id!r}")

    # -- tasks ----------------------------------------------------------------------------

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
    ) -> dict[str, Any]:
        """Record a task and start it in the background; returns the task record. In a
        thread (``thread_id``) it starts from the conversation of the thread's last task
        (``409`` while a task of the thread is active). ``protocol``: ``native`` or ``json``
        forces the tool-call protocol; ``auto`` (or None) chooses it when the task starts
        (the model's tool support)."""
        agent_id = agent or DEFAULT_AGENT
        spec = await self._db(self.agents.get, agent_id)
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
        policy = merge(self.policy, spec.approvals, parse_policy(approvals))
        if approval_timeout_s is None:
            approval_timeout_s = self.settings.approval_timeout_s
        task_id = _new_id("task")
        row = {
            "id": task_id,
            "goal": goal,
            "tools": tools,
            "max_steps": max_steps,
            "agent": agent_id,
            "model": qualified_model(model or spec.model),
            "status": "pending",
            "steps": [],
            "result": None,
            "error": None,
            "usage": {},
            "created_at": time.time(),
            "started_at": None,
            "finished_at": None,
            "origin": origin,
            "owner": self.instance,
            "lease_until": self._lease(),
            "approvals": policy,
            "approval_timeout_s": approval_timeout_s,
            "pending": None,
            "wait_until": None,
            "thread_id": thread_id,
            # Forced, or chosen (and recorded) when the task starts.
            "protocol": None if protocol == "auto" else protocol,
        }
        record = await self._db(
            functools.partial(self.store.insert_task, row, continues=_conversation)
        )
        # In a thread its history was made in the store: the run reads the row back.
        self._launch(task_id, spec, row if thread_id is None else None, resume=False)
        return record  # type: ignore[no-any-return]

    async def fork_task(
        self,
        task_id: str,
        *,
        checkpoint: int,
        tool_result: str | None = None,
        message: str | None = None,
        max_steps: int | None = None,
        thread_id: str | None = None,
    ) -> dict[str, Any]:
        """Start a new task from task ``task_id``'s steps ``0..checkpoint-1`` (its history
        up to step ``checkpoint``), with the last kept call's result replaced by
        ``tool_result`` and ``message`` added after them. The fork replays the copied
        checkpoint of the kept steps: no model turn before the fork point is asked again and
        no tool call runs again. The original is not changed (it may be running)."""
        loaded = await self._db(self.store.checkpoint, task_id)
        if loaded is None:
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
        new_id = _new_id("task")
        row = {
            "id": new_id,
            **{c: getattr(original, c) for c in ("goal", "tools", "agent", "model", "history")},
            # The same protocol: the copied checkpoint is replayed in it.
            **{c: getattr(original, c) for c in ("approvals", "approval_timeout_s", "protocol")},
            "max_steps": max_steps,
            "status": "pending",
            "steps": steps,
            "result": None,
            "error": None,
            "usage": usage,
            "created_at": time.time(),
            "started_at": None,
            "finished_at": None,
            "origin": "api",
            "owner": self.instance,
            "lease_until": self._lease(),
            "pending": None,
            "wait_until": None,
            "thread_id": thread_id,
            "forked_from": task_id,
            "fork_checkpoint": checkpoint,
        }
        record = await self._db(
            functools.partial(
                self.store.insert_task, row, copied, new_thread=thread_id is not None
            )
        )
        self._launch(new_id, None, row, resume=False)
        return record  # type: ignore[no-any-return]

    async def get_thread(self, thread_id: str) -> dict[str, Any]:
        """A thread: its tasks, oldest first (``404`` for a thread with none)."""
        tasks = await self._db(self.store.thread, thread_id)
        if not tasks:
            raise NotFound(f"no thread {thread_id!r}")
        return {"id": thread_id, "tasks": tasks}

    def _launch(
        self, task_id: str, spec: AgentSpec | None, row: dict[str, Any] | None, *, resume: bool
    ) -> None:
        """Run a task in the background: a new one (``pending``), or one this server has
        just claimed in status ``running`` (``resume``: from its checkpoint)."""
        if self._closing:
            return  # the task keeps its lease until it runs out; then it is taken over
        previous = self._tasks.get(task_id)
        if previous is not None:
            # Its last run is still returning (it has just stopped to wait, and the decision
            # came at once): start once that one is done (and gone from ``_tasks``).
            previous.add_done_callback(lambda _t: self._launch(task_id, spec, row, resume=resume))
            return
        run = asyncio.get_running_loop().create_task(
            self._run_task(task_id, spec, row, resume=resume)
        )
        self._tasks[task_id] = run
        run.add_done_callback(lambda _t: self._tasks.pop(task_id, None))

    async def _run_task(
        self,
        task_id: str,
        spec: AgentSpec | None,
        row: dict[str, Any] | None,
        *,
        resume: bool,
    ) -> None:
        stream = f"task:{task_id}"
        try:
            async with self._task_slots:
                await self._run_task_body(task_id, spec, row, stream, resume)
        except asyncio.CancelledError:
            if self._closing:
                # Give it back: the next server to look resumes it from its checkpoint.
                await asyncio.shield(self._db(self.store.release_task, task_id, self.instance))
            raise
        except Exception as exc:  # a bug must not leave the task running forever
            log.exception("task %s crashed", task_id)
            await self._db(
                self.store.finish_task,
                task_id,
                "failed",
                error={"kind": "InternalError", "message": f"{type(exc).__name__}: {exc}"},
            )
        finally:
            self._notify(stream)

    async def _unresumable(self, task_id: str, why: str) -> None:
        error = {**INTERRUPTED, "message": f"the task cannot be resumed: {why}"}
        await self._db(self.store.finish_task, task_id, "failed", error=error)

    async def _run_task_body(
        self,
        task_id: str,
        spec: AgentSpec | None,
        row: dict[str, Any] | None,
        stream: str,
        resume: bool,
    ) -> None:
        owner = self.instance
        journal = Journal()
        recorded_steps = 0
        if resume:
            try:
                loaded = await self._db(self.store.checkpoint, task_id)
            except Exception as exc:  # a row that cannot even be decoded
                await self._unresumable(task_id, f"{type(exc).__name__}: {exc}")
                return
            if loaded is None:
                return
            task_row, entries = loaded
            if task_row.status != "running" or task_row.owner != owner:
                return
            try:
                journal = Journal.load(entries)
                if not isinstance(task_row.steps, list):
                    raise CheckpointError("the recorded steps are not a list")
                if len(journal.replies) < len(task_row.steps):
                    # Every step had a model reply: steps recorded without them (a task
                    # started before checkpoints existed) cannot be replayed.
                    raise CheckpointError(
                        f"{len(task_row.steps)} steps recorded but only "
                        f"{len(journal.replies)} model replies"
                    )
            except CheckpointError as exc:
                await self._unresumable(task_id, str(exc))
                return
            bad = unknown_tools(list(task_row.tools))
            if bad:
                await self._unresumable(task_id, f"unknown builtin {', '.join(map(repr, bad))}")
                return
            recorded_steps = len(task_row.steps)
            row = {c: getattr(task_row, c) for c in task_row._fields}
        else:
            if not await self._db(self.store.start_task, task_id, owner, self._lease()):
                return
            if row is None:  # claimed after its server died, before it started
                row = await self._db(self.store.task_row, task_id)
                if row is None:
                    return
            if row.get("forked_from") is not None:
                # A fork starts from the checkpoint copied from its original: a resume.
                await self._run_task_body(task_id, spec, None, stream, True)
                return
        assert row is not None
        if spec is None:
            spec = await self._db(self.agents.get, row["agent"])
        system = spec.system_prompt if spec is not None else DEFAULT_PROMPT
        self._notify(stream)
        policy: dict[str, Any] = row.get("approvals") or {}
        chars = self.settings.agent_observation_chars
        usage: dict[str, int] = {}
        turns = 0
        # The results of the calls being completed, recorded with their step.
        completing: list[tuple[str, dict[str, Any]]] = []
        # The tool-call protocol: recorded on the task before its first model turn, and
        # kept for its whole run (its checkpoint is replayed in it). A task recorded
        # without one but with model replies ran before there was a choice: JSON.
        protocol: str | None = row.get("protocol")
        # Not forced (``auto``, chosen now or before a restart): may fall back to JSON.
        chosen = protocol is None or journal.chosen_protocol is not None
        if protocol is None:
            protocol = "json" if journal.replies else await self.models.protocol(row["model"])
            # Only a choice of native calls can still change (to JSON), so only it is kept.
            if not await self._db(self.store.set_task_protocol, task_id, owner, protocol,
                                  chosen=protocol == "native" and not journal.replies):
                return

        # A JSON-protocol model reply waits here to be written in the same transaction as
        # what it leads to (its call starting, its step, its approval request): one write
        # per step fewer, and still recorded before anything it asked for happens.
        unwritten: list[tuple[str, dict[str, Any]]] = []
        # This run is the only writer of the task's checkpoint while it holds it: the last
        # entry's number is kept here rather than read in each transaction (the first write
        # reads it). Its writes go one at a time (native calls of a turn run concurrently,
        # and on PostgreSQL each write is in a worker thread).
        seq = CheckpointSeq()
        writing = asyncio.Lock()

        async def write(fn: Callable[..., bool], *args: Any) -> bool:
            async with writing:
                return bool(await self._db(fn, *args, seq))

        def take_unwritten(*more: tuple[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:  # fmt: skip
            entries = [*unwritten, *more]
            unwritten.clear()
            return entries

        async def record(kind: str, data: dict[str, Any]) -> None:
            entries = take_unwritten((kind, data))
            if not await write(self.store.add_checkpoint, task_id, owner, entries):
                # Cancelled (perhaps through another server), or taken over.
                raise asyncio.CancelledError()

        async def chat(messages: list[dict[str, Any]], schema: dict[str, Any]) -> Reply:
            nonlocal turns
            turn, turns = turns, turns + 1
            if turn < len(journal.replies):
                return journal.replies[turn]
            # A reply that was not an action is written before the model is asked again.
            if unwritten and not await write(self.store.add_checkpoint, task_id, owner, take_unwritten()):  # fmt: skip
                raise asyncio.CancelledError()
            reply = await self.models.chat(row["model"], messages, schema)
            unwritten.append(("model", {"turn": turn, "reply": reply.text, "usage": reply.usage}))
            return reply

        async def chat_tools(messages: list[dict[str, Any]], specs: list[dict[str, Any]]) -> Reply:  # fmt: skip
            nonlocal turns
            turn, turns = turns, turns + 1
            if turn < len(journal.replies):
                return journal.replies[turn]
            reply = await self.models.chat_tools(row["model"], messages, specs)
            entry: dict[str, Any] = {"turn": turn, "reply": reply.text, "usage": reply.usage}
            if reply.tool_calls:
                entry["tool_calls"] = reply.tool_calls
            await record("model", entry)
            return reply

        async def completed(index: int, cid: str, name: str, args: dict[str, Any], done: ToolResult) -> ToolResult:  # fmt: skip
            entry = {"index": index, "call_id": cid, "tool": name, "args": args,
                     "observation": done.observation, "error": done.error}  # fmt: skip
            if protocol == "native":
                # One of perhaps several calls of the turn, which end at different times:
                # each result is recorded as it comes, so that a call that completed is
                # not taken for one that was interrupted if the server dies meanwhile.
                await record("result", entry)
            else:
                completing.append(("result", entry))  # recorded with its step
            return done

        async def run_call(index: int, name: str, args: dict[str, Any], cid: str) -> ToolResult:
            done = journal.results.get(cid)
            if done is not None:
                ran = done["args"]
                return ToolResult(
                    done["observation"], done.get("error"), ran if ran != args else None
                )
            b = lookup(name)
            effect = b.effect if b is not None else "pure"
            run_args = args
            item = {"call_id": cid, "tool": name, "args": args, "effect": effect}
            last = journal.last.get(cid)
            if last is None:
                rule, why = decide(policy, name, effect)
                if rule == "deny":
                    message = f"{name} was not run: {why}"
                    error = {"kind": "PermissionError", "message": message}
                    return await completed(index, cid, name, args, ToolResult(f"PermissionError: {message}", error))  # fmt: skip
                if rule == "ask":
                    raise Interrupt([{**item, "reason": why}])
            else:
                kind, data = last
                if kind == "call":
                    # It was running when its server stopped: it may or may not have done
                    # what it does.
                    run_args = data["args"]
                    if effect not in REPEATABLE:
                        raise Interrupt([{**item, "args": run_args, "reason": (
                            f"interrupted: {name} (effect {effect!r}) was running when its "
                            "server stopped, and may or may not have taken effect; approve "
                            "to run it again, reject to go on without it")}])  # fmt: skip
                elif kind == "ask":
                    raise Interrupt([{**item, "args": data["args"], "reason": data.get("reason", "")}])  # fmt: skip
                elif data["decision"] == "reject":
                    message = data.get("message") or f"a person rejected the call of {name}"
                    error = {"kind": "RejectedError", "message": message}
                    return await completed(index, cid, name, args, ToolResult(message, error))
                else:
                    run_args = data["args"]
            await record("call", {"index": index, "call_id": cid, "tool": name,
                                  "args": run_args, "effect": effect})  # fmt: skip
            envelope = await self.executor.run(Job("call", builtin=name, kwargs=run_args))
            observation, failure = observation_of(envelope, chars)
            done_args = run_args if run_args != args else None
            return await completed(
                index, cid, name, run_args, ToolResult(observation, failure, done_args)
            )

        async def on_step(step: dict[str, Any]) -> None:
            for key, value in (step.get("usage") or {}).items():
                usage[key] = usage.get(key, 0) + value
            entries = take_unwritten(*completing)
            completing.clear()
            if step["index"] < recorded_steps:
                return  # replayed: recorded before
            step_args = (task_id, step, dict(usage), entries, owner)
            if not await write(self.store.add_task_step, *step_args):
                # Cancelled (perhaps through another server) while this step ran.
                raise asyncio.CancelledError()
            self._notify(stream)

        async def run_loop(protocol: str) -> Outcome:
            common: dict[str, Any] = {
                "goal": row["goal"], "tools": row["tools"], "max_steps": row["max_steps"],
                "system": system, "run_call": run_call, "on_step": on_step,
                "observation_chars": chars, "history": row.get("history"),
                "notes": journal.notes,
            }  # fmt: skip
            if protocol == "native":
                return await run_native_loop(chat=chat_tools, **common)
            return await run_agent_loop(chat=chat, **common)

        try:
            try:
                outcome = await run_loop(protocol)
            except ToolsUnsupported:
                if not chosen or turns != 1 or journal.replies:
                    raise
                # Refused at the first turn: nothing happened yet, so the task starts over
                # with JSON actions (and the model gets them from now on).
                turns = 0
                protocol = "json"
                if not await self._db(self.store.set_task_protocol, task_id, owner, protocol):
                    return
                outcome = await run_loop(protocol)
        except Interrupt as stop:
            timeout = row.get("approval_timeout_s")
            until = time.time() + timeout if timeout else None
            # Results of the turn's calls that completed while others wait are kept: they
            # are not run again when the task resumes.
            done_entries = take_unwritten(*completing)
            completing.clear()
            if await self._db(self.store.wait_task, task_id, owner, stop.pending, until, dict(usage), done_entries):  # fmt: skip
                await self._step_status(task_id, row, "waiting")
            return
        except ModelError as exc:
            await self._db(
                self.store.finish_task,
                task_id,
                "failed",
                error={"kind": "ProviderError", "message": str(exc)},
                usage=dict(usage),
            )
            return
        await self._db(
            self.store.finish_task,
            task_id,
            outcome.status,
            result=outcome.result,
            error=outcome.error,
            usage=outcome.usage,
        )

    async def _step_status(self, task_id: str, row: dict[str, Any], status: str) -> None:
        """A workflow step's task waits for a person, or goes on: tell the workflow."""
        if row.get("origin", "workflow") != "workflow":
            return
        wf_id = await self._db(self.store.task_step_event, task_id, status)
        if wf_id is not None:
            self._notify(f"workflow:{wf_id}")

    async def get_task(self, task_id: str) -> dict[str, Any]:
        return await self._found("task", self.store.get_task, task_id)

    async def task_checkpoint(self, task_id: str) -> list[dict[str, Any]]:
        """The task's checkpoint entries, in order."""
        entries = await self._db(self.store.checkpoint_entries, task_id)
        if entries is None:
            raise NotFound(f"no task {task_id!r}")
        return entries  # type: ignore[no-any-return]

    async def cancel_task(self, task_id: str) -> dict[str, Any]:
        """Cancel a pending, running or waiting task (``409`` once it has finished)."""
        record = await self._db(
            self.store.finish_task,
            task_id,
            "cancelled",
            error={"kind": "CancelledError", "message": "the task was cancelled"},
        )
        if record is None:
            current = await self.get_task(task_id)
            raise Conflict(f"task {task_id!r} already {current['status']}")
        run = self._tasks.get(task_id)
        if run is not None:
            run.cancel()
        self._notify(f"task:{task_id}")
        return record  # type: ignore[no-any-return]

    async def approve_task(
        self, task_id: str, *, args: dict[str, Any] | None = None, call_id: str | None = None
    ) -> dict[str, Any]:
        """Approve a waiting task's pending call (``args``: run it with these instead); the
        task resumes here. ``409`` unless it is waiting."""

        def check(item: dict[str, Any], edited: Any) -> tuple[str, str] | None:
            return check_call_args(item["tool"], edited)

        return await self._decide(task_id, approve=True, call_id=call_id, args=args, check=check)

    async def reject_task(
        self, task_id: str, *, message: str | None = None, call_id: str | None = None
    ) -> dict[str, Any]:
        """Reject a waiting task's pending call: the model is told ``message`` instead of
        its result, and the task goes on. ``409`` unless it is waiting."""
        return await self._decide(task_id, approve=False, call_id=call_id, message=message)

    async def _decide(self, task_id: str, **kw: Any) -> dict[str, Any]:
        got = await self._db(
            functools.partial(
                self.store.decide, task_id, owner=self.instance, lease_until=self._lease(), **kw
            )
        )
        stream = f"task:{task_id}"
        if got["resumed"]:
            await self._step_status(task_id, got["record"], "running")
            self._launch(task_id, None, None, resume=True)
        self._notify(stream)
        return got["record"]  # type: ignore[no-any-return]

    async def _approval_timer(self) -> None:
        """Reject the pending calls of tasks that waited longer than their approval
        timeout (on whichever server notices first: the decision is conditional)."""
        while True:
            await asyncio.sleep(min(1.0, max(0.2, self.lease_s / 3)))
            try:
                for task_id, pending in await self._db(self.store.overdue_waits, time.time()):
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

    async def wait_task(self, task_id: str, timeout: float | None = None) -> dict[str, Any]:
        """The task record once it has finished (``TimeoutError`` after ``timeout`` s)."""
        return await self._finished(f"task:{task_id}", self.get_task, task_id, timeout)

    # -- workflows ------------------------------------------------------------------------

    async def create_workflow(self, body: Any) -> dict[str, Any]:
        req = body if isinstance(body, WorkflowRequest) else parse_workflow(body)
        p = plan(req)
        for i, sid in enumerate(p.steps):
            task = p.steps[sid].task
            if task is None:
                continue
            if task.tools is not None:
                bad = unknown_tools(task.tools)
                if bad:
                    raise Invalid(
                        f"steps[{i}].task.tools: unknown builtin {', '.join(map(repr, bad))}",
                        where=f"steps[{i}].task.tools",
                    )
            if task.agent is not None and await self._db(self.agents.get, task.agent) is None:
                raise Invalid(
                    f"steps[{i}].task.agent: no agent {task.agent!r}",
                    where=f"steps[{i}].task.agent",
                )
        wf_id = _new_id("wf")
        self._plans[wf_id] = p
        await self._db(self.store.insert_workflow, wf_id, p)
        self._wake.set()
        return await self.get_workflow(wf_id)

    async def get_workflow(self, wf_id: str) -> dict[str, Any]:
        return await self._found("workflow", self.store.get_workflow, wf_id)

    async def cancel_workflow(self, wf_id: str) -> dict[str, Any]:
        previous, running = await self._db(self.store.cancel_workflow, wf_id)
        if previous is None:
            raise NotFound(f"no workflow {wf_id!r}")
        if previous not in ("pending", "running"):
            raise Conflict(f"workflow {wf_id!r} already {previous}")
        for sid in running:
            job = self._steps.get((wf_id, sid))
            if job is not None:
                job.cancel()
        self._forget(wf_id)
        self._notify(f"workflow:{wf_id}")
        return await self.get_workflow(wf_id)

    async def wait_workflow(self, wf_id: str, timeout: float | None = None) -> dict[str, Any]:
        """The workflow record once it has finished (``TimeoutError`` after ``timeout`` s)."""
        return await self._finished(f"workflow:{wf_id}", self.get_workflow, wf_id, timeout)

    def _load_plan(self, wf_id: str) -> Plan | None:
        p = self._plans.get(wf_id)
        if p is not None:
            return p
        definition = self.store.definition(wf_id)
        if definition is None:
            return None
        p = plan(WorkflowRequest.model_validate(definition))
        self._plans[wf_id] = p
        return p

    async def _scheduler(self) -> None:
        """Each round records every step outcome that came in since the last one and claims
        as many runnable steps as there is room for (on SQLite in one transaction). Woken by
        finished steps and new workflows; polls as well, for work that other servers made
        runnable."""
        while True:
            try:
                self._wake.clear()
                batch, self._outcomes = self._outcomes, []
                # Steps whose outcome is being recorded no longer hold a place.
                finishing = sum((o.workflow_id, o.step_id) in self._steps for o, _f in batch)
                free = self.capacity - len(self._steps) + finishing
                try:
                    succeeded, ended, claimed = await self._db(
                        self.store.step_round,
                        [o for o, _f in batch],
                        self.instance,
                        self._lease(),
                        free,
                    )
                except Exception as exc:
                    # Each step's run then records its failure on its own.
                    for _o, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    raise
                self._recorded(batch, succeeded, ended)
                loop = asyncio.get_running_loop()
                for wf_id, sid, attempt in claimed:
                    p = self._plans.get(wf_id) or await self._db(self._load_plan, wf_id)
                    if p is None:
                        continue
                    job = loop.create_task(self._run_step(p, wf_id, sid, attempt))
                    key = (wf_id, sid)
                    self._steps[key] = job
                    job.add_done_callback(functools.partial(self._step_done, key))
                for wf_id in {c[0] for c in claimed} | {o.workflow_id for o, _f in batch}:
                    self._notify(f"workflow:{wf_id}")
                if (claimed and len(claimed) == free) or self._outcomes:
                    # Let the steps just finished or started move, then go round again.
                    await asyncio.sleep(0)
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), POLL_S)
                # Steps finishing in the same moment join one round.
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("workflow scheduler")
                await asyncio.sleep(POLL_S)

    def _recorded(
        self,
        batch: list[tuple[StepOutcome, asyncio.Future[None]]],
        succeeded: set[tuple[str, str]],
        ended: dict[str, str],
    ) -> None:
        for o, fut in batch:
            key = (o.workflow_id, o.step_id)
            if key in succeeded:
                self._results.setdefault(o.workflow_id, {})[o.step_id] = o.result
            # Recorded: the step no longer holds a place (its run only has to return).
            self._steps.pop(key, None)
            if not fut.done():
                fut.set_result(None)
        for wf_id in ended:
            self._forget(wf_id)

    def _forget(self, wf_id: str) -> None:
        self._results.pop(wf_id, None)
        self._plans.pop(wf_id, None)

    def _step_done(self, key: tuple[str, str], job: asyncio.Task[Any]) -> None:
        # A step whose outcome a round recorded gave its place back then; one that ended
        # otherwise (cancelled, crashed) frees its place now, and the scheduler may fill it.
        if self._steps.get(key) is job:
            self._steps.pop(key, None)
            self._wake.set()

    async def _scope(self, wf_id: str, ancestors: list[str]) -> dict[str, Any]:
        known = self._results.get(wf_id, {})
        scope = {a: {"result": known[a]} for a in ancestors if a in known}
        missing = [a for a in ancestors if a not in known]
        if missing:
            scope.update(await self._db(self.store.step_scope, wf_id, missing))
        return scope

    async def _record(self, outcome: StepOutcome) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outcomes.append((outcome, fut))
        self._wake.set()
        await fut

    async def _run_step(self, p: Plan, wf_id: str, sid: str, attempt: int) -> None:
        step = p.steps[sid]
        stream = f"workflow:{wf_id}"
        try:
            scope = {"inputs": p.inputs, "steps": await self._scope(wf_id, p.ancestors[sid])}
            try:
                async with asyncio.timeout(step.timeout_s):
                    ok, result, error = await self._execute_step(wf_id, sid, step, scope)
            except TimeoutError:
                ok, result, error = (
                    False,
                    None,
                    {
                        "kind": "TimeoutError",
                        "message": f"step {sid!r} exceeded timeout_s={step.timeout_s:g}",
                    },
                )
            await self._record(StepOutcome(p, wf_id, sid, ok, result, error, step.backoff_s))
        except asyncio.CancelledError:
            if self._closing:
                # Give the step back without spending its attempt: a restart runs it again.
                await asyncio.shield(
                    self._db(self.store.release_step, wf_id, sid, self.instance, spend=False)
                )
            raise
        except Exception as exc:
            log.exception("step %s/%s crashed", wf_id, sid)
            await self._db(
                self.store.finish_step, p, wf_id, sid, self.instance,
                ok=False, error={"kind": "InternalError", "message": f"{type(exc).__name__}: {exc}"},
            )  # fmt: skip
            self._notify(stream)

    async def _execute_step(
        self, wf_id: str, sid: str, step: Any, scope: dict[str, Any]
    ) -> tuple[bool, Any, dict[str, Any] | None]:
        if step.run is not None:
            limits = {"wall_time_s": step.timeout_s} if step.timeout_s else None
            envelope = await self.executor.run(
                Job("program", source=step.run, variables=scope, limits=limits)
            )
            if envelope.get("success"):
                return True, envelope.get("value"), None
            err = envelope.get("error") or {}
            return (
                False,
                None,
                {k: err.get(k) for k in ("kind", "message", "line", "column", "hint")},
            )
        task = step.task
        # A run before this one (on a server that stopped) started a task that lives on, or
        # already succeeded: wait for that one rather than starting another.
        record = await self._db(self.store.step_task, wf_id, sid)
        if record is None or record["status"] in ("failed", "cancelled"):
            try:
                goal = interpolate(task.goal, scope)
            except KeyError as exc:
                return False, None, {"kind": "KeyError", "message": str(exc.args[0])}
            try:
                record = await self.create_task(
                    goal=goal, tools=task.tools, max_steps=task.max_steps, agent=task.agent,
                    model=task.model, origin="workflow", approvals=task.approvals,
                    approval_timeout_s=task.approval_timeout_s, thread_id=task.thread_id,
                    protocol=task.protocol,
                )  # fmt: skip
            except Conflict as exc:  # its thread is busy: the step fails (and may retry)
                return False, None, {"kind": exc.kind, "message": exc.message}
            await self._db(self.store.set_step_task, wf_id, sid, record["id"])
        try:
            done = await self.wait_task(record["id"])
        except BaseException:
            with contextlib.suppress(Conflict, NotFound):
                await asyncio.shield(self.cancel_task(record["id"]))
            raise
        if done["status"] == "succeeded":
            return True, done["result"], None
        return False, None, done["error"] or {"kind": "Error", "message": f"task {done['status']}"}

    # -- leases ---------------------------------------------------------------------------

    async def _reclaim(self, everything: bool = False) -> None:
        changed, claimed = await self._db(
            self.store.reclaim,
            self._plans,
            self._load_plan,
            self.instance,
            self._lease(),
            everything=everything,
        )
        for task_id, status in claimed:
            # A task not started yet starts; a running one resumes from its checkpoint.
            self._launch(task_id, None, None, resume=status == "running")
            self._notify(f"task:{task_id}")
        for wf_id in changed:
            self._notify(f"workflow:{wf_id}")
        if changed:
            self._wake.set()

    async def _keeper(self) -> None:
        interval = max(0.2, self.lease_s / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                await self._db(self.store.renew, self.instance, self._lease())
                if self._steps:
                    # A step cancelled through another server: stop it here.
                    statuses = await self._db(self.store.step_statuses, self.instance)
                    for key, job in list(self._steps.items()):
                        if statuses.get(key) not in (None, "running"):
                            job.cancel()
                for task_id, run in list(self._tasks.items()):
                    status = await self._db(self.store.task_status, task_id)
                    if status in TASK_DONE:
                        run.cancel()
                await self._reclaim()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("orchestration lease keeper")

    # -- metrics --------------------------------------------------------------------------

    async def active_counts(self) -> dict[str, int]:
        """``{active_tasks, waiting_tasks}``, cheaply (the status history reads it every 2 s)."""
        return await self._db(self.store.active_counts)  # type: ignore[no-any-return]

    async def metrics(self) -> dict[str, int]:
        figures = await self._db(self.store.metrics)
        registered = figures.pop("registered_agents")
        return {"total_agents": registered + 1, **figures}


def _check_builtin_insert(data: dict[str, Any]) -> None:
    ok = (
        re.fullmatch(r"task_[0-9a-f]{16}", data["id"]) is not None
        and type(data.get("goal")) is str
        and type(data.get("tools")) is list and all(type(n) is str for n in data["tools"])
        and type(data.get("max_steps")) is int and 0 < data["max_steps"] <= 1000
        and type(data.get("model")) is str
        and type(data.get("timeout")) in (int, float) and data["timeout"] > 0
    )
    if not ok:
        raise ValueError("a malformed task.insert record")
