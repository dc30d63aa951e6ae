"""Running a job for a route: on the sandbox pool, timed into the metrics, answered as the run
envelope. The one path of every execution route, documented and fast path alike."""

from __future__ import annotations

import time

from starlette.responses import Response

from conch.sandbox.pool import Job, SandboxPool
from conch.web.agent.metrics import AgentMetrics


class Runs:
    def __init__(self, pool: SandboxPool, metrics: AgentMetrics) -> None:
        self.pool = pool
        self.metrics = metrics

    async def envelope(self, job: Job, kind: str) -> bytes:
        """The run envelope of ``job`` as JSON, ``elapsed_ms`` as the server measured it."""
        started = time.perf_counter()
        done = await self.pool.run(job)
        self.metrics.observe_run(kind, started)
        done.elapsed_ms = int((time.perf_counter() - started) * 1000)
        return done.to_json_bytes()

    async def respond(self, job: Job, kind: str) -> Response:
        return Response(await self.envelope(job, kind), media_type="application/json")
