"""Running a job for a route: on the sandbox pool, timed into the metrics, answered as the run
envelope. The one path of every execution route, documented and fast path alike.

A job given a ``session`` runs in that session's worker instead (:mod:`conch.sessions.runtime`),
and its answer adds ``unsaved``: the bindings the run made that could not be saved. Without a
session the answer is the envelope alone, byte for byte as it always was.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.responses import Response

from conch.sandbox.frames import dumps
from conch.sandbox.pool import Job, SandboxPool
from conch.sessions.runtime import SessionRuntime
from conch.web.agent.metrics import AgentMetrics


class Runs:
    def __init__(
        self, pool: SandboxPool, metrics: AgentMetrics, sessions: SessionRuntime | None = None
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.sessions = sessions

    async def envelope(
        self, job: Job, kind: str, session: str | None = None, tenant: str | None = None
    ) -> bytes:
        """The run envelope of ``job`` as JSON, ``elapsed_ms`` as the server measured it."""
        if session is not None:
            return await self._in_session(job, kind, session, tenant)
        started = time.perf_counter()
        done = await self.pool.run(job)
        self.metrics.observe_run(kind, started)
        done.elapsed_ms = int((time.perf_counter() - started) * 1000)
        return done.to_json_bytes()

    async def _in_session(self, job: Job, kind: str, session: str, tenant: str | None) -> bytes:
        assert self.sessions is not None, "the sessions' runtime is not attached"
        started = time.perf_counter()
        done, unsaved = await self.sessions.run(session, job, tenant=tenant)
        self.metrics.observe_run(kind, started)
        done.elapsed_ms = int((time.perf_counter() - started) * 1000)
        body: dict[str, Any] = done.to_json()
        body["unsaved"] = unsaved
        return dumps(body)

    async def respond(
        self, job: Job, kind: str, session: str | None = None, tenant: str | None = None
    ) -> Response:
        return Response(
            await self.envelope(job, kind, session, tenant), media_type="application/json"
        )
