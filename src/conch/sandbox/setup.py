"""The server's side of the sandbox's kernel layers, decided once when the pool starts: who
workers run as (a uid of their own from ``sandbox_uids``, the server's group), their
namespaces, cgroups or hard rlimits, and what a ``strict`` sandbox refuses to start without.
The workers report Landlock and seccomp themselves when they start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from conch.config import Settings
from conch.sandbox import cgroups, identity, probe, uids
from conch.sandbox.layers import REQUIRED_IN_STRICT, Layer, SandboxUnavailable
from conch.sandbox.worker import WorkerConfig

log = logging.getLogger("conch.sandbox")


@dataclass
class Prepared:
    """What was decided for a pool's workers (its ``config`` is completed in place)."""

    layers: dict[str, Layer] = field(default_factory=dict)
    # Who workers run as (None: as the server) and their cgroups (None: rlimits)
    user: identity.SandboxUser | None = None
    delegation: cgroups.Delegation | None = None
    # A uid of its own per worker from sandbox_uids, and the server's group (held while
    # the pool lives); None: every worker runs as ``user``
    ids: uids.Ids | None = None
    group: uids.Lease | None = None
    # The user-mode network stack and the relay of the inference server's port, where
    # workers have network namespaces of their own
    stack: bool = False
    relay: probe.Relay | None = None
    pid_namespaces: bool = False


def prepare(settings: Settings, config: WorkerConfig, workspace: Path, size: int) -> Prepared:
    """Decide the worker user, namespaces and cgroups (the server's side of the layers);
    the worker reports landlock and seccomp when it starts."""
    mode = settings.sandbox
    got = Prepared()
    if mode == "off":
        got.layers = {"user": Layer(False, "off"), "limits": Layer(False, "off: rlimits only")}
        return got
    decision = probe.decide(settings)
    layers = dict(decision.layers)
    if mode == "strict":
        missing = [f"{name} ({layers[name].detail})" for name in REQUIRED_IN_STRICT
                   if name in layers and not layers[name].active]
        if missing:
            raise SandboxUnavailable('sandbox = "strict" but ' + ", ".join(missing))
    # What a server that could have it lacks (a server that is not root runs its
    # workers as itself, by design).
    for name in ("files", "uid_range") if os.geteuid() == 0 else ("files",):
        if not layers[name].active:
            log.warning("sandbox: %s: %s", name, layers[name].detail)
    _prepare_user(got, decision, settings, config, workspace)
    _prepare_namespaces(got, decision, config, workspace)
    got.delegation, why = cgroups.delegate()
    own_uid = got.ids is not None
    if got.delegation is None:
        log.info("sandbox: per-worker limits by rlimits: %s", why)
        if own_uid:  # RLIMIT_NPROC counts the uid's processes: the worker's alone
            config.nproc = settings.worker_pids_max
        elif got.user is not None:  # a user shared by the pool's workers
            config.nproc = settings.worker_pids_max * size
        limits = Layer(False, f"hard rlimits (memory, cpu, files"
                              f"{', processes' if got.user else ''}); no cgroup: {why}")
    else:
        if own_uid:
            config.nproc = settings.worker_pids_max
        limits = Layer(True, f"{why}: memory.max, pids.max, cpu.max per worker; hard "
                             "rlimits")
    layers["limits"] = limits
    got.layers = layers
    return got


def _prepare_user(got: Prepared, decision: probe.Decision, settings: Settings, config: WorkerConfig,
                  workspace: Path) -> None:
    drop = decision.drop
    if drop is None:
        return
    got.user = drop.user
    if decision.ids is not None:
        got.ids = uids.Ids(decision.ids)
        # The workspace's group from an earlier start, where it is free: nothing in it
        # needs handing over again.
        prefer = 0
        with contextlib.suppress(OSError):
            prefer = os.lstat(workspace).st_gid
        got.group = got.ids.lease(prefer if prefer else None, group=True)
        if got.group is None:
            raise SandboxUnavailable(f"no id of sandbox_uids {settings.sandbox_uids} "
                                     "is free")
        group = identity.SandboxUser(f"group {got.group.id}", got.group.id, got.group.id)
        identity.hand_over(workspace, group, shared=True)
        got.user = group
        # Files a worker makes are its group's too: the next worker, another uid, may
        # change them.
        config.umask = 0o007
    else:
        identity.hand_over(workspace, drop.user)
    # Workers start as root and drop once started (conch.sandbox.identity.become).
    config.user = [got.user.uid, got.user.gid]


def _prepare_namespaces(got: Prepared, decision: probe.Decision, config: WorkerConfig,
                        workspace: Path) -> None:
    if config.confinement is not None:
        config.confinement["unix_sockets"] = decision.unix_sockets
    plan = decision.plan
    if plan is None:
        return
    config.namespaces = dataclasses.asdict(plan)
    # The worker's namespace holds the workspace's real path only.
    config.workspace = os.path.realpath(workspace)
    got.pid_namespaces = plan.pid
    got.stack = plan.net == "stack"
    got.relay = decision.relay
    if decision.models_url is not None and config.settings_json is not None:
        public = Settings.model_validate_json(config.settings_json)
        config.settings_json = public.model_copy(
            update={"models_url": decision.models_url}).model_dump_json()
