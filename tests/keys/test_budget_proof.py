"""The budget proof over HTTP: real ``conch models serve`` processes on one throwaway
PostgreSQL 15, the real model, one key.

- ``tokens_per_day`` = 10,000 and 64 concurrent streaming chats (``max_tokens`` 64) spread
  over two servers, each going on until refused: the tokens served (the streams' own
  ``usage``) never pass 10,000, the key's recorded use is exactly what was served, and every
  refusal is a ``429`` in OpenAI's shape.
- ``requests_per_minute`` across both servers: exactly the limit is admitted.
- A key revoked through one server (an agent server, which serves the keys routes) is
  refused by the other within a second.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from conch import db
from conch.keys import KeyService, Limiter
from tests.orchestration.pg import postgres_cluster
from testsupport.servers import SRC, free_port

pytestmark = pytest.mark.timeout(900)

ADMIN_KEY = "admin-key-of-the-proof"
MODEL = "smollm2-135m-instruct"


@dataclass
class Proc:
    url: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _start(command: list[str], health: str, data: Path, pg_url: str, log: Path, **env: str) -> Proc:
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONCH_")}
    environ.update({
        "PYTHONPATH": SRC, "CONCH_DATA_DIR": str(data), "CONCH_CONFIG": str(data / "none.toml"),
        "CONCH_DATABASE_URL": pg_url, "CONCH_ADMIN_KEY": ADMIN_KEY, "CONCH_PROMPT_CACHE_DISK_MB": "0",
        **{f"CONCH_{k.upper()}": v for k, v in env.items()},
    })  # fmt: skip
    out = log.open("ab")
    process = subprocess.Popen([sys.executable, "-m", "conch.cli.main", *command, "--port", str(port)],
                               env=environ, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{command} exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(url + health, timeout=2).status_code == 200:
                return Proc(url, process)
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"{command} did not start: {log.read_text()[-3000:]}")
        time.sleep(0.2)


@dataclass
class Cluster:
    pg_url: str
    servers: list[Proc]
    tmp: Path
    keys: KeyService = field(init=False)
    limiter: Limiter = field(init=False)

    def __post_init__(self) -> None:
        engine = db.create_engine(self.pg_url)
        self.keys = KeyService(engine)
        self.limiter = Limiter(engine)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("budget-proof")
    with postgres_cluster(tmp) as url:
        data = tmp / "data"
        servers: list[Proc] = []
        try:
            for i in range(2):
                servers.append(_start(["models", "serve"], "/v1/health", data, url, tmp / f"inference{i}.log",
                                      n_parallel="4", n_ctx="1024", max_queue="64"))  # fmt: skip
            yield Cluster(url, servers, tmp)
        finally:
            for s in servers:
                s.stop()
            db.dispose_all()


def _stream(url: str, secret: str, i: int) -> tuple[int, int, Any]:
    """One streaming chat: ``(status, tokens served, refusal body)``."""
    body = {"model": MODEL, "max_tokens": 64, "temperature": 0.7, "seed": i, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Write a short story about lighthouse number {i}."}]}  # fmt: skip
    with httpx.Client(timeout=300) as c, c.stream("POST", url + "/v1/chat/completions", json=body,
                                                  headers={"Authorization": f"Bearer {secret}"}) as r:  # fmt: skip
        if r.status_code != 200:
            r.read()
            return r.status_code, 0, (r.json(), dict(r.headers))
        served = 0
        import json

        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    served = chunk["usage"]["total_tokens"]
        assert served > 0, "a stream without its usage"
        return 200, served, None


def test_64_streams_on_two_servers_never_pass_a_token_budget(cluster: Cluster) -> None:
    issued = cluster.keys.create(name="budget", scopes=["inference"], limits={"tokens_per_day": 10_000})
    served: list[int] = []
    refusals: list[tuple[int, Any]] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(64)

    def work(i: int) -> None:
        url = cluster.servers[i % 2].url
        start.wait()
        n = i
        try:
            while True:
                status, tokens, refusal = _stream(url, issued.secret, n)
                with lock:
                    if status == 200:
                        served.append(tokens)
                    else:
                        refusals.append((status, refusal))
                        return
                n += 64
        except Exception as exc:  # reported below
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors[:3]
    assert len(refusals) == 64
    total = sum(served)
    assert 0 < total <= 10_000, total
    # Nothing lost either: what the key has recorded is what was served, to the token.
    used = {u.limit: u for u in cluster.limiter.usage(issued.record.principal())}
    assert used["tokens_per_day"].used == total
    for status, (body, headers) in refusals:
        assert status == 429, body
        assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == "insufficient_quota"
        assert body["error"]["param"] == "tokens_per_day"
        assert set(body["error"]) == {"message", "type", "param", "code"}
        # Waiting a day frees the budget: Retry-After says when.
        assert int(headers["retry-after"]) > 0


def test_requests_per_minute_holds_across_two_servers(cluster: Cluster) -> None:
    issued = cluster.keys.create(name="rate", scopes=["inference"], limits={"requests_per_minute": 50})
    admitted: list[int] = []
    refused: list[httpx.Response] = []
    lock = threading.Lock()
    start = threading.Barrier(64)

    def work(i: int) -> None:
        url = cluster.servers[i % 2].url
        start.wait()
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {issued.secret}"}) as c:
            while True:
                r = c.get(url + "/v1/models")
                with lock:
                    if r.status_code == 200:
                        admitted.append(i)
                    else:
                        refused.append(r)
                        return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(admitted) == 50
    assert len(refused) == 64
    for r in refused:
        assert r.status_code == 429
        err = r.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and err["param"] == "requests_per_minute"
        assert 1 <= int(r.headers["retry-after"]) <= 60


def test_a_key_revoked_on_one_server_is_refused_by_the_other_within_a_second(cluster: Cluster) -> None:
    agent = _start(["serve"], "/health", cluster.tmp / "agent-data", cluster.pg_url,
                   cluster.tmp / "agent.log", workers="1")  # fmt: skip
    try:
        issued = cluster.keys.create(name="to revoke", scopes=["inference"])
        headers = {"Authorization": f"Bearer {issued.secret}"}
        inference = cluster.servers[1].url
        with httpx.Client(timeout=30) as c:
            assert c.get(inference + "/v1/models", headers=headers).status_code == 200
            r = c.delete(f"{agent.url}/api/v1/keys/{issued.record.id}",
                         headers={"Authorization": f"Bearer {ADMIN_KEY}"})  # fmt: skip
            assert r.status_code == 200 and r.json()["status"] == "revoked"
            revoked_at = time.monotonic()
            while True:
                r = c.get(inference + "/v1/models", headers=headers)
                if r.status_code == 401:
                    break
                assert r.status_code == 200
                assert time.monotonic() - revoked_at < 1.0, "still served a second after revocation"
                time.sleep(0.01)
            assert "revoked" in r.json()["error"]["message"]
    finally:
        agent.stop()
