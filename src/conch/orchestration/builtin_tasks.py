"""Tasks of the ``agent`` builtin run in sandbox workers, recorded by the server for them.

A sandbox worker cannot open the database: what its ``agent`` call reports (``task.insert``,
``task.step``, ``task.finish``) comes over its channel and is checked here like any
untrusted input. The row is built here from typed fields, and a worker may only add to and
finish the tasks it inserted itself.
"""

from __future__ import annotations

import re
import time
from typing import Any

from conch.config import Settings
from conch.orchestration.store import TASK_DONE, TaskStore


class BuiltinTasks:
    """The tasks sandbox workers' ``agent`` calls run, by the worker that started each."""

    def __init__(self, settings: Settings, tasks: TaskStore) -> None:
        self.settings = settings
        self.tasks = tasks
        # Tasks under way in sandbox workers: task id -> worker pid.
        self._workers: dict[str, int] = {}

    def record(self, worker: int, kind: str, data: Any) -> None:
        """Keep one record a sandbox worker sent; ValueError when it is malformed or not the
        worker's to send."""
        if type(data) is not dict or type(data.get("id")) is not str:
            raise ValueError(f"a {kind} record needs an object with an id")
        task_id = data["id"]
        if kind == "task.insert":
            self._insert(worker, data)
            return
        if self._workers.get(task_id) != worker:
            raise ValueError(f"worker {worker} did not start task {task_id!r}")
        usage = data.get("usage") or {}
        if type(usage) is not dict or not all(type(v) is int for v in usage.values()):
            raise ValueError("usage must map names to integers")
        if kind == "task.step" and type(data.get("step")) is dict:
            self.tasks.add_task_step(task_id, data["step"], usage)
        elif kind == "task.finish" and data.get("status") in TASK_DONE:
            error = data.get("error")
            if error is not None and type(error) is not dict:
                raise ValueError("error must be an object")
            self.tasks.finish_task(task_id, data["status"], result=data.get("result"),
                                   error=error, usage=usage)  # fmt: skip
            del self._workers[task_id]
        else:
            raise ValueError(f"unknown or malformed record {kind!r}")

    def _insert(self, worker: int, data: dict[str, Any]) -> None:
        _check_insert(data)
        task_id, owner = data["id"], f"builtin:{worker}"
        now = time.time()
        timeout = min(float(data["timeout"]), self.settings.stream_wall_time_s)
        lease = now + timeout + 60  # it cannot outlive its run; after that, interrupted
        self.tasks.insert_task({
            "id": task_id, "goal": data["goal"], "tools": list(data["tools"]),
            "max_steps": data["max_steps"], "agent": "default", "model": data["model"],
            "status": "pending", "steps": [], "result": None, "error": None, "usage": {},
            "created_at": now, "started_at": None, "finished_at": None,
            "origin": "builtin", "owner": owner, "lease_until": lease,
        })  # fmt: skip
        self.tasks.start_task(task_id, owner, lease)
        self._workers[task_id] = worker


def _check_insert(data: dict[str, Any]) -> None:
    ok = (
        re.fullmatch(r"task_[0-9a-f]{16}", data["id"]) is not None
        and type(data.get("goal")) is str
        and type(data.get("tools")) is list and all(type(n) is str for n in data["tools"])
        and type(data.get("max_steps")) is int and 0 < data["max_steps"] <= 1000
        and type(data.get("model")) is str
        and type(data.get("timeout")) in (int, float) and data["timeout"] > 0
    )
    if not ok:
        raise ValueError("a malformed task.insert record")
