"""What the kernel layers would be on this machine, worked out without applying anything:
for ``conch config show`` and for ``conch serve``'s check before it starts (a strict
sandbox that cannot be had is refused with the reason, not with a traceback)."""

from __future__ import annotations

import os
from pathlib import Path

from conch.config import Settings
from conch.sandbox import cgroups, identity, landlock, seccomp
from conch.sandbox.layers import REQUIRED_IN_STRICT, Layer


def probe(settings: Settings) -> dict[str, Layer]:
    if settings.sandbox == "off":
        return {name: Layer(False, "off") for name in ("landlock", "seccomp", "user", "limits")}
    abi = landlock.abi_version()
    layers = {
        "landlock": Layer(abi > 0, f"abi {abi}" if abi else "the kernel offers no Landlock"),
        "seccomp": Layer(True, "libseccomp") if seccomp.available() is None
        else Layer(False, str(seccomp.available())),
        "user": _user(settings),
    }
    base, why = cgroups.inspect()
    layers["limits"] = Layer(base is not None, why if base is not None else f"rlimits; {why}")
    return layers


def _user(settings: Settings) -> Layer:
    if os.geteuid() != 0:
        return Layer(True, f"the server's own (uid {os.geteuid()}), not root")
    try:
        user = identity.resolve(settings.sandbox_user)
    except LookupError as exc:
        return Layer(False, str(exc))
    # A workspace not made yet is made by the server: what matters is reaching where it goes.
    target = Path(settings.workspace_dir)
    while not target.exists() and target != target.parent:
        target = target.parent
    blocked = identity.unreachable(target, user)
    if blocked is not None:
        return Layer(False, f"{user.name} cannot reach the workspace ({blocked})")
    return Layer(True, f"{user.name} (uid {user.uid})")


def strict_missing(settings: Settings) -> list[str]:
    """The layers strict mode needs that this machine lacks (empty unless strict)."""
    if settings.sandbox != "strict":
        return []
    layers = probe(settings)
    return [f"{name} ({layers[name].detail})" for name in REQUIRED_IN_STRICT
            if not layers[name].active]
