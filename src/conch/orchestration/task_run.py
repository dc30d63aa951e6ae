"""One run of one agent task on this server: the loop, the task's checkpoint as it goes, and
its tool calls under the task's approval policy.

A run starts a new task, or resumes one this server has just taken (after its server died,
or once a person decided on its waiting calls): resuming is replaying, the recorded model
replies and call results answering the loop's requests in order (:class:`Journal`), and
only what never completed is asked or run again. The run writes every model reply and tool
call to the checkpoint before anything it leads to happens, and stops (status ``waiting``)
at a call that needs a person's approval.

Each model request streams to the task's live subscribers when, as it starts, the task has
some (:mod:`.live`), and is asked again with backoff while the model server is not up, for
at most ``model_retry_s`` (after a restart the agent server may be up before it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from conch.config import Settings
from conch.lang.builtins.registry import lookup
from conch.orchestration.agents import DEFAULT_PROMPT, AgentRegistry, AgentSpec
from conch.orchestration.approvals import REPEATABLE, decide
from conch.orchestration.checkpoints import CheckpointError, Journal
from conch.orchestration.executor import Executor
from conch.orchestration.loop import Outcome, run_loop
from conch.orchestration.models import DeltaFn, ModelClient
from conch.orchestration.protocols import unknown_tools
from conch.orchestration.runtime import Runtime
from conch.orchestration.store import INTERRUPTED, CheckpointSeq
from conch.orchestration.turns import (
    Interrupt,
    ModelError,
    ModelUnavailable,
    Reply,
    ToolResult,
    ToolsUnsupported,
    observation_of,
)
from conch.sandbox.jobs import Job

log = logging.getLogger("conch.orchestration")

Entry = tuple[str, dict[str, Any]]
T = TypeVar("T")
# A model server that is not up is asked again after these pauses, doubling, for at most
# ``model_retry_s`` in all.
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 5.0
# Tell the workflow whose step runs a task that the step is now ``waiting`` or ``running``.
StepStatusFn = Callable[[str, dict[str, Any], str], Awaitable[None]]


class TaskSessions(Protocol):
    """Sessions (conch.sessions.tasks.TaskSessions): where the tool calls of a task with a
    ``session`` run, and how a thread's first task or a fork gets one."""

    async def run(self, session: str, job: Job) -> dict[str, Any]: ...

    async def check(self, session: str, *, tenant: str | None = None) -> None: ...

    async def create(self, *, tenant: str | None = None) -> str: ...

    async def fork(self, source: str, *, tenant: str | None = None) -> str: ...

    async def discard(self, session: str) -> None: ...


@dataclass
class TaskDeps:
    """What a run needs besides its runtime: agents, models, where calls run (the executor,
    or the task's session)."""

    agents: AgentRegistry
    models: ModelClient
    executor: Executor
    step_status: StepStatusFn
    sessions: TaskSessions | None = None


class TaskRun:
    """One run of task ``task_id`` (``spec``: its agent when known; ``row``: its columns when
    the caller has them), on this server, which holds the task's lease."""

    def __init__(
        self,
        rt: Runtime,
        deps: TaskDeps,
        task_id: str,
        spec: AgentSpec | None,
        row: dict[str, Any] | None,
    ) -> None:
        self.rt, self.deps = rt, deps
        self.tasks, self.checkpoints = rt.stores.tasks, rt.stores.checkpoints
        self.task_id, self.spec, self.row = task_id, spec, row
        self.owner = rt.instance
        self.stream = f"task:{task_id}"
        settings: Settings = rt.settings
        self.chars = settings.agent_observation_chars
        self.retry_s = settings.model_retry_s
        self.journal = Journal()
        self.recorded_steps = 0
        self.usage: dict[str, int] = {}
        self.turns = 0
        self.system = DEFAULT_PROMPT
        self.policy: dict[str, Any] = {}
        self.protocol = "json"
        self.chosen = False
        # The results of the calls being completed, recorded with their step.
        self.completing: list[Entry] = []
        # A JSON-protocol model reply waits here to be written in the same transaction as
        # what it leads to (its call starting, its step, its approval request): one write
        # per step fewer, and still recorded before anything it asked for happens.
        self.unwritten: list[Entry] = []
        # This run is the only writer of the task's checkpoint while it holds it: the last
        # entry's number is kept here rather than read in each transaction (the first write
        # reads it). Its writes go one at a time (native calls of a turn run concurrently,
        # and on PostgreSQL each write is in a worker thread).
        self.seq = CheckpointSeq()
        self.writing = asyncio.Lock()
        # The step the next model turn belongs to, and when the task started (the live
        # events' step numbers and elapsed times).
        self.next_step = 0
        self.since: float | None = None

    async def run(self, *, resume: bool) -> None:
        """Start the task (pending) or resume it (running, held by this server)."""
        row = await (self._resumed() if resume else self._started())
        if row is None:
            return
        self.row = row
        self.since = row.get("started_at") or time.time()
        try:
            if not await self._prepare(row):
                return
        except ModelError as exc:  # the model server stayed away (for the tool-call protocol)
            await self.rt.db(
                self.tasks.finish_task, self.task_id, "failed",
                error={"kind": "ProviderError", "message": str(exc)}, usage=dict(self.usage),
            )  # fmt: skip
            return
        await self._conclude()

    # -- starting -------------------------------------------------------------------------

    async def _started(self) -> dict[str, Any] | None:
        """The row of a task this run starts; None when it is not to run here."""
        if not await self.rt.db(self.tasks.start_task, self.task_id, self.owner, self.rt.lease()):
            return None
        row = self.row
        if row is None:  # claimed after its server died, before it started
            row = await self.rt.db(self.tasks.task_row, self.task_id)
            if row is None:
                return None
        if row.get("forked_from") is not None:
            # A fork starts from the checkpoint copied from its original: a resume.
            return await self._resumed()
        return row

    async def _resumed(self) -> dict[str, Any] | None:
        """The row of a task resumed from its checkpoint (the journal read); None when it
        is not to run here, or cannot be resumed (then it is failed)."""
        try:
            loaded = await self.rt.db(self.checkpoints.checkpoint, self.task_id)
        except Exception as exc:  # a row that cannot even be decoded
            await self._unresumable(f"{type(exc).__name__}: {exc}")
            return None
        if loaded is None:
            return None
        task_row, entries = loaded
        if task_row.status != "running" or task_row.owner != self.owner:
            return None
        try:
            self.journal = Journal.load(entries)
            if not isinstance(task_row.steps, list):
                raise CheckpointError("the recorded steps are not a list")
            if len(self.journal.replies) < len(task_row.steps):
                # Every step had a model reply: steps recorded without them (a task started
                # before checkpoints existed) cannot be replayed.
                raise CheckpointError(
                    f"{len(task_row.steps)} steps recorded but only "
                    f"{len(self.journal.replies)} model replies"
                )
        except CheckpointError as exc:
            await self._unresumable(str(exc))
            return None
        bad = unknown_tools(list(task_row.tools))
        if bad:
            await self._unresumable(f"unknown builtin {', '.join(map(repr, bad))}")
            return None
        self.recorded_steps = len(task_row.steps)
        return {c: getattr(task_row, c) for c in task_row._fields}

    async def _unresumable(self, why: str) -> None:
        error = {**INTERRUPTED, "message": f"the task cannot be resumed: {why}"}
        await self.rt.db(self.tasks.finish_task, self.task_id, "failed", error=error)

    async def _prepare(self, row: dict[str, Any]) -> bool:
        """The agent, the policy and the tool-call protocol; False if the task is no longer
        this run's."""
        spec = self.spec
        if spec is None:
            spec = await self.rt.db(self.deps.agents.get, row["agent"])
        self.system = spec.system_prompt if spec is not None else DEFAULT_PROMPT
        self.rt.notify(self.stream)
        self.policy = row.get("approvals") or {}
        # The tool-call protocol: recorded on the task before its first model turn, and
        # kept for its whole run (its checkpoint is replayed in it). A task recorded
        # without one but with model replies ran before there was a choice: JSON.
        protocol: str | None = row.get("protocol")
        # Not forced (``auto``, chosen now or before a restart): may fall back to JSON.
        self.chosen = protocol is None or self.journal.chosen_protocol is not None
        if protocol is None:
            replies = self.journal.replies
            if replies:
                protocol = "json"
            else:
                protocol = await self._patiently(
                    lambda: self.deps.models.protocol(row["model"], row.get("key_id"))
                )
            # Only a choice of native calls can still change (to JSON), so only it is kept.
            if not await self.rt.db(
                self.tasks.set_task_protocol, self.task_id, self.owner, protocol,
                chosen=protocol == "native" and not replies,
            ):  # fmt: skip
                return False
        self.protocol = protocol
        return True

    # -- running --------------------------------------------------------------------------

    async def _conclude(self) -> None:
        """Run the loop to its end and record it: finished, failed, or waiting."""
        try:
            try:
                outcome = await self._loop()
            except ToolsUnsupported:
                if not self.chosen or self.turns != 1 or self.journal.replies:
                    raise
                # Refused at the first turn: nothing happened yet, so the task starts over
                # with JSON actions (and the model gets them from now on).
                self.turns = 0
                self.protocol = "json"
                if not await self.rt.db(
                    self.tasks.set_task_protocol, self.task_id, self.owner, "json"
                ):
                    return
                outcome = await self._loop()
        except Interrupt as stop:
            await self._wait(stop)
            return
        except ModelError as exc:
            await self.rt.db(
                self.tasks.finish_task, self.task_id, "failed",
                error={"kind": "ProviderError", "message": str(exc)}, usage=dict(self.usage),
            )  # fmt: skip
            return
        await self.rt.db(
            self.tasks.finish_task, self.task_id, outcome.status, result=outcome.result,
            error=outcome.error, usage=outcome.usage,
        )  # fmt: skip

    async def _loop(self) -> Outcome:
        assert self.row is not None
        row = self.row
        native = self.protocol == "native"
        return await run_loop(
            self.protocol, goal=row["goal"], tools=row["tools"], max_steps=row["max_steps"],
            system=self.system, chat=self._chat_tools if native else self._chat,
            run_call=self._run_call, on_step=self._on_step, observation_chars=self.chars,
            history=row.get("history"), notes=self.journal.notes,
        )  # fmt: skip

    async def _wait(self, stop: Interrupt) -> None:
        """The task waits for a person's decision on ``stop.pending``."""
        assert self.row is not None
        timeout = self.row.get("approval_timeout_s")
        until = time.time() + timeout if timeout else None
        # Results of the turn's calls that completed while others wait are kept: they are
        # not run again when the task resumes.
        done = self._take_unwritten(*self.completing)
        self.completing.clear()
        if await self.rt.db(
            self.checkpoints.wait_task, self.task_id, self.owner, stop.pending, until,
            dict(self.usage), done,
        ):  # fmt: skip
            await self.deps.step_status(self.task_id, self.row, "waiting")

    # -- the checkpoint -------------------------------------------------------------------

    async def _write(self, fn: Callable[..., bool], *args: Any) -> bool:
        async with self.writing:
            return bool(await self.rt.db(fn, *args, self.seq))

    def _take_unwritten(self, *more: Entry) -> list[Entry]:
        entries = [*self.unwritten, *more]
        self.unwritten.clear()
        return entries

    async def _record(self, kind: str, data: dict[str, Any]) -> None:
        entries = self._take_unwritten((kind, data))
        if not await self._write(self.checkpoints.add_checkpoint, self.task_id, self.owner, entries):  # fmt: skip
            # Cancelled (perhaps through another server), or taken over.
            raise asyncio.CancelledError()

    async def _on_step(self, step: dict[str, Any]) -> None:
        self.next_step = step["index"] + 1
        for key, value in (step.get("usage") or {}).items():
            self.usage[key] = self.usage.get(key, 0) + value
        entries = self._take_unwritten(*self.completing)
        self.completing.clear()
        if step["index"] < self.recorded_steps:
            return  # replayed: recorded before
        step_args = (self.task_id, step, dict(self.usage), entries, self.owner)
        if not await self._write(self.tasks.add_task_step, *step_args):
            # Cancelled (perhaps through another server) while this step ran.
            raise asyncio.CancelledError()
        self.rt.notify(self.stream)

    # -- the model ------------------------------------------------------------------------

    def _next_turn(self) -> int:
        turn, self.turns = self.turns, self.turns + 1
        return turn

    async def _chat(self, messages: list[dict[str, Any]], schema: dict[str, Any]) -> Reply:
        turn = self._next_turn()
        if turn < len(self.journal.replies):
            return self.journal.replies[turn]
        # A reply that was not an action is written before the model is asked again.
        if self.unwritten and not await self._write(
            self.checkpoints.add_checkpoint, self.task_id, self.owner, self._take_unwritten()
        ):
            raise asyncio.CancelledError()
        assert self.row is not None
        model, key_id = self.row["model"], self.row.get("key_id")
        reply = await self._ask(
            lambda on_delta: self.deps.models.chat(model, messages, schema, on_delta, key_id), turn
        )
        self.unwritten.append(("model", {"turn": turn, "reply": reply.text, "usage": reply.usage}))
        return reply

    async def _chat_tools(self, messages: list[dict[str, Any]], specs: list[dict[str, Any]]) -> Reply:  # fmt: skip
        turn = self._next_turn()
        if turn < len(self.journal.replies):
            return self.journal.replies[turn]
        assert self.row is not None
        model, key_id = self.row["model"], self.row.get("key_id")
        reply = await self._ask(
            lambda on_delta: self.deps.models.chat_tools(model, messages, specs, on_delta, key_id), turn
        )
        entry: dict[str, Any] = {"turn": turn, "reply": reply.text, "usage": reply.usage}
        if reply.tool_calls:
            entry["tool_calls"] = reply.tool_calls
        await self._record("model", entry)
        return reply

    async def _ask(self, ask: Callable[[DeltaFn | None], Awaitable[Reply]], turn: int) -> Reply:
        """A model turn: streamed to the task's live subscribers when it has some as it
        starts (:mod:`.live`), asked again while the model server is not up."""
        live = self.rt.live

        async def once() -> Reply:
            while True:
                watching = live.begin(self.stream, self.next_step, turn, self.since)
                request = asyncio.ensure_future(ask(None if watching is None else watching.delta))
                if watching is None:
                    live.hold(self.stream, request)
                try:
                    reply = await request
                except asyncio.CancelledError:
                    if live.restarted(self.stream, request):
                        continue  # someone began to watch at once: asked again, streamed
                    live.end(self.stream, watching, None, error="cancelled")
                    raise
                except BaseException as exc:
                    live.end(self.stream, watching, None, error=f"{type(exc).__name__}: {exc}")
                    raise
                live.end(self.stream, watching, reply.usage)
                return reply

        return await self._patiently(once, turn)

    async def _patiently(self, fn: Callable[[], Awaitable[T]], turn: int | None = None) -> T:
        """``fn()``, asked again with backoff while the model server (or its provider) is
        not up, for at most ``model_retry_s`` from the first failure; then its error."""
        first: float | None = None
        pause = RETRY_FIRST_S
        while True:
            try:
                return await fn()
            except ModelUnavailable as exc:
                now = time.monotonic()
                first = now if first is None else first
                left = self.retry_s - (now - first)
                if left <= 0:
                    if self.retry_s <= 0:
                        raise
                    raise ModelUnavailable(
                        f"{exc} (asked again for {self.retry_s:g} s: model_retry_s)"
                    ) from exc
                wait = min(pause, left)
                pause = min(pause * 2, RETRY_MAX_S)
                log.info("task %s: the model server is not up; asking again in %.2f s: %s",
                         self.task_id, wait, exc)  # fmt: skip
                if self.rt.live.watched(self.stream):
                    self.rt.live.publish(self.stream, "model_retry", {
                        "step": self.next_step, "turn": turn, "error": str(exc),
                        "retry_in_ms": int(wait * 1000), "waited_ms": int((now - first) * 1000),
                    })  # fmt: skip
                await asyncio.sleep(wait)

    # -- tool calls -----------------------------------------------------------------------

    async def _run_call(self, index: int, name: str, args: dict[str, Any], cid: str) -> ToolResult:
        done = self.journal.results.get(cid)
        if done is not None:
            ran = done["args"]
            return ToolResult(done["observation"], done.get("error"), ran if ran != args else None)
        b = lookup(name)
        effect = b.effect if b is not None else "pure"
        ruling = self._ruling(name, args, cid, effect)
        if isinstance(ruling, ToolResult):
            return await self._completed(index, cid, name, args, ruling)
        run_args = ruling
        await self._record("call", {"index": index, "call_id": cid, "tool": name,
                                    "args": run_args, "effect": effect})  # fmt: skip
        job = Job("call", builtin=name, kwargs=run_args)
        session = self.row.get("session") if self.row is not None else None
        if session is not None and self.deps.sessions is not None:
            envelope = await self.deps.sessions.run(session, job)
        else:
            envelope = await self.deps.executor.run(job)
        observation, failure = observation_of(envelope, self.chars)
        done_args = run_args if run_args != args else None
        return await self._completed(
            index, cid, name, run_args, ToolResult(observation, failure, done_args)
        )

    def _ruling(
        self, name: str, args: dict[str, Any], cid: str, effect: str
    ) -> dict[str, Any] | ToolResult:
        """The arguments a call runs with, or what the model is told instead (the policy
        denied it, a person rejected it); raises :class:`Interrupt` when it waits for a
        person's decision."""
        item = {"call_id": cid, "tool": name, "args": args, "effect": effect}
        last = self.journal.last.get(cid)
        if last is None:
            rule, why = decide(self.policy, name, effect)
            if rule == "deny":
                message = f"{name} was not run: {why}"
                error = {"kind": "PermissionError", "message": message}
                return ToolResult(f"PermissionError: {message}", error)
            if rule == "ask":
                raise Interrupt([{**item, "reason": why}])
            return args
        kind, data = last
        if kind == "call":
            # It was running when its server stopped: it may or may not have done what it does.
            if effect not in REPEATABLE:
                raise Interrupt([{**item, "args": data["args"], "reason": (
                    f"interrupted: {name} (effect {effect!r}) was running when its "
                    "server stopped, and may or may not have taken effect; approve "
                    "to run it again, reject to go on without it")}])  # fmt: skip
            return data["args"]  # type: ignore[no-any-return]
        if kind == "ask":
            raise Interrupt([{**item, "args": data["args"], "reason": data.get("reason", "")}])
        if data["decision"] == "reject":
            message = data.get("message") or f"a person rejected the call of {name}"
            return ToolResult(message, {"kind": "RejectedError", "message": message})
        return data["args"]  # type: ignore[no-any-return]

    async def _completed(
        self, index: int, cid: str, name: str, args: dict[str, Any], done: ToolResult
    ) -> ToolResult:
        entry = {"index": index, "call_id": cid, "tool": name, "args": args,
                 "observation": done.observation, "error": done.error}  # fmt: skip
        if self.protocol == "native":
            # One of perhaps several calls of the turn, which end at different times: each
            # result is recorded as it comes, so that a call that completed is not taken for
            # one that was interrupted if the server dies meanwhile.
            await self._record("result", entry)
        else:
            self.completing.append(("result", entry))  # recorded with its step
        return done
