"""The processes that run untrusted programs, assembled: a sandbox worker, and a job on a
Dask worker, each given the host its programs reach models and agents through.

The sandbox (:mod:`conch.sandbox.worker`) and the executor (:mod:`conch.orchestration.executor`)
know how to run a job, and nothing of what a program's ``ai``/``agent`` calls reach. This
module sits above them and above :mod:`conch.host`, so that the choice of host is made here,
in each process's entry point, and no room imports a room above it to make it.

A sandbox worker is started as ``python -P -m conch.worker_process FD`` by the pool, and the
pool's zygote, which forks the workers of sessions, as ``… FD zygote``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
from typing import Any

from conch.host import server_host
from conch.sandbox.worker import Collect, Runner, WorkerConfig, worker_main

_RUNNERS: dict[str, Runner] = {}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    sock = socket.socket(fileno=int(args[0]))
    zygote = len(args) > 1 and args[1] == "zygote"
    with contextlib.suppress(BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        worker_main(sock, host=server_host, zygote=zygote)


def run_on_dask_worker(config: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """Run one sandbox job inside a Dask worker (module-level so that Dask can ship it by
    reference); one Runner per configuration keeps its compile caches warm."""
    from conch.lang.builtins.registry import load_all

    key = json.dumps(config, sort_keys=True)
    runner = _RUNNERS.get(key)
    if runner is None:
        load_all()
        runner = _RUNNERS[key] = Runner(WorkerConfig(**config), host=server_host)
    chan = Collect()
    runner.run(payload, chan)
    if chan.done is not None:
        return chan.done
    return {"success": False, "result": None, "type": None, "value": None, "output": [],
            "error": {"kind": "LimitError", "message": "the job produced no result",
                      "line": None, "column": None, "hint": None}}


if __name__ == "__main__":
    main()
