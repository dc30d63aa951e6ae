"""Speculative decoding: draft the next tokens from where the text repeats, as many as pay.

When a model copies (code being edited, a document being quoted, a JSON object echoed back, an
agent's tool arguments) or repeats itself (lists, tables, a loop it fell into), the tokens
after the last few have usually appeared before, in the prompt or in the reply so far.
:class:`NgramDrafter` indexes every 2-, 3- and 4-gram of the sequence (prompt and generated
tokens) by where it last occurred, finds the latest earlier occurrence of the sequence's tail
and proposes what followed it; where that runs into the present (the text repeats with a period
shorter than the draft), the draft goes on around the period, as llama-server's ``ngram-mod``
does by following its n-gram map. The scheduler decodes the proposal in the same step as the
sequence's next token, one logits row per position, and keeps drafted tokens while each equals
what the sampler draws at its position.

Why the output does not change: every emitted token is still drawn by one call of the
request's own sampler chain, in order, on the logits of exactly the prefix it follows (a
drafted token is kept only when it *is* the token drawn before it). A sampled request draws
from the same distributions with the same random stream (one draw per emitted token), which is
standard speculative sampling with a draft that puts all its mass on one token. A greedy one
gives the same tokens when the verified rows' logits are bitwise those of one-row steps: on
the CPU the scheduler decodes every step without a long prompt chunk on ggml's reference
kernels (``backend.ReferenceKernels``), which compute each row alone whatever else the step
holds, so they are; tests/inference/test_speculative.py holds it on long outputs.

How much to draft (:class:`DraftPolicy`): a drafted position costs a row of the step (on the
CPU ~0.4 of a one-row step for a small model: the weights are read once for every row, the
arithmetic is per row; on a GPU a few dozen rows cost about what one does) and pays only when
it is kept. Per request and per kind of match (how long the tail's match is: a 2-token
coincidence or a 20-token copied line), the policy keeps how often a drafted token was kept
after its predecessors were, and drafts the length that maximises the expected tokens per unit
of step cost; none when no length beats a plain step. So text that never repeats costs a
dictionary lookup per token, and a copying or looping reply drafts long. The row's cost is a
constant per device, not a timing: a decision that depended on the clock would make the same
request batch differently from one run to the next, and so change its output.

With a draft model (draft_model.py) as well, a step takes the n-gram draft when its match is
at least ``NGRAM_OVER_MODEL`` tokens long (the text is being copied: free to propose and
usually right), and otherwise the draft model's greedy continuation, up to
``MODEL_DRAFT_MAX`` tokens while its drafts are kept often enough (:class:`Acceptance`).
"""

from __future__ import annotations

from collections.abc import Iterable

NGRAM_SIZES = (4, 3, 2)  # longest first: a longer match predicts better
# How far back a match is measured (its length picks the policy's statistics).
MATCH_PROBE = 32
# Match-length buckets (a lower bound each) and the keep rate each starts from.
MATCH_BUCKETS = (0, 4, 8, 16)
# Optimistic: a request finds out in a few drafts, and a draft of one or two tokens costs little.
PRIOR_KEEP = (0.6, 0.7, 0.8, 0.9)
PRIOR_WEIGHT = 2.0
# Older outcomes count less (per judged draft), so a reply that stops copying stops drafting.
DECAY = 0.95
# A draft must promise this many tokens per unit of cost more than a plain step (noise margin).
MIN_GAIN = 1.03
# A drafted row's cost relative to a one-row step on the CPU (SmolLM2-135M, 2 cores:
# llama-server's 65-row verification steps cost 0.41 of a one-row step per row).
ROW_COST_CPU = 0.4
# Where llama_decode only queues the step (every layer on a GPU): a step of a few dozen rows
# costs about what a one-row step costs.
ROW_COST_GPU = 0.05
# The draft model's drafts (each costs a decode of the draft model): at most this many per step,
# and off for a request whose drafts were kept less than MIN_ACCEPT_RATE after JUDGE_AFTER.
MODEL_DRAFT_MAX = 16
JUDGE_AFTER = 24
MIN_ACCEPT_RATE = 0.3
# With a draft model too: the n-gram draft is taken when its match is this long or longer.
NGRAM_OVER_MODEL = 3


class Acceptance:
    """How often one request's drafts from one source were kept; off when rarely."""

    def __init__(self) -> None:
        self.drafted = 0
        self.accepted = 0
        self.enabled = True

    def judge(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        if self.drafted >= JUDGE_AFTER and self.accepted < MIN_ACCEPT_RATE * self.drafted:
            self.enabled = False


class DraftPolicy:
    """One request's record of kept drafts, per match-length bucket, and the length to draft."""

    def __init__(self) -> None:
        self._kept = [PRIOR_WEIGHT * p for p in PRIOR_KEEP]
        self._seen = [PRIOR_WEIGHT] * len(PRIOR_KEEP)
        # (bucket, limit, row cost in hundredths) -> length: a step asks again until judged.
        self._lengths: dict[tuple[int, int, int], int] = {}

    @staticmethod
    def bucket(match: int) -> int:
        b = 0
        for i, low in enumerate(MATCH_BUCKETS):
            if match >= low:
                b = i
        return b

    def keep_rate(self, match: int) -> float:
        b = self.bucket(match)
        return self._kept[b] / self._seen[b]

    def length(self, match: int, limit: int, row_cost: float) -> int:
        """The draft length (0..limit) with the most expected tokens per unit of step cost."""
        if limit <= 0 or match <= 0:
            return 0
        key = (self.bucket(match), limit, round(row_cost * 100))
        known = self._lengths.get(key)
        if known is not None:
            return known
        p = self.keep_rate(match)
        best, best_gain = 0, MIN_GAIN
        expected, pk = 1.0, 1.0
        for k in range(1, limit + 1):
            pk *= p
            expected += pk
            gain = expected / (1.0 + row_cost * k)
            if gain > best_gain:
                best, best_gain = k, gain
            elif pk < 1e-3:
                break
        self._lengths[key] = best
        return best

    def judge(self, match: int, drafted: int, kept: int) -> None:
        """A draft of ``drafted`` tokens made on a ``match``-token match kept its first ``kept``:
        that many kept after their predecessors, and one refused unless all were kept."""
        b = self.bucket(match)
        self._lengths.clear()
        self._kept[b] = self._kept[b] * DECAY + kept
        self._seen[b] = self._seen[b] * DECAY + kept + (1 if kept < drafted else 0)


class NgramDrafter:
    """The token history of one request with an index of where each n-gram was last followed,
    and its :class:`DraftPolicy`."""

    def __init__(self, tokens: Iterable[int]) -> None:
        self.history: list[int] = []
        # n-gram -> the position right after its latest occurrence that has a continuation
        self._next: dict[tuple[int, ...], int] = {}
        self.policy = DraftPolicy()
        self.last_match = 0  # the match length behind the latest proposal (what judge() judges)
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        hist, index = self.history, self._next
        for tok in tokens:
            end = len(hist)  # the n-grams ending just before `tok` are now followed by it
            for n in NGRAM_SIZES:
                if end >= n:
                    index[tuple(hist[end - n : end])] = end
            hist.append(tok)

    def propose(self, limit: int, row_cost: float = ROW_COST_CPU) -> tuple[int, list[int]]:
        """The match length and the draft worth decoding: as long as the policy finds it pays
        (up to ``limit``), none when no length does."""
        m, tokens = self.match(limit)
        self.last_match = m
        k = self.policy.length(m, len(tokens), row_cost)
        return m, tokens[:k]

    def draft(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the latest earlier occurrence of the history's
        tail (the longest n-gram that has one), or none: none too while drafts after such a
        match do not pay (:attr:`enabled`)."""
        m, tokens = self.match(limit)
        self.last_match = m
        return tokens if self.policy.length(m, 1, ROW_COST_CPU) else []

    @property
    def enabled(self) -> bool:
        """Whether a draft after the latest proposal's match would pay."""
        return self.policy.length(max(self.last_match, 1), 1, ROW_COST_CPU) > 0

    def judge(self, drafted: int, accepted: int) -> None:
        """The latest proposal's outcome: ``accepted`` of its ``drafted`` tokens kept."""
        self.policy.judge(self.last_match, drafted, accepted)

    def match(self, limit: int) -> tuple[int, list[int]]:
        """The tail's match length (0: none), measured back up to :data:`MATCH_PROBE` tokens,
        and up to ``limit`` tokens that followed it."""
        if limit <= 0:
            return 0, []
        hist = self.history
        size = len(hist)
        for n in NGRAM_SIZES:
            if size <= n:
                continue
            at = self._next.get(tuple(hist[-n:]))
            if at is None:
                continue
            m = n
            while m < MATCH_PROBE and at - m - 1 >= 0 and hist[at - m - 1] == hist[size - m - 1]:
                m += 1
            period = size - at
            if limit <= period:
                return m, hist[at : at + limit]
            # The continuation runs into the present: the text repeats every `period` tokens.
            cycle = hist[at:]
            return m, [cycle[i % period] for i in range(limit)]
        return 0, []
