"""Counters the serving layer keeps for the server's metrics (plain numbers, no exporter)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServingMetrics:
    """Tokens in and out, time to first token as a sum (seconds) and a count, decode rate."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0
    gen_seconds: float = 0.0
    gen_tokens: int = 0
    last_tokens_per_second: float = 0.0
    embedded_inputs: int = 0

    def observe_generation(self, ttft: float | None, seconds: float, prompt_tokens: int, tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += tokens
        if ttft is not None:
            self.ttft_sum += ttft
            self.ttft_count += 1
        if tokens > 0 and seconds > 0:
            self.gen_seconds += seconds
            self.gen_tokens += tokens
            self.last_tokens_per_second = tokens / seconds
