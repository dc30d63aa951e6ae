"""The kernel layers under the language's own checks, applied once per worker.

The language confines paths to the workspace and refuses effects the server did not allow;
these layers make the kernel refuse the same things, so that a builtin with a missed check
is not an escape:

- **landlock**: reads and writes beneath the workspace only; read (and execute) on what the
  interpreter needs; no TCP connect or bind unless the network is allowed (connects to the
  inference server's port when only the ``model`` effect is); no signals or abstract UNIX
  sockets outside the worker's own domain.
- **seccomp**: the deny list of :mod:`conch.sandbox.seccomp`.
- **user**: a worker of a server running as root is not root (the pool starts it so;
  :mod:`conch.sandbox.identity`); **uid_range**: it runs as a uid of its own, leased from
  ``sandbox_uids`` (:mod:`conch.sandbox.uids`), not as a ``sandbox_user`` shared with every
  other server on the machine.
- **pid_namespace**, **network_namespace** (and **network_stack** with ``allow_network``):
  the worker is PID 1 of a PID namespace of its own, in a network namespace of its own
  (:mod:`conch.sandbox.namespaces`).
- **limits**: memory, processes and CPU per worker, by cgroup v2 where one is delegated to
  the server, else by hard rlimits (:mod:`conch.sandbox.cgroups`).
- **files**: the database and ``conch.toml`` are not readable by other users.

``sandbox = "best-effort"`` (the default) applies every layer the machine offers and reports
the rest as missing; ``"strict"`` refuses to start without the layers of
:data:`REQUIRED_IN_STRICT`; ``"off"`` applies none (the language's checks remain).
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from dataclasses import asdict, dataclass
from typing import Any, Literal

from conch.sandbox import landlock, seccomp

SandboxMode = Literal["strict", "best-effort", "off"]
MODES: tuple[str, ...] = ("strict", "best-effort", "off")
LAYERS = ("landlock", "seccomp", "user", "uid_range", "pid_namespace", "network_namespace",
          "network_stack", "limits", "files")

# Without these, strict refuses to run a program (network_stack where the network is on).
REQUIRED_IN_STRICT = ("landlock", "seccomp", "user", "uid_range", "pid_namespace",
                      "network_namespace", "network_stack", "files")


@dataclass
class Layer:
    """One layer as applied to a worker: whether it is in force, and how (or why not)."""

    active: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class SandboxUnavailable(Exception):
    """``sandbox = "strict"`` and a required layer cannot be applied here."""


@dataclass
class Confinement:
    """What a worker applies (plain data: it crosses the process boundary in the worker's
    config). ``tcp_ports`` is ``None`` for any TCP connect (the network is allowed), else the
    only ports a worker may connect to (the inference server's, for the ``model`` effect).
    ``unix_sockets`` is false where the worker's mount namespace does not hide the host's
    socket files: seccomp then refuses AF_UNIX sockets."""

    mode: str = "best-effort"
    workspace: str = ""
    network: bool = False
    process: bool = False
    tcp_ports: list[int] | None = None
    unix_sockets: bool = True


@functools.cache
def interpreter_paths() -> tuple[str, ...]:
    """:func:`_interpreter_paths`, worked out once per process (a spare does it early)."""
    return tuple(_interpreter_paths())


def _interpreter_paths() -> list[str]:
    """Where this interpreter reads code from: the standard library, site-packages, the
    import path (an editable install's source tree, ``PYTHONPATH``) and conch's package."""
    import conch

    paths = [p for p in sysconfig.get_paths().values() if p]
    paths += [p for p in sys.path if p]
    paths += [sys.prefix, sys.exec_prefix, sys.base_prefix + "/lib", os.path.dirname(conch.__file__)]
    paths.append(os.path.realpath(sys.executable))
    return sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})


_SHARED_LIBRARIES = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")
_ALWAYS_READ = ("/etc/ld.so.cache", "/etc/localtime", "/usr/share/zoneinfo",
                "/dev/urandom", "/dev/random", "/dev/zero")
# Name resolution, and TLS for http_* (certifi's bundle is in site-packages already).
_NAME_RESOLUTION = ("/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf", "/etc/host.conf",
                    "/etc/gai.conf", "/etc/services", "/etc/protocols", "/etc/ssl",
                    "/etc/ca-certificates", "/usr/share/ca-certificates")
# What commands started by a process builtin commonly need besides their binaries.
_PROCESS = ("/usr", "/bin", "/sbin", "/etc/passwd", "/etc/group", "/etc/alternatives")


def ruleset(plan: Confinement, abi: int) -> landlock.Ruleset:
    tcp = landlock.BIND_TCP if plan.tcp_ports is None else landlock.BIND_TCP | landlock.CONNECT_TCP
    rules = landlock.Ruleset(
        abi=abi,
        network=tcp,
        scopes=landlock.SCOPE_SIGNAL | landlock.SCOPE_ABSTRACT_UNIX_SOCKET,
        ports=[] if plan.tcp_ports is None else list(plan.tcp_ports),
    )
    workspace = landlock.fs_rights(abi) & ~(landlock.MAKE_CHAR | landlock.MAKE_BLOCK)
    if not plan.process:
        workspace &= ~landlock.EXECUTE
    rules.allow([plan.workspace], workspace)
    rules.allow(interpreter_paths(), landlock.READ_EXECUTE)
    rules.allow(_SHARED_LIBRARIES, landlock.READ_EXECUTE)
    rules.allow(_ALWAYS_READ, landlock.READ)
    rules.allow(["/dev/null"], landlock.READ_FILE | landlock.WRITE_FILE)
    # The worker's own /proc entries: opened when the rules are applied, in the process that
    # serves (a worker in a PID namespace of its own forks first), since /proc/self names
    # another directory in each process and a child gets none of its parent's.
    rules.allow_late(["/proc/self"], landlock.READ)
    if plan.network or plan.tcp_ports:
        # Late too: the worker's mount namespace may put its own resolver files in place.
        rules.allow_late(_NAME_RESOLUTION, landlock.READ)
        rules.allow_late(["/etc/resolv.conf"], landlock.READ)
    if plan.process:
        rules.allow(_PROCESS, landlock.READ_EXECUTE)
    return rules


@dataclass
class Prepared:
    """Landlock and seccomp made ready to apply (:func:`prepare`); ``rules`` is ``None``
    where there is no Landlock (``missing`` says why) or the sandbox is off."""

    plan: Confinement
    abi: int = 0
    rules: landlock.Ruleset | None = None
    missing: str = ""


def prepare(plan: Confinement) -> Prepared:
    """What of the layers must see the file system as it is before a worker's own mount
    namespace covers part of it (:mod:`conch.sandbox.mountns`): the Landlock rules are
    opened on the paths they name (the interpreter's, perhaps beneath the covered
    directory), and libseccomp, which finding reads ld.so's cache and may write a
    temporary file, is loaded."""
    if plan.mode == "off":
        return Prepared(plan)
    seccomp.available()
    abi = landlock.abi_version()
    if abi < 1:
        return Prepared(plan, missing="the kernel offers no Landlock (Linux 5.13+ with "
                                      "landlock in lsm=)")
    rules = ruleset(plan, abi)
    rules.open()
    return Prepared(plan, abi, rules)


def confine(plan: Confinement | Prepared) -> dict[str, Layer]:
    """Apply landlock and seccomp to this process (a worker, before its first job) and say
    what is in force. In strict mode a missing layer raises :class:`SandboxUnavailable`."""
    prepared = plan if isinstance(plan, Prepared) else prepare(plan)
    if prepared.plan.mode == "off":
        return {"landlock": Layer(False, "off"), "seccomp": Layer(False, "off")}
    report = {"landlock": _landlock(prepared), "seccomp": _seccomp(prepared.plan)}
    if prepared.plan.mode == "strict":
        missing = [f"{name} ({layer.detail})" for name, layer in report.items() if not layer.active]
        if missing:
            raise SandboxUnavailable("sandbox = \"strict\" but " + ", ".join(missing))
    return report


def _landlock(prepared: Prepared) -> Layer:
    plan, abi, rules = prepared.plan, prepared.abi, prepared.rules
    if rules is None:
        return Layer(False, prepared.missing)
    try:
        rules.restrict_self()
    except OSError as exc:
        return Layer(False, f"landlock_restrict_self failed: {exc}")
    parts = [f"abi {abi}", "files"]
    if abi < 4:
        parts.append("no tcp rules before abi 4")
    elif plan.tcp_ports is None:
        parts.append("tcp connect (no bind)")
    elif plan.tcp_ports:
        parts.append("tcp connect to port " + ", ".join(map(str, plan.tcp_ports)) + " only")
    else:
        parts.append("no tcp")
    if abi >= 6:
        parts.append("signal and abstract-socket scopes")
    return Layer(True, ", ".join(parts))


def _seccomp(plan: Confinement) -> Layer:
    reason = seccomp.available()
    if reason is not None:
        return Layer(False, reason)
    inet = plan.network or bool(plan.tcp_ports)
    try:
        seccomp.install(network=inet, stream_only=not plan.network, unix=plan.unix_sockets)
    except OSError as exc:
        return Layer(False, f"seccomp_load failed: {exc}")
    families = "inet (stream only)" if inet and not plan.network else (
        "inet, netlink" if inet else "")
    unix = "unix" if plan.unix_sockets else "socketpair only (no unix sockets: the host's " \
        "socket files are not hidden from this worker)"
    families = ", ".join(f for f in (unix, families) if f)
    return Layer(True, f"{len(seccomp.DENIED)} calls denied; sockets: {families}")

