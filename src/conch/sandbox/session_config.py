"""How a worker is configured for a session: the pool's worker config confined to the
session's own workspace, with the session's permissions (which may lower the server's,
never raise them), a uid of its own, and what its mount namespace must cover; and what a
spare prepares before it knows which session it will serve.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from conch.config import Settings
from conch.sandbox import identity, mountns, uids
from conch.sandbox.channel import WorkerError
from conch.sandbox.jobs import Placement, allowed_effects, confinement
from conch.sandbox.worker import WorkerConfig
from conch.sandbox.worker_env import worker_settings

# The largest document one binding of a session may be saved as; a larger one is named in
# the run's ``unsaved``.
STATE_MAX_BYTES = 64 * 1024 * 1024


def covers(workspace: str, user: identity.SandboxUser | None) -> tuple[list[str], list[str]]:
    """What a mount namespace must cover for a worker of ``user`` confined to
    ``workspace``: the outermost directory above it the user cannot search (where it
    holds only the way down to the workspace), and the host's socket directories that
    do not hold it; and the socket directories it must leave (they hold it)."""
    covered, kept = mountns.socket_covers(workspace)
    blocked = identity.first_blocked(workspace, user) if user is not None else None
    if blocked is not None:
        cover = blocked[0].rstrip("/")
        covered = [cover] + [c for c in covered if c != cover and not c.startswith(cover + "/")]
    return covered, kept


def hidden_for_sessions(settings: Settings, config: WorkerConfig,
                        user: list[int] | None) -> list[str]:
    """What the mount namespace of a worker of ``user`` will likely cover as a session's
    (its workspace beneath ``sessions_dir``), known before the session is: a spare and the
    zygote prepare for it. Nothing where workers have no mount namespace."""
    if config.namespaces is None:
        return []
    sandbox_user = identity.SandboxUser("", user[0], user[1]) if user is not None else None
    example = Path(settings.sessions_dir).resolve() / "sess" / "workspace"
    return covers(str(example), sandbox_user)[0]


class SessionConfigs:
    """The configs of a pool's session workers (the pool's ``config`` is passed in: it is
    completed when the pool starts), with the settings of each pair of permissions kept."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # A session worker's settings by (allow_network, allow_process)
        self._by_permissions: dict[tuple[bool, bool], tuple[Settings, str]] = {}

    def staged(self, config: WorkerConfig, lease: uids.Lease | None) -> dict[str, Any]:
        """What a spare prepares before it knows its session (conch.sandbox.worker._stage):
        the user it will run as, the directories its mount namespace will likely cover (as a
        session's beneath ``sessions_dir``), its PID and network namespaces, its settings."""
        user = [lease.id, lease.id] if lease is not None else config.user
        plan = config.namespaces
        staged_plan = None
        if plan is not None:
            staged_plan = {"pid": plan.get("pid", False), "net": plan.get("net", ""),
                           "prohibit": list(plan.get("prohibit") or [])}
        return {"user": user, "hidden": hidden_for_sessions(self.settings, config, user),
                "namespaces": staged_plan, "settings_json": config.settings_json}

    def for_session(self, config: WorkerConfig, pool_user: identity.SandboxUser | None,
                    place: Placement, lease: uids.Lease | None) -> WorkerConfig:
        """The config of a session's worker: the pool's, confined to the session's workspace
        (its real path), its permissions lowered where the session lowers them, a uid of its
        own (``lease``) as its group too (a session shares its files with no other), a
        private umask. ``WorkerError`` where the workspace is out of the worker's reach."""
        net = place.allow_network and self.settings.allow_network
        proc = place.allow_process and self.settings.allow_process
        settings, settings_json = self._settings_for(config, net, proc)
        workspace = os.path.realpath(place.workspace)
        made = dataclasses.replace(
            config,
            workspace=workspace,
            allowed_effects=sorted(allowed_effects(settings)),
            settings_json=settings_json,
            session=True,
            state_max_bytes=STATE_MAX_BYTES,
            umask=0o077,
        )
        user = pool_user
        if lease is not None:
            made.user = [lease.id, lease.id]
            made.own_uid = True
            made.nproc = self.settings.worker_pids_max
            user = identity.SandboxUser(f"uid {lease.id}", lease.id, lease.id)
        unix = True
        if config.confinement is not None:
            unix = bool(config.confinement.get("unix_sockets", True))
        if config.namespaces is not None:
            plan = dict(config.namespaces)
            covered, kept = covers(workspace, user)
            plan["covers"] = covered
            unix = not kept
            if not net and plan.get("net") == "stack":
                plan["net"] = "none"
                plan["prohibit"] = []
                plan["files"] = {k: v for k, v in dict(plan.get("files") or {}).items()
                                 if k != "/etc/resolv.conf"}
            made.namespaces = plan
        elif user is not None:
            blocked = identity.first_blocked(workspace, user)
            if blocked is not None:
                raise WorkerError(f"a session's workspace is out of its worker's reach "
                                  f"({blocked[1]}) and workers have no mount namespace to "
                                  "reach it through")
        if config.confinement is not None:
            conf = dataclasses.asdict(confinement(settings, Path(workspace)))
            conf["unix_sockets"] = unix
            made.confinement = conf
        return made

    def _settings_for(self, config: WorkerConfig, net: bool, proc: bool) -> tuple[Settings, str]:
        """The server's settings with a session's permissions, and the JSON its worker gets
        (the public settings the pool's workers get, likewise lowered)."""
        known = self._by_permissions.get((net, proc))
        if known is None:
            update = {"allow_network": net, "allow_process": proc}
            settings = self.settings.model_copy(update=update)
            public = worker_settings(self.settings)
            if config.settings_json is not None:
                public = Settings.model_validate_json(config.settings_json)
            known = (settings, public.model_copy(update=update).model_dump_json())
            self._by_permissions[(net, proc)] = known
        return known
