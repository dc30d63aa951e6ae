"""What a run asks the sandbox for and what comes back: the job (a program, a builtin call
or a pipeline), its limits (the server's, lowered by the request), the confinement and
rlimits a worker is given from the server's settings, the effects it may use, the events a
run reports, and where a session's worker runs.
"""

from __future__ import annotations

import contextlib
import math
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conch.config import Settings
from conch.lang.context import Limits
from conch.sandbox.envelope import RunEnvelope
from conch.sandbox.layers import Confinement

_LIMIT_FIELDS = ("wall_time_s", "steps", "recursion", "output_bytes", "collection_size")

# How long past its wall time a run may go before the server kills its worker: the
# interpreter checks wall time itself and reports it with a position; this is the backstop
# for code that does not reach a check (a long native call, ``sleep``).
GRACE_S = 1.0

# A worker's hard RLIMIT_CPU (which a command it starts cannot raise) bounds its whole life:
# this much CPU time and twice the longest job's budget. Past half of it the worker is
# replaced (conch.sandbox.worker._CpuBudget), so that a job never meets the hard limit.
CPU_LIFETIME_S = 3600


def effective_limits(configured: Limits, requested: dict[str, Any] | None) -> Limits:
    """The configured limits lowered by what the request asks; a request can never raise
    a limit (a larger value is ignored, the configured one applies)."""
    out = Limits(**{k: getattr(configured, k) for k in _LIMIT_FIELDS})
    for key, wanted in (requested or {}).items():
        if key not in _LIMIT_FIELDS or wanted is None or wanted == math.inf:
            continue  # an infinite limit lowers nothing
        current = getattr(out, key)
        setattr(out, key, wanted if current is None else min(current, wanted))
    return out


def configured_limits(settings: Settings, *, stream: bool = False) -> Limits:
    return Limits(
        wall_time_s=settings.stream_wall_time_s if stream else settings.wall_time_s,
        steps=settings.max_steps,
        recursion=settings.max_recursion,
        output_bytes=settings.max_output_bytes,
        collection_size=settings.max_collection_size,
    )


def confinement(settings: Settings, workspace: Path) -> Confinement:
    """What the kernel layers of a worker allow, from the server's settings."""
    ports: list[int] | None = None
    if not settings.allow_network:
        ports = []
        if settings.allow_model:
            url = urllib.parse.urlsplit(settings.models_url)
            with contextlib.suppress(ValueError):
                ports = [url.port or (443 if url.scheme == "https" else 80)]
    return Confinement(
        mode=settings.sandbox,
        workspace=str(workspace),
        network=settings.allow_network,
        process=settings.allow_process,
        tcp_ports=ports,
    )


def worker_rlimits(settings: Settings) -> dict[str, int]:
    """The hard rlimits a worker sets before it drops root (``RLIMIT_AS`` is
    ``worker_memory_mb``, ``RLIMIT_NPROC`` decided with the worker's user)."""
    longest = max(settings.wall_time_s, settings.stream_wall_time_s) + GRACE_S
    return {
        "NOFILE": settings.worker_files_max,
        "FSIZE": settings.worker_file_mb * 1024 * 1024,
        "CORE": 0,
        # The worker's whole life; a job needs at most ``longest`` (+ slack) of it.
        "CPU": int(CPU_LIFETIME_S + 2 * (longest + 30)),
    }


def allowed_effects(settings: Settings) -> frozenset[str]:
    effects = {"pure", "read", "write"}
    if settings.allow_model:
        effects.add("model")
    if settings.allow_network:
        effects.add("network")
    if settings.allow_process:
        effects.add("process")
    return frozenset(effects)


@dataclass
class Job:
    """One run: a program (``execute``/``eval``), a builtin call or a pipeline.

    ``variables`` (a program's names bound to JSON values before it runs) keep a program's
    text the same from run to run, so the worker's compile cache serves it; a workflow's
    ``run`` step receives ``inputs`` and ``steps`` this way."""

    mode: str  # "program" | "call" | "pipeline"
    source: str | None = None
    variables: dict[str, Any] | None = None
    builtin: str | None = None
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    input: Any = None
    steps: list[str] = field(default_factory=list)
    limits: dict[str, Any] | None = None
    stream: bool = False
    # The pipeline's ``input`` as the client's own JSON text (``input`` is then ignored):
    # sent to the worker as it came, never decoded by the server.
    input_json: bytes | None = None
    # A model pass: the run's programs call models as the key that asked for the run
    # (conch.keys.service); None where the inference server needs no key.
    models_token: str | None = None

    @property
    def carries_values(self) -> bool:
        """Whether the job holds values from a client (which may be NaN or big integers)."""
        return bool(self.variables or self.args or self.kwargs or self.input is not None)

    def payload(self, limits: Limits) -> dict[str, Any]:
        wall = limits.wall_time_s or 0.0
        return {
            "mode": self.mode,
            "stream": self.stream,
            "source": self.source,
            "variables": self.variables,
            "builtin": self.builtin,
            "args": self.args,
            "kwargs": self.kwargs,
            "input": None if self.input_json is not None else self.input,
            "steps": self.steps,
            "limits": {k: getattr(limits, k) for k in _LIMIT_FIELDS},
            "cpu_s": wall + GRACE_S,
            "input_follows": self.input_json is not None,
            "models_token": self.models_token,
        }


@dataclass
class Event:
    """Something a run reported: ``progress`` (step, total, message), ``data`` (a print line
    or an element of the resulting Array, in order) or ``done`` (the final envelope)."""

    kind: str
    step: int = 0
    total: int = 0
    message: str = ""
    text: str = ""
    result: RunEnvelope | None = None
    # A session's run (``done`` only): what it changed of the session's bindings, as the
    # worker sent it (``{saved, removed, unsaved}``; conch.sandbox.worker.Runner), with the
    # frame's size (``bytes``); and, once saved, the bindings that could not be
    state: dict[str, Any] | None = None
    unsaved: list[dict[str, str]] | None = None


@dataclass(frozen=True)
class Placement:
    """Where a session's worker runs: its workspace (the session's own directory) and its
    permissions, which may lower the server's, never raise them."""

    workspace: Path
    allow_network: bool
    allow_process: bool
