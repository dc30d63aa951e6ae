"""The child side of the sandbox: one worker process that runs conch programs for the server.

The server (:mod:`conch.sandbox.pool`) starts these processes and never runs untrusted
code itself. A worker applies its OS limits and kernel layers once at start (hard rlimits,
namespaces, Landlock, seccomp, the drop to its own uid) and keeps ``RLIMIT_CPU`` ahead of
each job, scrubs secrets from its environment, then serves jobs one at a time
over a socket: it receives a job, runs it under a sandboxed :class:`Context`, and sends
progress, output lines and array elements back as they happen, then a final ``done`` frame.

Frames are a 4-byte big-endian length followed by UTF-8 JSON in both directions. JSON
(never pickle) is deliberate: a worker that untrusted code managed to subvert must not be
able to make the server execute anything by what it sends back.
"""

from __future__ import annotations

import gc
import math
import os
import resource
import signal
import socket
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from conch import process_role
from conch.config import Settings
from conch.lang import values
from conch.lang.builtins.registry import type_names
from conch.lang.context import EFFECTS, Context, Limits, using
from conch.lang.errors import ConchError, from_python
from conch.sandbox.envelope import PipelineEnvelope, RunEnvelope, RunError, StepTiming
from conch.sandbox.frames import COMPACT_JSON, HEADER, decode, encode, encode_exact, split_header

if TYPE_CHECKING:
    from conch.sandbox.bindings import Bindings

# Environment variables a program must not be able to read back through ``env``.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")


class Channel:
    """Blocking framed JSON over the worker's end of the socket pair."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.file = sock.makefile("rb")

    def send(self, message: Any) -> None:
        # What a model or a program's agent call produced may hold NaN: sent exactly.
        frame = encode_exact(message) if message[0] == "record" else encode(message)
        self.sock.sendall(frame)

    def recv(self) -> Any:
        header = self.file.read(HEADER.size)
        if len(header) < HEADER.size:
            return None
        size, exact = split_header(HEADER.unpack(header)[0])
        body = self.file.read(size)
        if len(body) < size:
            return None
        return decode(body, exact)


@dataclass
class WorkerConfig:
    """What a worker needs to know, sent once when it starts (plain data: it crosses
    a process boundary)."""

    workspace: str
    allowed_effects: list[str]
    memory_mb: int
    max_recursion: int
    settings_json: str | None = None
    # conch.sandbox.layers.Confinement as a dict; None: no kernel layers (a Dask worker)
    confinement: dict[str, Any] | None = None
    # RLIMIT_NPROC, for a worker running as the sandbox user without a cgroup
    nproc: int | None = None
    # False only from tests (SandboxPool(language_checks=False)): see Runner
    language_checks: bool = True
    # [uid, gid] to run as once started (a server running as root)
    user: list[int] | None = None
    # conch.sandbox.namespaces.Plan as a dict: the namespaces the worker enters as root
    # (``workspace`` is then a real path); None: the server's own
    namespaces: dict[str, Any] | None = None
    # Hard (and soft) rlimits set before the drop, by name (NOFILE, FSIZE, CORE; CPU: the
    # hard limit of the worker's whole life, the soft one following each job)
    rlimits: dict[str, int] | None = None
    # The file mode creation mask (workers of one server share a group and a workspace)
    umask: int | None = None
    # ``user`` is a uid leased for this worker alone (conch.sandbox.uids)
    own_uid: bool = False
    # Whether the server keeps what a run sends to be recorded (an agent call's task)
    records: bool = False
    # The worker of one session (conch.sessions): its runs share one conch.lang.Session, and
    # each run's changed bindings go back to be saved (a ``state`` frame before ``done``)
    session: bool = False
    # The largest document one binding may be saved as (larger ones are named unsaved)
    state_max_bytes: int | None = None


def _confine(config: WorkerConfig) -> dict[str, Any]:
    """The kernel layers, last, once everything is imported: from here on the worker reads
    nothing outside the workspace and what the interpreter needs, and is not root.

    The order matters. The import path is opened first (reroot_imports), and so are the
    paths of the Landlock rules (prepare), while every directory is where it was: the mount
    namespace that follows may cover them. The namespaces are entered while the worker is
    root and before Landlock and seccomp, which forbid them; with a PID namespace the
    worker goes on from here as PID 1 of it (conch.sandbox.namespaces). Landlock and
    seccomp go on while the worker is still root, then the hard rlimits (which the sandbox
    user cannot raise); then it drops to the sandbox user, reaching the interpreter's
    directories through the descriptors opened before."""
    from conch.sandbox.layers import Confinement, confine, prepare

    applied: dict[str, Any] = {}
    plan = config.namespaces
    staged = _State.staged
    shared = _State.shared
    covers = list((plan or {}).get("covers", ()))
    if config.user is not None and not (
            shared is not None and shared["rerooted"] and set(covers) <= set(shared["hidden"])):
        from conch.sandbox.identity import reroot_imports

        reroot_imports((config.user[0], config.user[1]), hidden=covers)
    prepared = None if config.confinement is None else prepare(Confinement(**config.confinement))
    if plan is not None:
        from conch.sandbox import namespaces

        if staged is not None and staged.get("namespaces") is not None:
            namespaces.enter_mounts(plan, config.workspace)  # the rest: _stage
        else:
            namespaces.enter(plan, config.workspace)
    # What a job leaves running is ended after it, where the worker may start commands
    # (without the process effect Landlock refuses every exec): by PID 1 of its namespace,
    # or else by the uid it alone runs as.
    if (config.confinement or {}).get("process"):
        from conch.sandbox.namespaces import end_own_processes, reap_orphans

        if plan is not None and plan.get("pid"):
            _State.reap = reap_orphans
        elif config.own_uid and config.user is not None:
            _State.reap = end_own_processes
    if prepared is not None:
        applied = {name: layer.to_dict() for name, layer in confine(prepared).items()}
    _hard_limits(config)
    if config.umask is not None:
        os.umask(config.umask)
    if config.user is not None:
        from conch.sandbox.identity import become

        become(*config.user)
    return applied


_RLIMITS = {"NOFILE": resource.RLIMIT_NOFILE, "FSIZE": resource.RLIMIT_FSIZE,
            "CORE": resource.RLIMIT_CORE, "NPROC": resource.RLIMIT_NPROC}


def _hard_limits(config: WorkerConfig) -> None:
    """Soft and hard rlimits, so that neither the worker nor a command it starts can raise
    them (only root may raise a hard limit, and the worker is about to stop being root)."""
    limits = dict(config.rlimits or {})
    if config.nproc:  # counted per user: only a worker of its own user may set it
        limits["NPROC"] = config.nproc
    cpu_hard = limits.pop("CPU", None)
    for name, value in limits.items():
        resource.setrlimit(_RLIMITS[name], (value, value))
    if cpu_hard is not None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_CPU)
        if soft == resource.RLIM_INFINITY or soft > cpu_hard:
            soft = cpu_hard
        resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))


def _scrub_environment() -> None:
    for name in list(os.environ):
        upper = name.upper()
        if upper.startswith("CONCH_") or any(m in upper for m in SECRET_MARKERS):
            del os.environ[name]


def _apply_memory_limit(memory_mb: int) -> None:
    # Hard as well as soft: a command started by run_process must not raise it.
    if memory_mb <= 0:
        return
    limit = memory_mb * 1024 * 1024
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_all() -> float:
    """CPU seconds of this worker and the commands it has waited for (a run's CPU time is
    the difference across it, for the keys' CPU budgets)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return _cpu_used() + children.ru_utime + children.ru_stime


class _CpuBudget:
    """Keeps ``RLIMIT_CPU`` ahead of each job without a system call per job.

    RLIMIT_CPU counts the process's whole life, so before a job the soft limit must sit at
    least ``budget`` seconds above the CPU used so far. CPU time never exceeds wall time in
    this single-threaded worker, so wall time spent in jobs bounds the CPU used since the
    limit was last set; the limit is moved (with some slack) only when that bound says the
    next job might not fit. Past the soft limit the kernel sends SIGXCPU. The wall-time
    watchdog in the server remains the precise per-run bound; this is the backstop that
    also ends a worker whose server is gone.
    """

    SLACK_S = 30.0

    def __init__(self) -> None:
        self.remaining = 0.0

    def before(self, budget: float) -> None:
        budget = max(1.0, budget)
        if self.remaining >= budget:
            return
        _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        used = _cpu_used()
        soft = math.ceil(used + budget + self.SLACK_S)
        if hard != resource.RLIM_INFINITY:
            # The hard limit bounds the worker's whole life (the pool makes it twice the
            # longest job's budget and more): past half of it, the worker is replaced after
            # this job, so that no job meets the hard limit's SIGKILL.
            if used > hard / 2:
                _State.retire = True
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        self.remaining = budget + self.SLACK_S

    def spent(self, seconds: float) -> None:
        self.remaining -= seconds


def worker_main(sock: socket.socket, host: HostFactory | None = None, *,
                zygote: bool = False) -> None:
    """Serve jobs on ``sock`` until the server closes it. ``host`` gives each run the host
    its programs reach models and agents through (``conch.worker_process`` passes conch's;
    None: programs have none).

    The worker imports everything first, then reads its first frame: the
    :class:`WorkerConfig` for one of the pool's own workers. A spare, kept for a session
    (:meth:`conch.sandbox.pool.SandboxPool.bind`), is sent ``prepare`` instead: it does
    everything that does not depend on the session (:func:`_stage`: its PID and network
    namespaces, the imports its user must reach, libseccomp loaded, a session compiled
    once), says so (``["warm", pid]``) and waits for its config, so that binding it costs
    only what is the session's own: its mount namespace, Landlock, seccomp, the drop.

    ``zygote``: this process is the pool's zygote (:mod:`conch.sandbox.zygote`), which
    prepares once what every spare would and then forks them: this returns in the zygote
    never, and each child goes on from here as a spare, on its own socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when a worker stops
    _scrub_environment()
    process_role.sandbox_worker = True  # never maps llama.cpp's libraries (conch.process_role)
    _preload()
    if zygote:
        from conch.sandbox.zygote import serve

        sock = serve(sock, _stage_shared)
    chan = Channel(sock)
    first = chan.recv()
    if isinstance(first, list) and first and first[0] == "prepare":
        try:
            _stage(first[1])
        except Exception as exc:
            chan.send(["refused", str(exc)])
            return
        chan.send(["warm", _host_pid()])
        first = chan.recv()
    if not (isinstance(first, list) and first and first[0] == "config"):
        return
    config = WorkerConfig(**first[1])
    if config.session:
        # Commands a session's program starts live in its own workspace.
        os.environ["HOME"] = config.workspace
    runner = Runner(config, host=host)
    os.chdir(config.workspace)  # the pool created it; a worker must not run elsewhere
    # Deep conch recursion must reach the conch limit (a clean LimitError) before Python's.
    sys.setrecursionlimit(max(10_000, config.max_recursion * 8))
    signal.signal(signal.SIGXCPU, _on_cpu_limit)
    _apply_memory_limit(config.memory_mb)
    try:
        layers = _confine(config)
    except Exception as exc:  # strict and a layer is missing, or the drop failed
        chan.send(["refused", str(exc)])
        return
    chan.send(["ready", _host_pid(), layers])
    cpu = _CpuBudget()
    while True:
        job = chan.recv()
        if job is None:
            return
        if job.get("input_follows"):
            job["input"] = chan.recv()  # the client's own JSON of the pipeline's input
        cpu.before(float(job.get("cpu_s") or 60.0))
        started = time.perf_counter()
        runner.run(job, chan)
        cpu.spent(time.perf_counter() - started)
        if _State.cpu_exceeded or _State.retire:
            return
        if _State.reap is not None:
            _State.reap()  # nothing a run started outlives it


def _host_pid() -> int:
    """This process's pid as the server sees it (in a PID namespace of its own the worker is
    1; /proc is still the host's)."""
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return os.getpid()


class _State:
    in_job = False
    cpu_exceeded = False
    # The worker's CPU time is nearly spent (its hard RLIMIT_CPU): replaced after its job
    retire = False
    # PID 1 of a PID namespace of its own (conch.sandbox.namespaces) that may start
    # commands: what a job left running is killed after it, by this
    reap: Callable[[], None] | None = None
    # A spare's preparation, done before it was bound (_stage), and the part of it done
    # once for every spare (_stage_shared; by the zygote)
    staged: dict[str, Any] | None = None
    shared: dict[str, Any] | None = None


def _on_cpu_limit(signum: int, frame: Any) -> None:
    # Raised inside the running program; a worker stuck in native code never gets here and
    # is killed by the server's wall-time watchdog instead. The kernel repeats SIGXCPU every
    # second past the soft limit, so the worker is recycled after its job.
    _State.cpu_exceeded = True
    if _State.in_job:
        raise ConchError("TimeoutError", "CPU time limit exceeded")


def _stage(pre: dict[str, Any]) -> None:
    """A spare's preparation (the ``prepare`` frame): what binding it to a session would
    otherwise spend time on, none of it depending on the session (:func:`_stage_shared`,
    done already in a child of the zygote), and its PID and network namespaces
    (``namespaces``: a :class:`conch.sandbox.namespaces.Plan` without the mounts, which need
    the workspace), entered now."""
    _stage_shared(pre)
    plan = pre.get("namespaces")
    if plan is not None:
        from conch.sandbox.namespaces import enter_processes

        enter_processes(plan)
    # Once more in this process: what the first run touches is copied from the zygote's
    # pages now, before a session waits for it.
    _warm_session()
    _State.staged = pre


def _stage_shared(pre: dict[str, Any]) -> None:
    """What every session's worker does before it knows its session, done once (by the
    zygote for all its children). ``user``: who it will run as (or, in the zygote, one of
    the sandbox's uids: none of them owns anything on the way to the interpreter), whose
    imports are rerooted now (``hidden``: the directories its mount namespace will cover);
    ``settings_json``: the settings it will most likely be given, parsed now."""
    if _State.shared is not None:
        return
    user = pre.get("user")
    if user is not None:
        from conch.sandbox.identity import reroot_imports

        reroot_imports((user[0], user[1]), hidden=pre.get("hidden") or ())
    from conch.sandbox import layers, seccomp

    seccomp.available()  # loads libseccomp (finding it reads ld.so's cache)
    layers.interpreter_paths()
    if pre.get("settings_json"):
        _parsed_settings(pre["settings_json"])
    _warm_session()
    # What is imported and built by now lives as long as the worker: the collector need
    # never walk it again (and after a fork, each walk would copy its pages).
    gc.collect()
    gc.freeze()
    _State.shared = {"rerooted": user is not None, "hidden": list(pre.get("hidden") or ())}


_SETTINGS: dict[str, Settings] = {}


def _parsed_settings(text: str) -> Settings:
    known = _SETTINGS.get(text)
    if known is None:
        known = _SETTINGS[text] = Settings.model_validate_json(text)
    return known


def _warm_session() -> None:
    """Compile and run a few statements in a throwaway session: the language's first
    compilation of each kind of statement costs milliseconds that a session's first run
    would otherwise pay."""
    from conch.lang import Session
    from conch.lang.context import Context

    ctx = Context(limits=Limits(wall_time_s=5.0, steps=10_000, recursion=100, output_bytes=1000,
                                collection_size=1000))
    try:
        with using(ctx):
            session = Session()
            for source in ("1 + 1", "let a = 1", "let mut b = a + 1", "b = b + a",
                           "let f = fn(v) => v * a", "f(b) + a", "[1, 2] | map(fn(x) => x + a)"):
                session.run(source)
    except ConchError:
        pass


def _preload() -> None:
    """Import everything a program could make the worker import later, before the worker
    moves into the workspace: nothing may be imported from a directory programs write to."""
    import conch.lang.compiler  # a session's runs compile with it
    import conch.sandbox.bindings  # noqa: F401
    from conch.lang import Session
    from conch.lang.builtins.registry import load_all

    load_all()
    Session()  # what a session's Session loads on first use


# -- running a job ------------------------------------------------------------------------


class Collect:
    """Stands in for the channel where a run's frames are kept rather than sent (a job of a
    batch, a job on a Dask worker); a value the channel could not send fails the same way.
    ``records`` frames go on to ``parent`` (the batch's channel) where there is one."""

    def __init__(self, parent: Channel | None = None) -> None:
        self.done: dict[str, Any] | None = None
        self.recycle = False
        self.parent = parent

    def send(self, message: Any) -> None:
        encode(message)
        if message and message[0] == "done":
            self.done = message[1]
            self.recycle = len(message) > 2 and message[2] is True
        elif message and message[0] == "record" and self.parent is not None:
            self.parent.send(message)


# Where a run's frames go: the socket, or kept (a job of a batch, a job on a Dask worker).
Outbox = Channel | Collect


class _StreamLimit(Exception):
    pass


# What gives a run its host (conch.lang.host) from the worker's settings and, where the
# server keeps records for it, the channel they go over: conch.host.server_host.
HostFactory = Callable[[Settings | None, Callable[[str, dict[str, Any]], None] | None], Any]


class Runner:
    def __init__(self, config: WorkerConfig, host: HostFactory | None = None) -> None:
        # Resolved once: every run's context starts from the same real workspace path.
        self.workspace = Path(os.path.realpath(config.workspace))
        self.allowed = frozenset(config.allowed_effects)
        # The pool sends the server's own (validated) settings: a failure here is a bug, and
        # the worker exits before its greeting, so the pool reports that it could not start.
        self.settings = _parsed_settings(config.settings_json) if config.settings_json else None
        # Tests of the kernel layers turn the language's own checks off: every path, every
        # effect, every address, so that only the kernel stands in the way.
        self.checked = config.language_checks
        self.records = config.records
        if not self.checked:
            self.allowed = frozenset(EFFECTS)
            if self.settings is not None:
                self.settings = self.settings.model_copy(
                    update={"network_allow": ["0.0.0.0/0", "::/0"]})
        # The host of a run whose records nobody keeps, and of one whose records go to the
        # server over a channel (that channel's: a worker has one for its whole life).
        self._host = host
        self._plain_host = host(self.settings, None) if host is not None else None
        self._record_chan: Channel | None = None
        self._record_host: Any = None
        # Compiled programs and pipeline stages by source, least recently used first: agents
        # send the same commands again and again, and lexing, parsing and compiling cost
        # far more than running a small program.
        self._programs: OrderedDict[str, Any] = OrderedDict()
        self._stages: OrderedDict[str, Any] = OrderedDict()
        # Nothing in a worker cancels a run (the server kills the worker instead), so every
        # run can share one cancellation flag that is never set.
        import threading

        self._never_cancelled = threading.Event()
        # The session's bindings, kept from run to run (a session's worker only)
        self.bindings: Bindings | None = None
        self.state_max_bytes = config.state_max_bytes
        if config.session:
            from conch.sandbox.bindings import Bindings

            self.bindings = Bindings()

    def _compile(self, source: str, names: frozenset[str] = frozenset()) -> Any:
        if not names:
            return _cached(self._programs, source, _compile_program)
        # The names a program is given are part of what it compiles to (known globals).
        key = source + "\0" + ",".join(sorted(names))
        return _cached(self._programs, key, lambda _k: _compile_program(source, names))

    def _context(self, emit: Callable[[str], None], limits: Limits) -> Context:
        # The workspace is given after construction: Context() would otherwise resolve its
        # real path again on every run.
        ctx = Context(
            cwd=self.workspace,
            allowed_effects=self.allowed,
            output=emit,
            limits=limits,
            cancelled=self._never_cancelled,
            settings=self.settings,
            host=self._plain_host,
        )
        if self.checked:
            ctx.workspace = self.workspace
        return ctx

    def run(self, job: dict[str, Any], chan: Outbox) -> None:
        if job.get("mode") == "batch":
            self._batch(job, chan)
            return
        if job.get("mode") == "restore":
            self._restore(job, chan)
            return
        mark = self._mark()
        stream = bool(job.get("stream"))
        limits = Limits(**job.get("limits", {}))
        output: list[str] = []
        emit: Callable[[str], None] = (
            (lambda line: chan.send(["data", line])) if stream else output.append
        )
        ctx = self._context(emit, limits)
        if self.records and self._host is not None:
            target = chan if isinstance(chan, Channel) else chan.parent
            if target is not None:
                ctx.host = (self._record_host if target is self._record_chan
                            else self._recording_host(target))
        token = job.get("models_token")
        credential = getattr(ctx.host, "with_credential", None)
        if token is not None and credential is not None:
            # The run's programs call models as the key that asked for the run (conch.host).
            ctx.host = credential(token)
        cpu_start = _cpu_all()
        steps: list[StepTiming] = []
        kind = PipelineEnvelope if job.get("mode") == "pipeline" else RunEnvelope
        recycle = False
        envelope: RunEnvelope
        _State.in_job = True
        try:
            with using(ctx):
                value = self._evaluate(job, ctx, _progress(chan) if stream else None, steps)
                if stream and _streamable(value):
                    envelope = self._stream_array(kind, value, ctx, chan, output)
                else:
                    envelope = _envelope(kind, value, limits, output)
        except ConchError as exc:
            envelope = kind.failure(_run_error(exc), output)
            recycle = exc.kind == "LimitError"
        except (MemoryError, RecursionError) as exc:
            envelope = kind.failure(_run_error(from_python(exc)), output)
            recycle = True
        except Exception as exc:
            envelope = kind.failure(_run_error(from_python(exc)), output)
        finally:
            _State.in_job = False
        if isinstance(envelope, PipelineEnvelope):
            envelope.steps = steps
        recycle = recycle or _State.cpu_exceeded or _State.retire
        wire = envelope.to_wire()
        wire["cpu_s"] = round(max(0.0, _cpu_all() - cpu_start), 6)
        if self.bindings is not None:
            # Before ``done``: the server saves these before it answers the run. A run that
            # changed nothing sends none (the server reads no frame as nothing changed).
            changes = self._changes(mark)
            if changes["saved"] or changes["removed"] or changes["unsaved"]:
                chan.send(["state", changes])
        try:
            chan.send(["done", wire, recycle])
        except (TypeError, ValueError) as exc:  # an unencodable value (e.g. a huge Int)
            failed = kind.failure(_run_error(from_python(exc)), output).to_wire()
            failed["cpu_s"] = wire["cpu_s"]
            chan.send(["done", failed, recycle])

    # -- a session's bindings ---------------------------------------------------------------

    def _mark(self) -> Any:
        if self.bindings is None:
            return None
        try:
            return self.bindings.mark()
        except Exception:  # a bug of the language's: the run goes on, its bindings unsaved
            return None

    def _changes(self, mark: Any) -> dict[str, Any]:
        """What the run changed, for the server to save: ``saved`` (the documents, as JSON),
        ``removed`` (names) and ``unsaved`` (``[{name, reason}]``)."""
        assert self.bindings is not None
        try:
            removed: list[str] = []
            if mark is None:
                changed = [b["name"] for b in self.bindings.summary()]
            else:
                changed, removed = self.bindings.changes(mark)
            docs, unsaved = self.bindings.export(changed, max_bytes=self.state_max_bytes)
        except Exception as exc:
            names = [b["name"] for b in self.bindings.summary()]
            reason = f"saving the session's bindings failed: {exc}"
            return {"saved": [], "removed": [], "unsaved": [{"name": n, "reason": reason}
                                                            for n in names]}
        saved: list[Any] = []
        total = 0
        for doc in docs:
            total += len(doc)
            if total > STATE_FRAME_BYTES:
                unsaved.append({"name": _doc_name(doc),
                                "reason": f"the run changed more than {STATE_FRAME_BYTES} "
                                          "bytes of bindings at once"})
                continue
            saved.append(orjson.Fragment(doc))
        return {"saved": saved, "removed": removed, "unsaved": unsaved}

    def _restore(self, job: dict[str, Any], chan: Outbox) -> None:
        """A resumed session's saved bindings, restored before its first run; ``done``
        carries the names that could not be (``[{name, reason}]``) as its value."""
        damaged: list[dict[str, str]] = []
        if self.bindings is not None:
            limits = Limits(**job.get("limits", {}))
            ctx = self._context(lambda _line: None, limits)
            try:
                with using(ctx):
                    damaged = self.bindings.restore(list(job.get("docs") or ()))
            except Exception as exc:
                damaged = [{"name": str(d.get("name", "?")) if isinstance(d, dict) else "?",
                            "reason": f"restoring failed: {exc}"} for d in job.get("docs") or ()]
        chan.send(["done", RunEnvelope.ok("", "Nothing", damaged, []).to_wire(), False])

    def _recording_host(self, target: Channel) -> Any:
        assert self._host is not None
        self._record_chan = target
        self._record_host = self._host(
            self.settings, lambda kind, data: target.send(["record", kind, data]))
        return self._record_host

    def _batch(self, job: dict[str, Any], chan: Outbox) -> None:
        """Several jobs one after the other, for a burst of small programs (a workflow's
        fan-out): one round trip per batch instead of per job. Each job keeps its own
        limits; its envelope goes back as a ``data`` frame as soon as it is done, so the
        server's watchdog times each job on its own. A job after which this worker must be
        replaced ends the batch; the server runs the rest elsewhere."""
        for sub in job.get("jobs") or ():
            collect = Collect(chan if isinstance(chan, Channel) else None)
            self.run({**sub, "stream": False}, collect)
            chan.send(["data", collect.done])
            if collect.recycle:
                chan.send(["done", RunEnvelope.ok("", "Nothing", None, []).to_wire(), True])
                return
        chan.send(["done", RunEnvelope.ok("", "Nothing", None, []).to_wire(), False])

    def _evaluate(self, job: dict[str, Any], ctx: Context, progress: Progress | None,
                  steps: list[StepTiming]) -> Any:
        mode = job.get("mode")
        if mode == "program":
            on_statement = None
            if progress is not None:
                report = progress

                def on_statement(index: int, total: int, text: str) -> None:
                    report(index + 1, total, text)

            if self.bindings is not None:
                # A session's program: compiled against, and binding into, its Session.
                return self.bindings.session.run(job["source"], on_statement)
            variables = job.get("variables") or None
            program = self._compile(job["source"], frozenset(variables or ()))
            return program.run(context=ctx, variables=variables, on_statement=on_statement)
        if mode == "pipeline":
            return self._pipeline(job, ctx, progress, steps)
        if mode == "call":
            return self._call(job, ctx)
        raise ConchError("ValueError", f"unknown job mode {mode!r}")

    def _pipeline(self, job: dict[str, Any], ctx: Context, progress: Progress | None,
                  steps: list[StepTiming]) -> Any:
        value = job.get("input")
        sources: list[str] = job["steps"]
        total = len(sources)
        for i, source in enumerate(sources, start=1):
            if progress is not None:
                progress(i, total, source)
            started = time.perf_counter()
            try:
                stage = _cached(self._stages, source, _compile_stage)
                value = stage(value, context=ctx, variables=self._session_variables())
            except ConchError as exc:
                exc.message = f"step {i}: {exc.message}"
                raise
            elapsed_ms = int((time.perf_counter() - started) * 1000)
            steps.append(StepTiming(i, _shallow_type(value), elapsed_ms))
        return value

    def _call(self, job: dict[str, Any], ctx: Context) -> Any:
        from conch.lang.builtins.registry import lookup

        name = job["builtin"]
        b = lookup(name)
        if b is None:
            raise ConchError("NameError", f"unknown builtin {name!r}")
        args = list(job.get("args") or [])
        kwargs = dict(job.get("kwargs") or {})
        params = b.params
        # Functions cannot travel as JSON: a String given for a Function parameter is
        # conch source for one (``"fn(x) => x * 2"``).
        for i, param in enumerate(params):
            if param.variadic:
                extra = kwargs.pop(param.name, None)
                if extra is not None:
                    args.extend(extra if isinstance(extra, list) else [extra])
                continue
            if not _wants_function(param.type):
                continue
            if i < len(args) and isinstance(args[i], str):
                args[i] = self._function(args[i], ctx)
            elif isinstance(kwargs.get(param.name), str):
                kwargs[param.name] = self._function(kwargs[param.name], ctx)
        return b.fn(*args, **kwargs)

    def _function(self, source: str, ctx: Context) -> Any:
        return self._compile(source).run(context=ctx, variables=self._session_variables())

    def _session_variables(self) -> dict[str, Any] | None:
        """A session's bindings, by name, for a pipeline's stages and a call's functions."""
        return self.bindings.session.variables if self.bindings is not None else None

    def _stream_array(
        self, kind: type[RunEnvelope], value: Any, ctx: Context, chan: Outbox, output: list[str]
    ) -> RunEnvelope:
        """Send each element as a ``data`` frame; the envelope's value is their count."""
        limits = ctx.limits
        count = 0
        max_items = limits.collection_size
        for item in value:
            count += 1
            if max_items is not None and count > max_items:
                raise ConchError("LimitError", f"collection size limit of {max_items} exceeded")
            text = values.render(item)
            if limits.output_bytes is not None:
                ctx.output_used += len(text.encode("utf-8", "replace")) + 1
                if ctx.output_used > limits.output_bytes:
                    raise ConchError(
                        "LimitError", f"output limit of {limits.output_bytes} bytes exceeded"
                    )
            chan.send(["data", text])
            ctx.check_cancelled()
        return kind.ok(str(count), "Range" if type(value) is range else "Array", count, output)


_CACHE_SIZE = 512
# The most a run's changed bindings may take in one ``state`` frame (frames are at most
# 256 MiB): what is over is named unsaved.
STATE_FRAME_BYTES = 192 * 1024 * 1024


def _doc_name(doc: bytes) -> str:
    try:
        return str(orjson.loads(doc).get("name", "?"))
    except (orjson.JSONDecodeError, AttributeError):
        return "?"


def _cached(cache: OrderedDict[str, Any], source: str, build: Callable[[str], Any]) -> Any:
    item = cache.get(source)
    if item is None:
        item = build(source)  # a SyntaxError is raised each time, never cached
        if len(cache) >= _CACHE_SIZE:
            cache.popitem(last=False)
        cache[source] = item
    else:
        cache.move_to_end(source)
    return item


def _compile_program(source: str, names: frozenset[str] = frozenset()) -> Any:
    from conch.lang import compile_program  # type: ignore[attr-defined,unused-ignore]

    return compile_program(source, names)


def _compile_stage(source: str) -> Any:
    from conch.lang import compile_stage  # type: ignore[attr-defined,unused-ignore]

    return compile_stage(source)


def _wants_function(type_name: str) -> bool:
    names = set(type_names(type_name))
    return "Function" in names and "String" not in names and "Any" not in names


def _streamable(value: Any) -> bool:
    return isinstance(value, list | range | values.LazyList | tuple)


def _shallow_type(value: Any) -> str:
    """The type name without forcing a lazy array (a pipeline step must stay lazy)."""
    if isinstance(value, values.LazyList):
        return "Array"
    return values.type_of(value)


# A progress report: the 1-based statement or stage, how many there are, its source text
Progress = Callable[[int, int, str], None]


def _progress(chan: Outbox) -> Progress:
    """Progress reports sent as ``progress`` frames (a streamed run's)."""

    def report(index: int, total: int, text: str) -> None:
        chan.send(["progress", index, total, _shorten(text)])

    return report


def _shorten(text: str, limit: int = 200) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _materialize(value: Any, limit: int | None) -> Any:
    if type(value) is range:
        if limit is not None and len(value) > limit:
            raise ConchError("LimitError", f"collection size limit of {limit} exceeded")
        return value
    if isinstance(value, values.LazyList):
        items: list[Any] = []
        for item in value:
            items.append(item)
            if limit is not None and len(items) > limit:
                raise ConchError("LimitError", f"collection size limit of {limit} exceeded")
        return items
    if type(value) is list and limit is not None and len(value) > limit:
        raise ConchError("LimitError", f"collection size limit of {limit} exceeded")
    return value


def _envelope(
    kind: type[RunEnvelope], value: Any, limits: Limits, output: list[str]
) -> RunEnvelope:
    value = _materialize(value, limits.collection_size)
    type_name = values.type_of(value)
    data = values.to_json_value(value)
    if type(value) is str:
        result = value
    else:
        result = COMPACT_JSON.encode(data)
    if limits.output_bytes is not None and len(result) > limits.output_bytes:
        raise ConchError(
            "LimitError",
            f"the result ({len(result)} characters) exceeds the output limit of "
            f"{limits.output_bytes} bytes",
        )
    return kind.ok(result, type_name, data, output)


def _run_error(exc: ConchError) -> RunError:
    return RunError(**exc.to_dict())

