"""Running a job for a route: on the sandbox pool, timed into the metrics, answered as the run
envelope. The one path of every execution route, documented and fast path alike.

A run of a key is admitted against its limits first (:meth:`Runs.admit`: the request, the
run, ``runs_per_minute``, a lease against ``concurrent_runs``, and CPU seconds reserved
against ``cpu_seconds_per_day``) and settled to the CPU time its worker measured when it
ends (:meth:`Runs.finish`); its programs call models with a pass of the same key.

CPU. A run cannot use more CPU time than wall time (a worker runs one thread; its commands
are bounded by the same wall-time watchdog), so it reserves its wall time, or what is left
of the day's budget when that is less, and then runs with its wall time lowered to what it
reserved: the budget holds however many runs start at once, and a small budget is not
refused for a long default wall time.

A job given a ``session`` runs in that session's worker instead (:mod:`conch.sessions.runtime`),
and its answer adds ``unsaved``: the bindings the run made that could not be saved. Without a
session the answer is the envelope alone, byte for byte as it always was.
"""

from __future__ import annotations

import math
import time
from typing import Any

from starlette.responses import Response

from conch.errors import DomainError, Unavailable
from conch.keys import Admission, Principal
from conch.sandbox.envelope import RunEnvelope
from conch.sandbox.frames import dumps
from conch.sandbox.jobs import Job
from conch.sandbox.pool import SandboxPool
from conch.sessions.runtime import SessionRuntime
from conch.web.agent.metrics import AgentMetrics
from conch.web.common.auth import KeyAccess

# How much longer than its wall time a run's model pass lives (a last model answer on its
# way when the run's time runs out).
PASS_GRACE_S = 60.0


class Runs:
    def __init__(
        self,
        pool: SandboxPool,
        metrics: AgentMetrics,
        access: KeyAccess | None = None,
        sessions: SessionRuntime | None = None,
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.access = access
        self.sessions = sessions

    def wall_time(self, job: Job) -> float:
        """The most a job may run: its own limit, or the server's."""
        settings = self.pool.settings
        default = settings.stream_wall_time_s if job.stream else settings.wall_time_s
        asked = (job.limits or {}).get("wall_time_s")
        return float(min(asked, default) if isinstance(asked, int | float) and asked > 0 else default)

    async def admit(self, principal: Principal | None, job: Job) -> Admission:
        """Admit ``job`` for ``principal`` (a ``429`` when a limit refuses) and give it a model
        pass; :meth:`finish` must follow."""
        if self.access is None or principal is None:
            return Admission()
        wall = self.wall_time(job)
        cpu = wall
        if principal.limits.cpu_seconds_per_day is not None:
            left = await self.access.db(self.access.limiter.cpu_left, principal)
            if left is not None and left < wall:
                # Rounded down, so it fits; 0 when it is spent (the admission refuses the run).
                cpu = math.floor(left * 1000) / 1000
        admission = await self.access.admit(principal, requests=1, run=True, cpu_seconds=cpu)
        if cpu < wall:
            job.limits = {**(job.limits or {}), "wall_time_s": max(cpu, 0.001)}
        job.models_token = self.access.issue_pass(principal, wall + PASS_GRACE_S)
        return admission

    async def finish(
        self, principal: Principal | None, admission: Admission, done: RunEnvelope | None
    ) -> None:
        """Settle the run's CPU reservation to what its worker measured (as reserved when
        it is not known: the worker was killed) and release its lease."""
        if self.access is None or principal is None or not admission.recorded:
            return
        cpu = done.cpu_s if done is not None else None
        await self.access.finish(principal, admission, cpu_seconds=cpu)

    async def release(self, principal: Principal | None, admission: Admission) -> None:
        """The run never started (its session refused it): settle it at no CPU."""
        if self.access is not None and principal is not None and admission.recorded:
            await self.access.finish(principal, admission, cpu_seconds=0.0)

    async def envelope(
        self, job: Job, kind: str, principal: Principal | None = None, session: str | None = None
    ) -> bytes:
        """The run envelope of ``job`` as JSON, ``elapsed_ms`` as the server measured it (in a
        session, with ``unsaved``)."""
        done, unsaved = await self.run_in(job, kind, principal, session)
        if unsaved is None:
            return done.to_json_bytes()
        body: dict[str, Any] = done.to_json()
        body["unsaved"] = unsaved
        return dumps(body)

    async def run(self, job: Job, kind: str, principal: Principal | None = None) -> RunEnvelope:
        """Run ``job`` for ``principal`` (admitted, settled): its envelope."""
        return (await self.run_in(job, kind, principal, None))[0]

    async def run_in(
        self, job: Job, kind: str, principal: Principal | None, session: str | None
    ) -> tuple[RunEnvelope, list[dict[str, str]] | None]:
        """Run ``job`` for ``principal`` (admitted, settled), in ``session`` when given: its
        envelope, and the bindings a session could not save (None outside a session)."""
        if session is not None and self.sessions is None:
            raise Unavailable("this server runs no sessions", where="session")
        admission = await self.admit(principal, job)
        done: RunEnvelope | None = None
        unsaved: list[dict[str, str]] | None = None
        try:
            started = time.perf_counter()
            if session is not None:
                assert self.sessions is not None
                tenant = principal.reads if principal is not None else None
                try:
                    done, unsaved = await self.sessions.run(session, job, tenant=tenant)
                except DomainError:  # the session refused it (not found, busy elsewhere)
                    await self.release(principal, admission)
                    admission = Admission()
                    raise
            else:
                done = await self.pool.run(job)
            self.metrics.observe_run(kind, started)
            done.elapsed_ms = int((time.perf_counter() - started) * 1000)
        finally:
            if admission.recorded:
                await self.finish(principal, admission, done)
        return done, unsaved

    async def respond(
        self, job: Job, kind: str, principal: Principal | None = None, session: str | None = None
    ) -> Response:
        return Response(
            await self.envelope(job, kind, principal, session), media_type="application/json"
        )
