"""Speculative decoding by prompt lookup: draft the next tokens from where the text repeats.

When a model copies from its input (code being edited, a document being quoted, a JSON
object echoed back, an agent's tool arguments), the tokens after the last few generated ones
have usually appeared before. :class:`NgramDrafter` finds the latest earlier occurrence of the
last 4, 3 or 2 tokens and proposes what followed it. The scheduler decodes the proposal in the
same step as the sequence's next token, one logits row per position, and keeps drafted tokens
while each equals what the sampler draws at its position.

Why the output does not change: every emitted token is still drawn by one call of the
request's own sampler chain, in order, on the logits of exactly the prefix it follows (a
drafted token is kept only when it *is* the token drawn before it). A greedy request gives the
same tokens; a sampled one draws from the same distributions with the same random stream (one
draw per emitted token), which is standard speculative sampling with a draft that puts all its
mass on one token. On the CPU, where every micro-batch stays under 64 tokens, the logits of a
position are bitwise those of decoding it alone (docs/inference.md), so greedy output is
identical token for token; tests/inference/test_speculative.py holds that.

A request whose drafts are rarely kept stops drafting (``MIN_ACCEPT_RATE``), so text that does
not repeat costs one dictionary lookup per token.

With a draft model (draft_model.py) as well, a step takes the prompt-lookup draft when its
match is at least ``NGRAM_OVER_MODEL`` tokens long (the text is being copied: free to propose
and usually right), and otherwise the draft model's greedy continuation. Each source is judged
on its own, per request: a request whose model drafts are rarely kept stops asking for them.
"""

from __future__ import annotations

from collections.abc import Iterable

NGRAM_SIZES = (4, 3, 2)  # longest first: a longer match predicts better
# After this many drafted tokens a request whose drafts were kept less often than
# MIN_ACCEPT_RATE stops drafting: each drafted token costs a position in the step.
JUDGE_AFTER = 24
MIN_ACCEPT_RATE = 0.3
# With a draft model too: the prompt-lookup draft is taken when its match is this long or longer.
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


class NgramDrafter:
    """The token history of one request with an index of where each n-gram was last followed."""

    def __init__(self, tokens: Iterable[int]) -> None:
        self.history: list[int] = []
        # n-gram -> the position right after its latest occurrence that has a continuation
        self._next: dict[tuple[int, ...], int] = {}
        self.drafted = 0
        self.accepted = 0
        self.enabled = True
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        hist, index = self.history, self._next
        for tok in tokens:
            end = len(hist)  # the n-grams ending just before `tok` are now followed by it
            for n in NGRAM_SIZES:
                if end >= n:
                    index[tuple(hist[end - n : end])] = end
            hist.append(tok)

    def draft(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the latest earlier occurrence of the history's
        tail (the longest n-gram that has one), or none."""
        return self.match(limit)[1]

    def match(self, limit: int) -> tuple[int, list[int]]:
        """The draft (as :meth:`draft`) with the length of the n-gram it follows (0: none)."""
        if not self.enabled or limit <= 0:
            return 0, []
        hist = self.history
        for n in NGRAM_SIZES:
            if len(hist) <= n:
                continue
            at = self._next.get(tuple(hist[-n:]))
            if at is not None:
                return n, hist[at : at + limit]
        return 0, []

    def judge(self, drafted: int, accepted: int) -> None:
        """Count a step's outcome; stop drafting when drafts are rarely kept."""
        self.drafted += drafted
        self.accepted += accepted
        if self.drafted >= JUDGE_AFTER and self.accepted < MIN_ACCEPT_RATE * self.drafted:
            self.enabled = False
