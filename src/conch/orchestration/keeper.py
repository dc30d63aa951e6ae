"""The lease keeper: renews this server's leases, notices work cancelled through another
server, and takes over work whose server died (tasks resume from their checkpoints; running
steps are retried if they have attempts left)."""

from __future__ import annotations

import asyncio
import logging

from conch.orchestration.runner import TaskRunner
from conch.orchestration.runtime import Runtime
from conch.orchestration.scheduler import WorkflowScheduler
from conch.orchestration.store import TASK_DONE

log = logging.getLogger("conch.orchestration")


class LeaseKeeper:
    """Every third of a lease: renew, stop what was ended elsewhere, take over the expired."""

    def __init__(self, rt: Runtime, runner: TaskRunner, scheduler: WorkflowScheduler) -> None:
        self.rt = rt
        self.runner = runner
        self.scheduler = scheduler
        self.leases = rt.stores.leases

    async def reclaim(self, everything: bool = False) -> None:
        """Take over work whose lease ran out (``everything``: all unfinished work, for a
        database that this server is the only one to use, at its start)."""
        changed, claimed = await self.rt.db(
            self.leases.reclaim,
            self.scheduler.plans,
            self.scheduler.load_plan,
            self.rt.instance,
            self.rt.lease(),
            everything=everything,
        )
        for task_id, status in claimed:
            # A task not started yet starts; a running one resumes from its checkpoint.
            self.runner.launch(task_id, None, None, resume=status == "running")
            self.rt.notify(f"task:{task_id}")
        for wf_id in changed:
            self.rt.notify(f"workflow:{wf_id}")
        if changed:
            self.scheduler.wake()

    async def run(self) -> None:
        interval = max(0.2, self.rt.lease_s / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.rt.db(self.leases.renew, self.rt.instance, self.rt.lease())
                await self._stop_cancelled()
                await self.reclaim()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("orchestration lease keeper")

    async def _stop_cancelled(self) -> None:
        """Stop the steps and tasks running here that were ended through another server."""
        steps = self.scheduler.running
        if steps:
            statuses = await self.rt.db(
                self.rt.stores.workflows.step_statuses, self.rt.instance
            )
            for key, job in list(steps.items()):
                if statuses.get(key) not in (None, "running"):
                    job.cancel()
        for task_id, run in list(self.runner.running.items()):
            status = await self.rt.db(self.rt.stores.tasks.task_status, task_id)
            if status in TASK_DONE:
                run.cancel()
