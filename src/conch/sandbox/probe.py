"""What the kernel layers would be on this machine, worked out without applying anything
to the server: for ``conch config show``, for ``conch serve``'s check before it starts (a
strict sandbox that cannot be had is refused with the reason, not with a traceback), and
for the pool, which takes its user layer from :func:`user`."""

from __future__ import annotations

import os
from pathlib import Path

from conch.config import Settings
from conch.sandbox import cgroups, identity, landlock, mountns, seccomp
from conch.sandbox.layers import REQUIRED_IN_STRICT, Layer


def probe(settings: Settings) -> dict[str, Layer]:
    if settings.sandbox == "off":
        return {name: Layer(False, "off") for name in ("landlock", "seccomp", "user", "limits")}
    abi = landlock.abi_version()
    layers = {
        "landlock": Layer(abi > 0, f"abi {abi}" if abi else "the kernel offers no Landlock"),
        "seccomp": Layer(True, "libseccomp") if seccomp.available() is None
        else Layer(False, str(seccomp.available())),
        "user": user(settings)[0],
    }
    base, why = cgroups.inspect()
    layers["limits"] = Layer(base is not None, why if base is not None else f"rlimits; {why}")
    return layers


def user(settings: Settings) -> tuple[Layer, identity.Drop | None]:
    """Who workers run as and how they reach the workspace: the layer as reported, and what
    the pool applies (``None``: workers run as the server). Decided here alone, for the
    pool at its start, ``conch config show`` and ``conch serve``'s strict check.

    Where the sandbox user cannot search its way to the workspace, the covering mount
    namespace each worker would enter is tried for real, once, in a child process
    (:func:`conch.sandbox.mountns.check`): the kernel's answer, not a guess from
    capabilities."""
    if os.geteuid() != 0:
        return Layer(True, f"the server's own (uid {os.geteuid()}), not root"), None
    try:
        sandbox_user = identity.resolve(settings.sandbox_user)
    except LookupError as exc:
        return Layer(False, f"workers run as root: {exc}"), None
    who = (f"{sandbox_user.name} (uid {sandbox_user.uid}, gid {sandbox_user.gid}), "
           "no supplementary groups")
    workspace = Path(os.path.realpath(settings.workspace_dir))
    blocked = identity.first_blocked(workspace, sandbox_user)
    if blocked is None:
        return Layer(True, who), identity.Drop(sandbox_user)
    hidden, why = blocked
    # A workspace not made yet is made by the server: what exists of its path is tried.
    target = workspace
    while not target.exists() and str(target) != hidden:
        target = target.parent
    refused = mountns.check(str(target), hidden, sandbox_user.uid, sandbox_user.gid)
    if refused is not None:
        return Layer(False, f"workers run as root: {sandbox_user.name} cannot reach the "
                            f"workspace ({why}) and no mount namespace: {refused}; set "
                            "`workspace` to a directory it can reach"), None
    return (Layer(True, f"{who}; the workspace reached through a mount namespace of each "
                        f"worker's own, in which {hidden} (which {sandbox_user.name} cannot "
                        "search) is a tmpfs holding only the way to it"),
            identity.Drop(sandbox_user, hidden))


def strict_missing(settings: Settings) -> list[str]:
    """The layers strict mode needs that this machine lacks (empty unless strict)."""
    if settings.sandbox != "strict":
        return []
    layers = probe(settings)
    return [f"{name} ({layers[name].detail})" for name in REQUIRED_IN_STRICT
            if not layers[name].active]
