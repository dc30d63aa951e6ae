"""Sessions for agent tasks: what the orchestrator's task runner is given to run a task's tool
calls in a session (:class:`conch.orchestration.task_run.TaskSessions` is the shape it
expects), over this server's :class:`SessionRuntime`.

A tool call in a session runs as any run of the session does (after the session's runs
before it, in its worker, its bindings kept and saved); what refuses it (the session deleted
meanwhile, another server running it past the wait) is the call's failure, which the model is
told, never the task's crash.
"""

from __future__ import annotations

import asyncio
from typing import Any

from conch.sandbox.envelope import RunEnvelope, RunError
from conch.sandbox.jobs import Job
from conch.sessions.errors import SessionError
from conch.sessions.runtime import SessionRuntime


class TaskSessions:
    def __init__(self, runtime: SessionRuntime) -> None:
        self.runtime = runtime
        self.service = runtime.service

    async def run(self, session: str, job: Job) -> dict[str, Any]:
        """The call's envelope (its wire dict, as an executor answers)."""
        try:
            done, _unsaved = await self.runtime.run(session, job)
        except SessionError as exc:
            failed = RunEnvelope.failure(RunError("IOError", f"the task's session: {exc.message}"))
            return failed.to_wire()
        return done.to_wire()

    async def check(self, session: str, *, tenant: str | None = None) -> None:
        """``SessionNotFound`` (404, naming ``session``) unless ``tenant`` may use it."""
        await asyncio.to_thread(self.service.get, session, tenant=tenant)

    async def create(self, *, tenant: str | None = None) -> str:
        """A new session with the server's defaults (a thread's first task)."""
        made = await asyncio.to_thread(self.service.create, tenant=tenant)
        return made.id

    async def fork(self, source: str, *, tenant: str | None = None) -> str:
        """A copy of ``source`` (its files and saved bindings), for a forked task."""
        made = await asyncio.to_thread(self.service.fork, source, tenant=tenant)
        return made.id

    async def discard(self, session: str) -> None:
        """Delete a session made for a task that was then refused."""
        await self.runtime.delete(session)
