"""The inference server's Prometheus series, on top of the shared request counter: tokens,
time to first token, decode rate, queue and sequences, loaded models, and where they run.

The serving layer and the engines keep plain numbers (they know nothing of Prometheus); they
are read when scraped. The device is probed by the ``/metrics`` route off the event loop
(``nvidia-smi`` may take tens of milliseconds) and handed to :meth:`InferenceMetrics.response`.

The same numbers, sampled by the server every 2 s, are its status history
(:meth:`InferenceMetrics.history`, ``GET /v1/status/history``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector
from starlette.responses import Response

from conch.inference.engines.llama.device import DeviceInfo, device_info
from conch.inference.serving.manager import ModelManager
from conch.inference.serving.metrics import ServingMetrics
from conch.web.common.history import Figure, Reading, StatusHistory, resident_memory_bytes
from conch.web.common.metrics import HTTPMetrics

FIGURES = (
    Figure("requests_per_s", "counter", "req/s",
           "API requests (monitoring routes and requests marked X-Conch-Poll left out)"),
    Figure("generated_tokens_per_s", "counter", "tokens/s",
           "Tokens sampled by the engines, counted as each is sampled", held_by="active_sequences"),
    Figure("prefill_tokens_per_s", "counter", "tokens/s",
           "Prompt tokens decoded by the engines, counted at each step"),
    Figure("active_sequences", "gauge", "sequences", "Sequences being read or generated"),
    Figure("queue_depth", "gauge", "requests", "Requests waiting for a free sequence"),
    Figure("models_loaded", "gauge", "models", "Models in memory"),
    Figure("gpu_memory_used_bytes", "gauge", "bytes", "GPU memory in use, all GPUs (null without one)"),
    Figure("gpu_memory_total_bytes", "gauge", "bytes", "GPU memory in all (null without a GPU)"),
    Figure("resident_memory_bytes", "gauge", "bytes", "This process's resident memory"),
)


class _ServingCollector(Collector):
    def __init__(self, metrics: InferenceMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m, mgr = self.metrics.serving, self.metrics.manager
        engines = mgr.engines()
        generated = sum(e.stats.completion_tokens for e in engines) + mgr.unloaded_completion_tokens
        prefilled = sum(getattr(e.stats, "prefill_tokens", 0) for e in engines) + mgr.unloaded_prefill_tokens
        counters = (
            ("prompt_tokens", "Tokens read (prompts and embedding inputs).", m.prompt_tokens),
            ("completion_tokens", "Tokens generated.", m.completion_tokens),
            ("generated_tokens", "Tokens sampled by the engines (including cancelled streams).", generated),
            ("prefill_tokens", "Prompt tokens decoded by the engines, at each step (KV cache hits not included).",
             prefilled),
            ("generation_seconds", "Wall time of completed generations.", m.gen_seconds),
            ("embedded_inputs", "Inputs embedded.", m.embedded_inputs),
            # Speculative decoding, summed over the loaded models
            ("draft_tokens", "Tokens drafted for speculative decoding (n-gram or draft-model drafts).",
             sum(getattr(e.stats, "draft_tokens", 0) for e in engines)),
            ("draft_accepted_tokens", "Drafted tokens kept (each equal to the token drawn).",
             sum(getattr(e.stats, "draft_accepted_tokens", 0) for e in engines)),
            # The prompt cache on disk (docs/inference.md, "Prompt cache across restarts")
            ("prompt_cache_restored_tokens", "Prompt tokens whose KV was loaded from disk instead of computed.",
             sum(getattr(e.stats, "prompt_cache_restored_tokens", 0) for e in engines)),
            ("prompt_cache_saved_tokens", "Prompt tokens whose KV was saved to disk.",
             sum(getattr(e.stats, "prompt_cache_saved_tokens", 0) for e in engines)),
            ("model_evictions", "Idle models unloaded to make room for another (memory budget, max_loaded_models).",
             mgr.evictions),
        )
        for name, help_, value in counters:
            yield CounterMetricFamily(f"conch_inference_{name}", help_, value=value)
        gauges = (
            ("tokens_per_second", "Decode rate of the last completed generation.", m.last_tokens_per_second),
            ("queue_depth", "Requests waiting for a free sequence.", sum(e.queued for e in engines)),
            ("active_sequences", "Sequences being generated now.", sum(e.active_sequences for e in engines)),
            ("models_loaded", "Models in memory.", len(engines)),
            # The models' memory budget (docs/inference.md, "Many models under a memory budget")
            ("memory_budget_bytes", "What the loaded models may hold together (memory_budget_mb).",
             mgr.budget.bytes),
            ("memory_used_bytes", "What the loaded models hold, as the budget counts it.", mgr.used_bytes()),
        )
        for name, help_, value in gauges:
            yield GaugeMetricFamily(f"conch_inference_{name}", help_, value=value)
        per_model = GaugeMetricFamily("conch_inference_model_memory_bytes",
                                      "A loaded model's memory as the budget counts it.", labels=["model"])
        for mid in mgr.loaded_ids():
            entry = mgr.loaded(mid)
            if entry is not None:
                per_model.add_metric([mid], entry.bytes)
        yield per_model
        yield SummaryMetricFamily(
            "conch_inference_time_to_first_token_seconds", "Time from request to first generated output.",
            count_value=m.ttft_count, sum_value=m.ttft_sum,
        )
        yield from self._device(mgr)

    def _device(self, mgr: ModelManager) -> Iterator[Metric]:
        """The device models run on, GPU memory, and each loaded model's GPU layers and memory."""
        where = self.metrics.device
        if where is None:
            return
        info = GaugeMetricFamily(
            "conch_inference_device_info", "Where models run: cpu, or the GPU backend and GPUs (always 1).",
            labels=["device", "backend"],
        )
        info.add_metric([where.device, where.backend], 1)
        yield info
        for name, help_, attr in (
            ("gpu_memory_used_bytes", "GPU memory in use (all processes).", "memory_used_bytes"),
            ("gpu_memory_total_bytes", "GPU memory in all.", "memory_total_bytes"),
        ):
            memory = GaugeMetricFamily(f"conch_inference_{name}", help_, labels=["gpu", "name"])
            for g in where.gpus:
                value = getattr(g, attr)
                if value is not None:
                    memory.add_metric([str(g.index), g.name], value)
            yield memory
        placed = [(mid, mgr.placement(mid)) for mid in mgr.loaded_ids()]
        for name, help_, key in (
            ("model_gpu_layers", "Layers of a loaded model on the GPU.", "n_gpu_layers"),
            ("model_vram_bytes", "GPU memory a loaded model took when it loaded.", "vram_bytes"),
        ):
            per_model = GaugeMetricFamily(f"conch_inference_{name}", help_, labels=["model"])
            for mid, where_m in placed:
                if where_m is not None and where_m.get(key) is not None:
                    per_model.add_metric([mid], where_m[key])
            yield per_model


class InferenceMetrics(HTTPMetrics):
    """Also what ``/v1/status`` reports: when the server started and how many API requests
    (under ``/v1/``, a client's polling left out) it has answered."""

    def __init__(self, serving: ServingMetrics, manager: ModelManager) -> None:
        super().__init__("conch_inference_requests")
        self.serving = serving
        self.manager = manager
        self.started = time.time()
        self.served = 0
        self.device: DeviceInfo | None = None
        self.registry.register(_ServingCollector(self))

    def count_request(self, route: str, method: str, status: int, polling: bool = False) -> None:
        super().count_request(route, method, status, polling)
        if route.startswith("/v1/") and not polling:
            self.served += 1

    def response_for(self, device: DeviceInfo) -> Response:
        """The exposition, with the device as just probed."""
        self.device = device
        return self.response()

    def history(self) -> StatusHistory:
        """The server's status history: its figures sampled every 2 s (module doc)."""
        mgr = self.manager

        async def read() -> Reading:
            where = await asyncio.to_thread(device_info)  # cached; nvidia-smi may be slow
            engines = mgr.engines()
            used = [g.memory_used_bytes for g in where.gpus if g.memory_used_bytes is not None]
            total = [g.memory_total_bytes for g in where.gpus if g.memory_total_bytes is not None]
            return {
                "requests_per_s": self.traffic,
                "generated_tokens_per_s": sum(e.stats.completion_tokens for e in engines)
                + mgr.unloaded_completion_tokens,
                "prefill_tokens_per_s": sum(getattr(e.stats, "prefill_tokens", 0) for e in engines)
                + mgr.unloaded_prefill_tokens,
                "active_sequences": sum(e.active_sequences for e in engines),
                "queue_depth": sum(e.queued for e in engines),
                "models_loaded": len(engines),
                "gpu_memory_used_bytes": float(sum(used)) if used else None,
                "gpu_memory_total_bytes": float(sum(total)) if total else None,
                "resident_memory_bytes": resident_memory_bytes(),
            }

        return StatusHistory(FIGURES, read)
