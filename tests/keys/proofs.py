"""The concurrency proofs of the limits, shared by the SQLite and PostgreSQL tests.

Many threads, on several engines (or several processes) of one database, admit requests of
one key as fast as they can until refused; what they were admitted is compared with the
limit. Run as ``python -m tests.keys.proofs URL SECRET THREADS MODE START_AT``, one process is one
"server": it prints its tally as JSON.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from conch import db
from conch.keys import KeyLimitExceeded, KeyService, Limiter


@dataclass
class Tally:
    admitted: int = 0
    settled_tokens: int = 0
    refusals: list[tuple[str, str, float | None]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def to_dict(self) -> dict[str, Any]:
        return {
            "admitted": self.admitted,
            "settled_tokens": self.settled_tokens,
            "refusals": self.refusals,
            "errors": self.errors,
        }

    def add(self, other: dict[str, Any]) -> None:
        self.admitted += other["admitted"]
        self.settled_tokens += other["settled_tokens"]
        self.refusals.extend(tuple(r) for r in other["refusals"])
        self.errors.extend(other["errors"])


def hammer(
    engines: list[sa.Engine],
    secret: str,
    *,
    threads: int,
    mode: str,
    reserve: int = 64,
    tally: Tally | None = None,
    start_at: float | None = None,
) -> Tally:
    """``threads`` threads, spread over ``engines`` (one KeyService and Limiter each, as a
    server has), each admitting until its first refusal.

    ``mode``: ``tokens`` reserves ``reserve`` tokens and settles all of them; ``tokens-less``
    settles a random part (1..reserve), giving the rest back; ``requests`` admits plain
    requests. ``start_at``: a time (Unix seconds) to start at, so that processes start
    together."""
    tally = tally or Tally()
    servers = [(KeyService(e), Limiter(e)) for e in engines]
    start = threading.Barrier(threads)

    def work(i: int) -> None:
        keys, limiter = servers[i % len(servers)]
        rng = random.Random(i)
        try:
            principal = keys.authenticate(secret)
            assert principal is not None
            start.wait()
            if start_at is not None:
                time.sleep(max(0.0, start_at - time.time()))
            while True:
                try:
                    if mode == "requests":
                        limiter.admit(principal)
                        with tally.lock:
                            tally.admitted += 1
                        continue
                    admission = limiter.admit(principal, tokens=reserve)
                except KeyLimitExceeded as refused:
                    with tally.lock:
                        tally.refusals.append((refused.code or "", refused.limit, refused.retry_after))
                    return
                with tally.lock:
                    tally.admitted += 1
                time.sleep(rng.random() / 1000)  # the request being served
                used = reserve if mode == "tokens" else rng.randint(1, reserve)
                limiter.finish(admission, tokens=used)
                with tally.lock:
                    tally.settled_tokens += used
        except Exception as exc:  # pragma: no cover - reported by the test
            with tally.lock:
                tally.errors.append(f"{type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return tally


def main() -> None:
    url, secret, threads, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    start_at = float(sys.argv[5])
    engine = db.create_engine(url)
    try:
        tally = hammer([engine], secret, threads=threads, mode=mode, start_at=start_at)
    finally:
        engine.dispose()
    print(json.dumps(tally.to_dict()))


if __name__ == "__main__":
    main()
