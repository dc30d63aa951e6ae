"""The workflow scheduler: durable DAG workflows, their steps claimed and run on this server.

Workflow steps are claimed by whichever server's scheduler gets them first, so several
servers on one PostgreSQL database share a workflow and no step runs twice. Each round
records every step outcome that came in since the last one and claims as many runnable steps
as there is room for (:meth:`~.store.steps.StepStore.step_round`). A ``run`` step
goes to the executor (sandbox pool or Dask); a ``task`` step is an agent task
(:mod:`.runner`) that the step waits on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

from conch.orchestration.agents import AgentRegistry
from conch.orchestration.errors import Conflict, Invalid, NotFound
from conch.orchestration.executor import Executor
from conch.orchestration.protocols import unknown_tools
from conch.orchestration.runner import TaskRunner
from conch.orchestration.runtime import POLL_S, Runtime, new_id
from conch.orchestration.spec import Plan, WorkflowRequest, interpolate, parse_workflow, plan
from conch.orchestration.store import StepOutcome
from conch.sandbox.jobs import Job

log = logging.getLogger("conch.orchestration")

StepResult = tuple[bool, Any, dict[str, Any] | None]  # ok, result, error


class WorkflowScheduler:
    """Workflows on this server: created, scheduled, their steps run and recorded."""

    def __init__(
        self, rt: Runtime, agents: AgentRegistry, executor: Executor, runner: TaskRunner
    ) -> None:
        self.rt = rt
        self.agents = agents
        self.executor = executor
        self.runner = runner
        self.workflows = rt.stores.workflows
        self.steps = rt.stores.steps
        self.capacity = rt.settings.orchestration_max_concurrent_steps
        self.running: dict[tuple[str, str], asyncio.Task[Any]] = {}  # (workflow, step) -> run
        self.plans: dict[str, Plan] = {}
        # Results of the steps this server saw succeed, by workflow: a step's scope is read
        # from here (its ancestors' results), the database only for those run elsewhere or
        # before a restart. Dropped when the workflow ends.
        self._results: dict[str, dict[str, Any]] = {}
        # Step outcomes waiting for the scheduler's next round, which records them all in
        # one transaction; each step's run waits on its future until then.
        self._outcomes: list[tuple[StepOutcome, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Go round again now: steps may have become runnable."""
        self._wake.set()

    # -- workflows ------------------------------------------------------------------------

    async def create_workflow(
        self, body: Any, owner: str | None = None, key_id: str | None = None
    ) -> dict[str, Any]:
        """Record and start a workflow of tenant ``owner`` (made by key ``key_id``: its
        ``task`` steps' tasks are made as the same tenant and key)."""
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
            if task.agent is not None and await self.rt.db(self.agents.get, task.agent, owner) is None:
                raise Invalid(
                    f"steps[{i}].task.agent: no agent {task.agent!r}",
                    where=f"steps[{i}].task.agent",
                )
        wf_id = new_id("wf")
        self.plans[wf_id] = p
        await self.rt.db(self.workflows.insert_workflow, wf_id, p, owner, key_id)
        self._wake.set()
        return await self.get_workflow(wf_id)

    async def get_workflow(self, wf_id: str, tenant: str | None = None) -> dict[str, Any]:
        """The workflow, if ``tenant`` (``None``: any) may see it."""
        record = await self.rt.db(self.workflows.get_workflow, wf_id, tenant)
        if record is None:
            raise NotFound(f"no workflow {wf_id!r}")
        return record  # type: ignore[no-any-return]

    async def cancel_workflow(self, wf_id: str, tenant: str | None = None) -> dict[str, Any]:
        if tenant is not None:
            await self.get_workflow(wf_id, tenant)
        previous, running = await self.rt.db(self.workflows.cancel_workflow, wf_id)
        if previous is None:
            raise NotFound(f"no workflow {wf_id!r}")
        if previous not in ("pending", "running"):
            raise Conflict(f"workflow {wf_id!r} already {previous}")
        for sid in running:
            job = self.running.get((wf_id, sid))
            if job is not None:
                job.cancel()
        self._forget(wf_id)
        self.rt.notify(f"workflow:{wf_id}")
        return await self.get_workflow(wf_id)

    def load_plan(self, wf_id: str) -> Plan | None:
        """A workflow's plan: known here, or rebuilt from its stored definition."""
        p = self.plans.get(wf_id)
        if p is not None:
            return p
        definition = self.workflows.definition(wf_id)
        if definition is None:
            return None
        p = plan(WorkflowRequest.model_validate(definition))
        self.plans[wf_id] = p
        return p

    # -- rounds ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Each round records every step outcome that came in since the last one and claims
        as many runnable steps as there is room for (on SQLite in one transaction). Woken by
        finished steps and new workflows; polls as well, for work that other servers made
        runnable."""
        while True:
            try:
                self._wake.clear()
                if await self._round():
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

    async def _round(self) -> bool:
        """One round; True when another should follow at once (it filled every free place,
        or outcomes came in meanwhile)."""
        batch, self._outcomes = self._outcomes, []
        # Steps whose outcome is being recorded no longer hold a place.
        finishing = sum((o.workflow_id, o.step_id) in self.running for o, _f in batch)
        free = self.capacity - len(self.running) + finishing
        try:
            succeeded, ended, claimed = await self.rt.db(
                self.steps.step_round,
                [o for o, _f in batch],
                self.rt.instance,
                self.rt.lease(),
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
            p = self.plans.get(wf_id) or await self.rt.db(self.load_plan, wf_id)
            if p is None:
                continue
            job = loop.create_task(self._run_step(p, wf_id, sid, attempt))
            key = (wf_id, sid)
            self.running[key] = job
            job.add_done_callback(functools.partial(self._step_done, key))
        for wf_id in {c[0] for c in claimed} | {o.workflow_id for o, _f in batch}:
            self.rt.notify(f"workflow:{wf_id}")
        return bool((claimed and len(claimed) == free) or self._outcomes)

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
            self.running.pop(key, None)
            if not fut.done():
                fut.set_result(None)
        for wf_id in ended:
            self._forget(wf_id)

    def _forget(self, wf_id: str) -> None:
        self._results.pop(wf_id, None)
        self.plans.pop(wf_id, None)

    def _step_done(self, key: tuple[str, str], job: asyncio.Task[Any]) -> None:
        # A step whose outcome a round recorded gave its place back then; one that ended
        # otherwise (cancelled, crashed) frees its place now, and the scheduler may fill it.
        if self.running.get(key) is job:
            self.running.pop(key, None)
            self._wake.set()

    # -- a step ---------------------------------------------------------------------------

    async def _scope(self, wf_id: str, ancestors: list[str]) -> dict[str, Any]:
        known = self._results.get(wf_id, {})
        scope = {a: {"result": known[a]} for a in ancestors if a in known}
        missing = [a for a in ancestors if a not in known]
        if missing:
            scope.update(await self.rt.db(self.workflows.step_scope, wf_id, missing))
        return scope

    async def _record(self, outcome: StepOutcome) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outcomes.append((outcome, fut))
        self._wake.set()
        await fut

    async def _run_step(self, p: Plan, wf_id: str, sid: str, attempt: int) -> None:
        step = p.steps[sid]
        try:
            scope = {"inputs": p.inputs, "steps": await self._scope(wf_id, p.ancestors[sid])}
            try:
                async with asyncio.timeout(step.timeout_s):
                    ok, result, error = await self._execute(wf_id, sid, step, scope)
            except TimeoutError:
                message = f"step {sid!r} exceeded timeout_s={step.timeout_s:g}"
                ok, result, error = False, None, {"kind": "TimeoutError", "message": message}
            await self._record(StepOutcome(p, wf_id, sid, ok, result, error, step.backoff_s))
        except asyncio.CancelledError:
            if self.rt.closing:
                # Give the step back without spending its attempt: a restart runs it again.
                release = self.rt.stores.leases.release_step
                await asyncio.shield(
                    self.rt.db(release, wf_id, sid, self.rt.instance, spend=False)
                )
            raise
        except Exception as exc:
            log.exception("step %s/%s crashed", wf_id, sid)
            await self.rt.db(
                self.steps.finish_step, p, wf_id, sid, self.rt.instance,
                ok=False, error={"kind": "InternalError", "message": f"{type(exc).__name__}: {exc}"},
            )  # fmt: skip
            self.rt.notify(f"workflow:{wf_id}")

    async def _execute(self, wf_id: str, sid: str, step: Any, scope: dict[str, Any]) -> StepResult:
        if step.run is not None:
            return await self._run_program(step, scope)
        return await self._run_task(wf_id, sid, step.task, scope)

    async def _run_program(self, step: Any, scope: dict[str, Any]) -> StepResult:
        limits = {"wall_time_s": step.timeout_s} if step.timeout_s else None
        envelope = await self.executor.run(
            Job("program", source=step.run, variables=scope, limits=limits)
        )
        if envelope.get("success"):
            return True, envelope.get("value"), None
        err = envelope.get("error") or {}
        return False, None, {k: err.get(k) for k in ("kind", "message", "line", "column", "hint")}

    async def _run_task(self, wf_id: str, sid: str, task: Any, scope: dict[str, Any]) -> StepResult:
        # A run before this one (on a server that stopped) started a task that lives on, or
        # already succeeded: wait for that one rather than starting another.
        record = await self.rt.db(self.workflows.step_task, wf_id, sid)
        if record is not None and record["status"] == "waiting":
            # Re-attached to a task that waits for a person: the step shows it again.
            await self.runner.step_status(record["id"], record, "waiting")
        if record is None or record["status"] in ("failed", "cancelled"):
            try:
                goal = interpolate(task.goal, scope)
            except KeyError as exc:
                return False, None, {"kind": "KeyError", "message": str(exc.args[0])}
            owner, key_id = await self.rt.db(self.workflows.owner, wf_id) or (None, None)
            try:
                record = await self.runner.create_task(
                    goal=goal, tools=task.tools, max_steps=task.max_steps, agent=task.agent,
                    model=task.model, origin="workflow", approvals=task.approvals,
                    approval_timeout_s=task.approval_timeout_s, thread_id=task.thread_id,
                    protocol=task.protocol, session=task.session, owner=owner, key_id=key_id,
                )  # fmt: skip
            except Conflict as exc:  # its thread is busy: the step fails (and may retry)
                return False, None, {"kind": exc.kind, "message": exc.message}
            await self.rt.db(self.workflows.set_step_task, wf_id, sid, record["id"])
        try:
            done = await self.runner.wait_task(record["id"])
        except BaseException:
            # The step was cancelled, or timed out: so is its task. Not when this server
            # stops: then the task lives on (a waiting one keeps its pending approval, a
            # running one is given back and resumed), and the step, given back too,
            # re-attaches to it by id after the restart.
            if not self.rt.closing:
                with contextlib.suppress(Conflict, NotFound):
                    await asyncio.shield(self.runner.cancel_task(record["id"]))
            raise
        if done["status"] == "succeeded":
            return True, done["result"], None
        return False, None, done["error"] or {"kind": "Error", "message": f"task {done['status']}"}
