"""One request in the llama.cpp scheduler: its tokens, sampler, text so far and events out.

The scheduler (``scheduler.py``) owns the jobs and steps them; the KV pool (``kv_pool.py``)
places their cells and the sampling helpers (``sampling.py``) pick their tokens. A job is a
plain record they all share, so it lives apart from each of them.
"""

from __future__ import annotations

import asyncio
import codecs
from dataclasses import dataclass, field
from typing import Any

from conch.inference.engines.base import SamplingParams, TokenEvent, TokenLogprob
from conch.inference.engines.llama.sampling import Greedy
from conch.inference.engines.llama.speculative import Acceptance, NgramDrafter


@dataclass(eq=False)  # a job is itself: compared by identity (lists hold it, `in` finds it)
class Job:
    tokens: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[TokenEvent]
    max_tokens: int
    cancelled: bool = False
    seq: int = -1
    sampler: Any = None
    greedy: Greedy | None = None  # temperature 0 and at most a bias: numpy picks the token
    n_past: int = 0  # tokens of this sequence already in the KV cache
    n_gen: int = 0
    generated: list[int] = field(default_factory=list)
    last_token: int = -1
    text: str = ""
    emitted: int = 0
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_hit: str | None = None
    # The scheduler's events of the current step, sent to the event loop together (_flush).
    outbox: list[tuple[Job, TokenEvent]] = field(default_factory=list)
    drafter: NgramDrafter | None = None  # made when the job first generates, if drafting is on
    model_drafts: Acceptance = field(default_factory=Acceptance)  # the draft model's, if any
    # Tokens sampled but not yet turned into text (Scheduler.overlap_text: while the GPU computes
    # the next step), and whether the job has ended.
    unsent: list[int] = field(default_factory=list)
    finished: bool = False
    # A prompt with images (vision.MediaPrompt): its image chunks are evaluated by the
    # projector before the text after them; ``tokens`` holds placeholders for their tokens.
    media: Any = None
    # Positions minus cells (M-RoPE models place an image on fewer positions than tokens): a
    # token's position is its index plus this, once the images before it are in.
    pos_shift: int = 0

    def push(self, ev: TokenEvent) -> None:
        if self.pending_logprobs:
            # Log-probabilities ride on the next event out (text may be held for stop strings).
            ev.logprobs, self.pending_logprobs = self.pending_logprobs, []
        self.outbox.append((self, ev))

    def append_text(self, delta: str) -> str | None:
        """Add decoded text; emit what can no longer become a stop string. Returns "stop" on a match.

        Stop strings are matched on the text, not on tokens, and text that could still become
        a stop string is held back until it cannot, so a stop string never reaches the client."""
        stops = self.params.stop
        if not delta:
            return None
        start = max(0, len(self.text) - max((len(s) for s in stops), default=0))
        self.text += delta
        if stops:
            found = [(i, s) for s in stops if s and (i := self.text.find(s, start)) >= 0]
            hit = min(found)[0] if found else -1
            if hit >= 0:
                self.stop_hit = min(found)[1]
                self.text = self.text[:hit]
                out = self.text[self.emitted :]
                self.emitted = len(self.text)
                if out:
                    self.push(TokenEvent(out, self.n_gen))
                return "stop"
            hold = 0
            for s in stops:
                for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(s[:k]):
                        hold = max(hold, k)
                        break
            end = len(self.text) - hold
        else:
            end = len(self.text)
        if end > self.emitted:
            out = self.text[self.emitted : end]
            self.emitted = end
            self.push(TokenEvent(out, self.n_gen))
        return None
