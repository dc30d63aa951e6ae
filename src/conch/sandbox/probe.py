"""What the kernel layers would be on this machine, worked out without applying anything
to the server: for ``conch config show``, for ``conch serve``'s check before it starts (a
strict sandbox that cannot be had is refused with the reason, not with a traceback), and
for the pool, which takes its decisions from :func:`decide` (who workers run as, which
namespaces they enter, how the ``model`` effect reaches the inference server)."""

from __future__ import annotations

import ipaddress
import logging
import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from conch.config import Settings, config_file, parse_id_range, readable_by_others
from conch.sandbox import cgroups, identity, landlock, mountns, namespaces, netns, seccomp, slirp
from conch.sandbox.layers import REQUIRED_IN_STRICT, Layer

log = logging.getLogger("conch.sandbox")


def probe(settings: Settings) -> dict[str, Layer]:
    if settings.sandbox == "off":
        return {name: Layer(False, "off") for name in
                ("landlock", "seccomp", "user", "uid_range", "pid_namespace",
                 "network_namespace", "limits", "files")}
    abi = landlock.abi_version()
    layers = {
        "landlock": Layer(abi > 0, f"abi {abi}" if abi else "the kernel offers no Landlock"),
        "seccomp": Layer(True, "libseccomp") if seccomp.available() is None
        else Layer(False, str(seccomp.available())),
    }
    layers.update(decide(settings).layers)
    base, why = cgroups.inspect()
    layers["limits"] = Layer(base is not None,
                             f"{why}; hard rlimits" if base is not None else f"hard rlimits; {why}")
    return layers


@dataclass
class Relay:
    """How the ``model`` effect leaves a worker's network namespace: listening sockets at
    ``listen`` (addresses inside the namespace) on ``port``, joined to ``upstream``."""

    upstream: tuple[str, int]
    listen: list[str]
    port: int


@dataclass
class Decision:
    """The server's side of the layers: what :func:`decide` found this machine gives."""

    layers: dict[str, Layer] = field(default_factory=dict)
    # Who workers run as (None: as the server) and the directory their namespace covers
    drop: identity.Drop | None = None
    # A uid of its own per worker (and a group for the server) from this range
    ids: range | None = None
    plan: namespaces.Plan | None = None
    # Whether the worker may make AF_UNIX sockets (its namespace hides the host's)
    unix_sockets: bool = True
    relay: Relay | None = None
    # The workers' models_url where it must change to reach the relay
    models_url: str | None = None


def decide(settings: Settings) -> Decision:
    """Every layer the server decides (all but Landlock and seccomp, which workers report
    as they apply them), tried for real where a guess would do (namespaces in a child
    process) and without changing anything."""
    decision = Decision()
    layer, drop = user(settings)
    decision.layers["user"] = layer
    decision.drop = drop
    decision.layers["uid_range"], decision.ids = uid_range(settings, drop)
    _namespaces(settings, decision)
    decision.layers["files"] = files(settings)
    return decision


def user(settings: Settings) -> tuple[Layer, identity.Drop | None]:
    """Who workers run as and how they reach the workspace: the layer as reported, and what
    the pool applies (``None``: workers run as the server). Decided here alone, for the
    pool at its start, ``conch config show`` and ``conch serve``'s strict check.

    With ``sandbox_uids``, each worker runs as a uid of its own from the range (the
    ``Drop``'s user is then the range's first id, standing for all of them: none of them
    owns anything on the way to the workspace). Where the sandbox user cannot search its
    way to the workspace, the covering mount namespace each worker would enter is tried for
    real, once, in a child process (:func:`conch.sandbox.mountns.check`): the kernel's
    answer, not a guess from capabilities."""
    if os.geteuid() != 0:
        return Layer(True, f"the server's own (uid {os.geteuid()}), not root"), None
    ids = _ids(settings)
    if ids is not None:
        sandbox_user = identity.SandboxUser(f"uid {ids.start}", ids.start, ids.start)
        who = (f"a uid of its own per worker from sandbox_uids {ids.start}-{ids[-1]}, the "
               "server's workers sharing a group of the range; no supplementary groups "
               f"(fallback: sandbox_user {settings.sandbox_user})")
    else:
        try:
            sandbox_user = identity.resolve(settings.sandbox_user)
        except LookupError as exc:
            return Layer(False, f"workers run as root: {exc}"), None
        who = (f"{sandbox_user.name} (uid {sandbox_user.uid}, gid {sandbox_user.gid}), "
               "no supplementary groups")
    workspace = Path(os.path.realpath(settings.workspace_dir))
    blocked = identity.first_blocked(workspace, sandbox_user)
    if blocked is None:
        return Layer(True, who), identity.Drop(sandbox_user, ids=ids)
    hidden, why = blocked
    # A workspace not made yet is made by the server: what exists of its path is tried.
    target = _existing(workspace, hidden)
    refused = mountns.check(str(target), hidden, sandbox_user.uid, sandbox_user.gid)
    if refused is not None:
        return Layer(False, f"workers run as root: {sandbox_user.name} cannot reach the "
                            f"workspace ({why}) and no mount namespace: {refused}; set "
                            "`workspace` to a directory it can reach"), None
    return (Layer(True, f"{who}; the workspace reached through a mount namespace of each "
                        f"worker's own, in which {hidden} (which {sandbox_user.name} cannot "
                        "search) is a tmpfs holding only the way to it"),
            identity.Drop(sandbox_user, hidden, ids))


def _existing(workspace: Path, stop: str | None = None) -> Path:
    target = workspace
    while not target.exists() and str(target) != stop and target != target.parent:
        target = target.parent
    return target


def _ids(settings: Settings) -> range | None:
    """The uid range workers lease from, where it has ids free (two at least: a group for
    the server and a uid for a worker)."""
    if not settings.sandbox_uids:
        return None
    from conch.sandbox.uids import Ids

    ids = parse_id_range(settings.sandbox_uids)
    return ids if Ids(ids).free() >= 2 else None


def uid_range(settings: Settings, drop: identity.Drop | None) -> tuple[Layer, range | None]:
    if os.geteuid() != 0:
        return Layer(False, f"the server is not root (uid {os.geteuid()}): its workers run "
                            "as the server's own uid"), None
    if drop is None:
        return Layer(False, "workers run as root"), None
    if drop.ids is not None:
        ids = drop.ids
        return Layer(True, f"sandbox_uids {ids.start}-{ids[-1]}: a uid of its own per "
                           "worker, leased machine-wide (a lock file per id), so process "
                           "limits, signals and files are per worker"), ids
    why = ("sandbox_uids is empty" if not settings.sandbox_uids
           else f"no id of sandbox_uids {settings.sandbox_uids} is free")
    return Layer(False, f"{why}: every worker runs as {drop.user.name}, shared with every "
                        "other server and service running as it on this machine (process "
                        "limits, signals and file ownership are not per worker)"), None


def _namespaces(settings: Settings, decision: Decision) -> None:
    layers = decision.layers
    network = settings.allow_network
    if os.geteuid() != 0:
        why = f"the server is not root (uid {os.geteuid()})"
        layers["pid_namespace"] = Layer(False, f"{why}; the worker's process group stands in")
        layers["network_namespace"] = Layer(False, why)
        if network:
            layers["network_stack"] = Layer(False, why)
        decision.unix_sockets = False
        return
    workspace = os.path.realpath(settings.workspace_dir)
    covered, kept = mountns.socket_covers(workspace)
    cover = decision.drop.cover if decision.drop is not None else None
    if cover is not None:
        covered = [c for c in covered if not c.startswith(cover.rstrip("/") + "/")]
        covered.insert(0, cover)
    net, net_layer, stack_layer = _network(settings)
    target = str(_existing(Path(workspace)))
    refused = namespaces.check(target, covered, bool(net), True)
    pid = True
    if refused is not None:
        # Which one the kernel refuses, for the reason to name it.
        mount_refused = namespaces.check(target, covered, False, False)
        if mount_refused is not None:
            why = f"no mount namespace: {mount_refused}"
            layers["pid_namespace"] = Layer(False, f"{why}; the worker's process group stands in")
            layers["network_namespace"] = Layer(False, why)
            if network:
                layers["network_stack"] = Layer(False, why)
            decision.unix_sockets = False
            return
        pid_refused = namespaces.check(target, covered, False, True)
        if pid_refused is not None:
            pid = False
            layers["pid_namespace"] = Layer(False, f"{pid_refused}; the worker's process "
                                                   "group stands in")
        if net and namespaces.check(target, covered, True, False) is not None:
            net_refused = namespaces.check(target, covered, True, False)
            net, net_layer = "", Layer(False, str(net_refused))
            if network:
                stack_layer = Layer(False, f"no network namespace: {net_refused}")
    if pid:
        layers["pid_namespace"] = Layer(True, "each worker is PID 1 of a PID namespace of its "
                                              "own: what it starts ends with its run, and "
                                              "with it")
    layers["network_namespace"] = net_layer
    if network:
        layers["network_stack"] = stack_layer
    files: dict[str, str] = {}
    prohibit: list[str] = []
    if net == "stack":
        prohibit = netns.prohibited(settings.network_allow, netns.host_addresses())
        files["/etc/resolv.conf"] = slirp.RESOLV_CONF
    if net and settings.allow_model:
        _relay(settings, decision, files)
    decision.plan = namespaces.Plan(pid=pid, net=net, covers=covered, files=files,
                                    prohibit=prohibit)
    decision.unix_sockets = not kept
    if kept:
        log.debug("sandbox: %s hold the workspace and stay visible to workers", kept)


def _network(settings: Settings) -> tuple[str, Layer, Layer]:
    """The workers' network namespace (``""``: the host's, ``"none"``, ``"stack"``), its
    layer and the stack's."""
    if not settings.allow_network:
        model = ("; the inference server reached through a relay of its port" if
                 settings.allow_model else "")
        return ("none", Layer(True, "a network namespace of each worker's own with only its "
                                    f"own loopback: no address outside is reachable{model}"),
                Layer(True, "none: no traffic leaves a worker"))
    loopback = netns.allows_loopback(settings.network_allow)
    if loopback is not None:
        why = (f"network_allow lists {loopback}, the host's loopback, which only the host's "
               "network namespace reaches: workers share it, and commands reach every "
               "address of the host and of private networks")
        return "", Layer(False, why), Layer(False, why)
    missing = slirp.unavailable()
    if missing is not None:
        why = (f"{missing}: workers share the host's network namespace, and commands reach "
               "the host's loopback and private networks")
        return "", Layer(False, why), Layer(False, missing)
    version = slirp.find()[1]
    return ("stack",
            Layer(True, "a network namespace of each worker's own: private, loopback, "
                        "link-local, shared and reserved ranges and the host's own addresses "
                        "are unreachable (prohibit routes) but what network_allow lists; "
                        "nothing is bound on the host"),
            Layer(True, f"{version}: outbound only, the host's loopback refused, sandboxed "
                        "(--enable-sandbox, --enable-seccomp)"))


def _relay(settings: Settings, decision: Decision, files: dict[str, str]) -> None:
    url = urllib.parse.urlsplit(settings.models_url)
    host = url.hostname or "127.0.0.1"
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        return
    listen = ["127.0.0.1"]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if host.lower() == "localhost":
        listen = ["127.0.0.1", "::1"]
    elif address is not None and address.is_loopback:
        listen = [str(address)]
    elif address is not None:
        # An address of another machine: the worker is told the relay's instead.
        netloc = f"127.0.0.1:{port}"
        decision.models_url = urllib.parse.urlunsplit(url._replace(netloc=netloc))
    else:
        # A name: it resolves to the relay in the worker's own /etc/hosts, so that the
        # request (TLS included) still names the inference server.
        try:
            hosts = Path("/etc/hosts").read_text(encoding="utf-8")
        except OSError:
            hosts = "127.0.0.1 localhost\n"
        files["/etc/hosts"] = f"{hosts.rstrip()}\n127.0.0.1 {host}\n"
    decision.relay = Relay((host, port), listen, port)


def files(settings: Settings) -> Layer:
    """Whether the server's database and ``conch.toml`` are readable by their owner alone."""
    paths: list[Path] = [config_file()]
    url = settings.effective_database_url
    if url.startswith("sqlite:///"):
        db = Path(url.removeprefix("sqlite:///").split("?", 1)[0])
        paths += [db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}-journal")]
    problems = [why for p in paths if (why := readable_by_others(p)) is not None]
    if problems:
        return Layer(False, "; ".join(problems))
    shown = ", ".join(str(p) for p in paths[:2] if p.exists()) or "none exist yet"
    return Layer(True, f"the database and conch.toml are readable by their owner alone "
                       f"({shown}); what the server creates in its data dir is 0600/0700")


def strict_missing(settings: Settings) -> list[str]:
    """The layers strict mode needs that this machine lacks (empty unless strict)."""
    if settings.sandbox != "strict":
        return []
    layers = probe(settings)
    return [f"{name} ({layers[name].detail})" for name in REQUIRED_IN_STRICT
            if name in layers and not layers[name].active]
