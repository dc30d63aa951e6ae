"""Which models are in memory: load on first use, keep for ``keep_alive``, evict LRU, all
under a memory budget.

Ollama's semantics for ``keep_alive``: a number of seconds or a duration string ("5m",
"1h30m"); ``0`` unloads as soon as the last request finishes; a negative value keeps the
model loaded until evicted. A model with running or queued requests is never unloaded.

The memory budget (``memory_budget_mb``, :mod:`conch.inference.serving.memory`): each model's
footprint is estimated from its file before it loads and measured once it has; a model that
does not fit unloads idle models, least recently used first, when that makes it fit; else the
request waits (``memory_wait_s``) for busy models to finish, then is answered
:class:`InsufficientMemory` (``503``). ``max_loaded_models`` caps the count on top of it.

Engines are held through the :class:`~conch.inference.engines.base.Engine` protocol;
:func:`~conch.inference.engines.load_engine` picks the runtime for a model's format.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from conch import errors
from conch.config import ModelOverrides, Settings
from conch.inference.engines.base import Engine, EngineError
from conch.inference.engines.load import SERVED_FORMATS, Measured, load_measured, measuring
from conch.inference.models.gguf_info import Footprint
from conch.inference.models.store import ModelRecord, ModelStore
from conch.inference.serving import memory
from conch.inference.serving.memory import Budget, Estimate, mb

log = logging.getLogger(__name__)


class ModelNotFound(errors.NotFound, code="model_not_found"):
    def __init__(self, model_id: str) -> None:
        super().__init__(f"The model '{model_id}' does not exist", where="model")
        self.model_id = model_id


class ModelNotReady(errors.Conflict, code="model_not_ready"):
    """Still downloading or converting, or failed to."""

    def __init__(self, message: str) -> None:
        super().__init__(message, where="model")


class ModelLoadFailed(EngineError, errors.Internal, code="model_load_failed"):
    """The runtime could not load a stored model (a damaged or unsupported file)."""

    def __init__(self, model_id: str, reason: str) -> None:
        super().__init__(f"The model '{model_id}' could not be loaded: {reason}", where="model")
        self.model_id = model_id


class ModelNeedsConversion(errors.Invalid, code="model_needs_conversion"):
    """A source-format model (safetensors): it is stored, but serving it needs a conversion."""

    def __init__(self, record: ModelRecord) -> None:
        target = "gguf (or onnx for an embedding model)" if record.format == "safetensors" else "gguf"
        super().__init__(
            f"The model '{record.id}' is in {record.format} (source) format and cannot serve requests; "
            f"convert it first: POST /v1/models/{record.id}/convert {{\"target_format\": \"gguf\"}} "
            f"(or `conch models convert {record.id} --to gguf`), then use the converted model's id. "
            f"Supported targets: {target}.",
            where="model",
        )
        self.record = record


class InsufficientMemory(errors.Unavailable, code="insufficient_memory"):
    """A model does not fit the memory budget: now (everything loaded is busy, and stayed busy
    for ``memory_wait_s``), or ever (it is larger than the whole budget)."""

    def __init__(self, model_id: str, *, needed: int, free: int, budget: int, parts: Footprint | None,
                 busy: list[tuple[str, int]], waited_s: float | None) -> None:
        what = f"The model '{model_id}' needs ~{mb(needed)} of memory"
        if parts is not None and parts.total_bytes == needed:
            what += (f" (weights {mb(parts.weights_bytes)}, KV cache {mb(parts.kv_bytes)}, "
                     f"compute {mb(parts.compute_bytes)})")
        if waited_s is None:
            message = (f"{what}, more than the whole memory budget of {mb(budget)}: it cannot load even "
                       f"with nothing else loaded. Raise memory_budget_mb, or give the model a smaller "
                       f"context (n_ctx in model_overrides, or POST /v1/models/{model_id}/load)")
        else:
            holders = ", ".join(f"{mid} ({mb(n)})" for mid, n in busy) or "none"
            message = (f"{what} but only {mb(free)} of the {mb(budget)} memory budget is free, and the "
                       f"models holding the rest are serving requests: {holders}. Waited {waited_s:.0f} s "
                       f"(memory_wait_s) for them to finish; try again later")
        super().__init__(message, where="model")
        self.model_id = model_id
        self.needed_bytes = needed
        self.free_bytes = free
        self.budget_bytes = budget


class InvalidKeepAlive(errors.Invalid, ValueError):
    """A ``keep_alive`` that is neither seconds nor a duration (a ValueError too, as any
    parser's refusal)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, where="keep_alive")


_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_keep_alive(value: float | int | str | None, default: float) -> float:
    """Seconds from a keep_alive value; raises :class:`InvalidKeepAlive` (a ``ValueError``) for a malformed one."""
    if value is None:
        return default
    if isinstance(value, int | float):
        return float(value)
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass  # not a bare number: read it as a duration below
    parts = _DURATION.findall(text)
    if not parts or "".join(a + b for a, b in parts) != text:
        raise InvalidKeepAlive(f"invalid keep_alive {value!r}: use seconds or a duration like '5m'")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(a) * scale[b] for a, b in parts)


T = TypeVar("T")


@dataclass(frozen=True)
class FootprintReport:
    """A model's memory as the budget sees it (``GET /v1/models/{id}``, ``/api/ps``)."""

    bytes: int  # what the budget counts: measured once known, else estimated
    estimated_bytes: int
    measured_bytes: int | None
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    gpu_bytes: int | None
    n_ctx: int | None
    kv_cells: int | None


@dataclass
class _Loaded:
    engine: Engine
    record: ModelRecord
    keep_alive_s: float
    last_used: float
    estimate: Estimate
    measured: Measured
    overrides: ModelOverrides | None  # the model's overrides when it loaded
    leases: int = 0
    # Grown by contexts opened after the load (a chat model's embedding context).
    later: dict[str, int] = field(default_factory=dict)

    @property
    def measured_bytes(self) -> int | None:
        if self.measured.total_bytes is None:
            return None
        return self.measured.total_bytes + sum(self.later.values())

    @property
    def bytes(self) -> int:
        """What the budget counts: the measured footprint once known, else the estimate."""
        measured = self.measured_bytes
        return measured if measured is not None else self.estimate.footprint.total_bytes

    @property
    def idle(self) -> bool:
        return self.leases == 0 and not self.engine.busy

    @property
    def expired(self) -> bool:
        if not self.idle or self.keep_alive_s < 0:
            return False
        return time.monotonic() - self.last_used >= self.keep_alive_s


class ModelManager:
    def __init__(self, settings: Settings, store: ModelStore) -> None:
        self.settings = settings
        self.store = store
        self._loaded: OrderedDict[str, _Loaded] = OrderedDict()
        # One load at a time: whether a model fits depends on every load before it.
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._change = asyncio.Event()
        self._change_loop: asyncio.AbstractEventLoop | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._budget: Budget | None = None
        # Measured footprints by (model id, file, load plan): a model loaded again with the same
        # settings is counted at what it took last time, not at its estimate.
        self._measured: dict[tuple[str, str, Any], int] = {}
        self.loads = 0
        self.evictions = 0
        # Tokens generated by engines since unloaded, so counters never go backwards.
        self.unloaded_completion_tokens = 0
        self.unloaded_prefill_tokens = 0

    # -- the budget ------------------------------------------------------------------------
    @property
    def budget(self) -> Budget:
        """The memory budget, read once (the free memory when first asked: at server start)."""
        if self._budget is None:
            self._budget = memory.default_budget(self.settings)
            log.info("memory budget for models: %s (%s)", mb(self._budget.bytes), self._budget.basis)
        return self._budget

    def used_bytes(self) -> int:
        return sum(e.bytes for e in self._loaded.values())

    def free_bytes(self) -> int:
        return max(0, self.budget.bytes - self.used_bytes())

    def estimate(self, record: ModelRecord) -> Estimate:
        """What ``record`` takes loaded with the current settings (reads its file header: blocking)."""
        return memory.estimate(record, self.settings)

    def known_bytes(self, record: ModelRecord, est: Estimate) -> int:
        """The footprint the budget counts for a load of ``record``: as measured at its last load
        with the same settings, else as estimated."""
        return self._measured.get((record.id, record.path, est.key), est.footprint.total_bytes)

    def footprint(self, record: ModelRecord) -> FootprintReport | None:
        """``record``'s memory: the loaded model's, or what loading it now would take (reads
        its file header then: blocking). None for a model that cannot serve."""
        entry = self._loaded.get(record.id)
        if entry is not None:
            est, measured, counted = entry.estimate, entry.measured_bytes, entry.bytes
            gpu = entry.measured.device_bytes
        else:
            if record.status != "ready" or record.format not in SERVED_FORMATS:
                return None
            est = self.estimate(record)
            measured = self._measured.get((record.id, record.path, est.key))
            counted, gpu = self.known_bytes(record, est), None
        fp, plan = est.footprint, est.plan
        return FootprintReport(
            bytes=counted, estimated_bytes=fp.total_bytes, measured_bytes=measured, weights_bytes=fp.weights_bytes,
            kv_bytes=fp.kv_bytes, compute_bytes=fp.compute_bytes, gpu_bytes=gpu,
            n_ctx=getattr(entry.engine, "n_ctx", None) if entry is not None else (plan.n_ctx if plan else None),
            kv_cells=plan.kv_cells if plan else None,
        )

    def _load_lock(self) -> asyncio.Lock:
        """The lock of this event loop (an asyncio lock belongs to the loop that first waits on it)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    # -- lookup --------------------------------------------------------------------------
    def record_for(self, model: str) -> ModelRecord:
        """The ready, servable local model ``model`` names (``local:<id>`` or ``<id>``)."""
        record = self.store.find(model)
        if record is None:
            raise ModelNotFound(model)
        if record.status != "ready":
            raise ModelNotReady(f"The model '{record.id}' is not ready (status: {record.status})")
        if record.format not in SERVED_FORMATS:
            raise ModelNeedsConversion(record)
        return record

    def loaded_ids(self) -> list[str]:
        return list(self._loaded)

    def loaded(self, model_id: str) -> _Loaded | None:
        """The loaded model's entry (engine, footprint, leases), or None."""
        return self._loaded.get(model_id)

    def expires_at(self, entry: _Loaded) -> float | None:
        """When (Unix time) keep_alive unloads the model; None: kept loaded."""
        if entry.keep_alive_s < 0:
            return None
        idle = 0.0 if not entry.idle else time.monotonic() - entry.last_used
        return time.time() + max(entry.keep_alive_s - idle, 0.0)

    def loaded_expiry(self) -> dict[str, float | None]:
        """Loaded model ids -> when (Unix time) keep_alive unloads them; None: kept loaded."""
        return {model_id: self.expires_at(entry) for model_id, entry in list(self._loaded.items())}

    def in_use(self, model_id: str) -> bool:
        entry = self._loaded.get(model_id)
        return entry is not None and not entry.idle

    def engines(self) -> list[Engine]:
        return [e.engine for e in self._loaded.values()]

    def placement(self, model_id: str) -> dict[str, Any] | None:
        """Where a loaded model runs (device, GPU layers, GPU memory); None when not loaded."""
        entry = self._loaded.get(model_id)
        where = getattr(entry.engine, "placement", None) if entry is not None else None
        return where.as_dict() if where is not None else None

    # -- leases --------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def use(self, model: str, keep_alive: float | int | str | None = None) -> AsyncIterator[Engine]:
        """The loaded engine for ``model``, held (never evicted) for the duration of the block."""
        keep = parse_keep_alive(keep_alive, self.settings.keep_alive_s)
        record = self.record_for(model)
        entry = self._loaded.get(record.id)
        if entry is not None and entry.record.path == record.path:
            self._loaded.move_to_end(record.id)
            entry.leases += 1
        else:
            entry = await self._acquire(record)  # loaded, its lease taken
        entry.keep_alive_s = keep
        try:
            yield entry.engine
        finally:
            entry.leases -= 1
            entry.last_used = time.monotonic()
            self._changed()
            if entry.leases == 0 and keep == 0:
                await self._unload_when_idle(record.id)

    async def run(self, model_id: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread, what llama.cpp allocates meanwhile added to
        ``model_id``'s measured footprint (a context the engine opens on first use: a chat
        model's embedding context)."""
        entry = self._loaded.get(model_id)
        if entry is None or entry.record.format != "gguf" or entry.measured.total_bytes is None:
            return await asyncio.to_thread(fn, *args)

        def call() -> tuple[T, Measured]:
            with measuring("gguf") as seen:
                result = fn(*args)
            return result, seen

        result, seen = await asyncio.to_thread(call)
        if seen.total_bytes:
            name = getattr(fn, "__name__", "call")
            entry.later[name] = entry.later.get(name, 0) + seen.total_bytes
            self._measured[(entry.record.id, entry.record.path, entry.estimate.key)] = entry.bytes
            log.info("model %s: %s allocated %s more (now %s)", model_id, name, mb(seen.total_bytes), mb(entry.bytes))
        return result

    async def _acquire(self, record: ModelRecord) -> _Loaded:
        """The model loaded and leased: room made under the budget, waiting up to
        ``memory_wait_s`` while the models holding the memory are busy."""
        started = time.monotonic()
        announced = False
        while True:
            async with self._load_lock():
                entry = self._loaded.get(record.id)
                if entry is not None and entry.record.path == record.path:
                    self._loaded.move_to_end(record.id)
                    entry.leases += 1
                    return entry
                if entry is not None:  # the file behind the id changed: reload
                    await self.unload(record.id)
                est = await asyncio.to_thread(self.estimate, record)
                need = self.known_bytes(record, est)
                budget = self.budget.bytes
                if need > budget:
                    raise InsufficientMemory(record.id, needed=need, free=self.free_bytes(), budget=budget,
                                             parts=est.footprint, busy=[], waited_s=None)
                if await self._make_room(record.id, need):
                    entry = await self._load(record, est)
                    entry.leases += 1
                    return entry
                busy = [(k, v.bytes) for k, v in self._loaded.items() if not v.idle]
                free = self.free_bytes()
            waited = time.monotonic() - started
            if waited >= self.settings.memory_wait_s:
                log.warning("model %s (%s) did not fit in %.0f s: %s of %s free", record.id, mb(need), waited,
                            mb(free), mb(budget))
                raise InsufficientMemory(record.id, needed=need, free=free, budget=budget,
                                         parts=est.footprint, busy=busy, waited_s=waited)
            if not announced:
                announced = True
                log.info("model %s (%s) waits for memory: %s of %s free, held by busy models", record.id,
                         mb(need), mb(free), mb(budget))
            await self._wait_for_change(min(0.25, self.settings.memory_wait_s - waited))

    async def _load(self, record: ModelRecord, est: Estimate) -> _Loaded:
        await self._make_gpu_room(record)
        loading = asyncio.ensure_future(asyncio.to_thread(load_measured, record, self.settings))
        cancelled = False
        try:
            try:
                engine, measured = await asyncio.shield(loading)
            except asyncio.CancelledError:
                # The request went away mid-load. The load goes on in its thread regardless: wait
                # for it and keep the model, counted (keep_alive unloads it), rather than leave an
                # engine nobody holds or counts.
                cancelled = True
                engine, measured = await loading
        except (ValueError, OSError) as exc:  # llama.cpp's "Failed to load model from file"
            raise ModelLoadFailed(record.id, str(exc)) from exc
        self.loads += 1
        over = self.settings.model_overrides.get(record.id)
        entry = _Loaded(engine, record, self.settings.keep_alive_s, time.monotonic(), est, measured,
                        over.model_copy() if over is not None else None)
        if measured.total_bytes is not None:
            self._measured[(record.id, record.path, est.key)] = measured.total_bytes
        log.info("model %s loaded: %s (estimated %s); %s of the %s budget in use", record.id,
                 mb(entry.bytes), mb(est.footprint.total_bytes), mb(self.used_bytes() + entry.bytes),
                 mb(self.budget.bytes))
        self._loaded[record.id] = entry
        self._start_reaper()
        if cancelled:
            raise asyncio.CancelledError
        return entry

    async def _make_room(self, model_id: str, need: int) -> bool:
        """Unload idle models, least recently used first, so that ``need`` more bytes fit the
        budget (and the count cap); False, with nothing unloaded for the budget, when even
        unloading every idle model would not make it fit."""
        limit = max(1, self.settings.max_loaded_models)
        while len(self._loaded) >= limit:
            victim = next((k for k, v in self._loaded.items() if v.idle), None)
            if victim is None:
                break  # everything is busy: exceed the count briefly rather than fail requests
            log.info("unloading %s: max_loaded_models = %d", victim, limit)
            await self._evict(victim)
        budget = self.budget.bytes
        used = self.used_bytes()
        if used + need <= budget:
            return True
        idle = sum(v.bytes for v in self._loaded.values() if v.idle)
        if used - idle + need > budget:
            return False  # unloading would not be enough: keep what is loaded, and wait
        while self.used_bytes() + need > budget:
            victim = next((k for k, v in self._loaded.items() if v.idle), None)
            if victim is None:  # one became busy meanwhile
                return False
            log.info("unloading %s (%s): %s needs %s, %s of %s free", victim, mb(self._loaded[victim].bytes),
                     model_id, mb(need), mb(budget - self.used_bytes()), mb(budget))
            await self._evict(victim)
        return True

    async def _evict(self, model_id: str) -> None:
        if await self.unload(model_id):
            self.evictions += 1

    async def _make_gpu_room(self, record: ModelRecord) -> None:
        """Unload idle models that hold GPU memory (least recently used first) while the model
        about to load would not fit on the GPU, as Ollama does; with none idle, it is loaded
        partly offloaded instead (conch.inference.engines.llama.offload)."""
        if record.format != "gguf":
            return
        from conch.inference.engines.llama.offload import gpu_shortfall

        while (short := await asyncio.to_thread(gpu_shortfall, self.settings, record.id, record.path)) > 0:
            victim = next((k for k, v in self._loaded.items() if v.idle
                           and (getattr(v.engine, "placement", None) is not None
                                and v.engine.placement.n_gpu_layers != 0)), None)  # type: ignore[attr-defined]
            if victim is None:
                return
            log.info("unloading %s: %s needs %.1f GiB more GPU memory", victim, record.id, short / 2**30)
            await self._evict(victim)

    # -- per-model load settings -----------------------------------------------------------
    async def load(self, model: str, changes: dict[str, Any] | None = None,
                   keep_alive: float | int | str | None = None) -> _Loaded:
        """Apply ``changes`` to the model's ``model_overrides`` (a ``None`` value: inherit the
        server-wide setting again) and load it with them, reloading it if it was loaded with
        other settings. Refused (``409 model_in_use``) while it serves requests under other settings."""
        keep = parse_keep_alive(keep_alive, self.settings.keep_alive_s)
        if keep == 0:
            raise InvalidKeepAlive("keep_alive 0 would unload the model as soon as it loaded: give a duration, "
                                   "or a negative value to keep it loaded")
        record = self.record_for(model)
        current = self.settings.model_overrides.get(record.id)
        merged = ModelOverrides.model_validate({**(current.model_dump() if current else {}), **(changes or {})})
        async with self._load_lock():
            entry = self._loaded.get(record.id)
            reload = entry is not None and _differ(entry.overrides, merged)
            if entry is not None and reload and not entry.idle:
                from conch.inference.serving.errors import Conflict

                raise Conflict(f"The model '{record.id}' is serving requests with its current settings; "
                               "try again when they finish", where="model", code="model_in_use")
            self._set_overrides(record.id, merged)
            try:
                # Settings that can never fit are refused before the loaded model is disturbed.
                est = await asyncio.to_thread(self.estimate, record)
                need = self.known_bytes(record, est)
                if need > self.budget.bytes:
                    raise InsufficientMemory(record.id, needed=need, free=self.free_bytes(), budget=self.budget.bytes,
                                             parts=est.footprint, busy=[], waited_s=None)
            except BaseException:
                self._set_overrides(record.id, current)
                raise
            if reload:
                await self.unload(record.id)
        try:
            async with self.use(record.id, keep):
                entry = self._loaded[record.id]
        except BaseException:
            # Settings that could not load (too large for the budget, refused by llama.cpp) are
            # not kept: the model's next request loads as before.
            if not _differ(self.settings.model_overrides.get(record.id), merged):
                self._set_overrides(record.id, current)
            raise
        return entry

    def _set_overrides(self, model_id: str, overrides: ModelOverrides | None) -> None:
        if overrides is not None and any(v is not None for v in overrides.model_dump().values()):
            self.settings.model_overrides[model_id] = overrides
        else:
            self.settings.model_overrides.pop(model_id, None)

    # -- unloading -------------------------------------------------------------------------
    def _changed(self) -> None:
        """Wake the requests waiting for memory: a lease ended or a model unloaded."""
        self._change.set()
        self._change = asyncio.Event()

    async def _wait_for_change(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        if self._change_loop is not loop:  # an event is bound to the loop that first waits on it
            self._change, self._change_loop = asyncio.Event(), loop
        # Also on a timer: a model stops being busy when its engine's queue drains, which no
        # lease end announces.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._change.wait(), max(timeout, 0.01))

    async def _unload_when_idle(self, model_id: str) -> None:
        entry = self._loaded.get(model_id)
        if entry is not None and entry.idle:
            await self.unload(model_id)

    async def unload(self, model_id: str) -> bool:
        entry = self._loaded.pop(model_id, None)
        if entry is None:
            return False
        await asyncio.to_thread(entry.engine.unload)
        self.unloaded_completion_tokens += entry.engine.stats.completion_tokens
        self.unloaded_prefill_tokens += entry.engine.stats.prefill_tokens
        self._changed()
        return True

    async def unload_all(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for model_id in list(self._loaded):
            await self.unload(model_id)

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        while self._loaded:
            await asyncio.sleep(1.0)
            for model_id, entry in list(self._loaded.items()):
                if entry.expired:
                    await self.unload(model_id)


def _differ(a: ModelOverrides | None, b: ModelOverrides | None) -> bool:
    """Whether two sets of overrides load a model differently (unset and absent are alike)."""
    return (a or ModelOverrides()).model_dump() != (b or ModelOverrides()).model_dump()
