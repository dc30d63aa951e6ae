"""The Dask executor: workflow steps and agent tool calls run on a real
``distributed.LocalCluster``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import SRC, finished, start_thread_server, wait_for

distributed = pytest.importorskip("distributed")
pytestmark = pytest.mark.timeout(240)

API = "/api/v1/orchestration"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    # Worker processes import conch from this checkout, like the server does.
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = SRC + (os.pathsep + path if path else "")
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as c:
        yield c
    if path is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = path


def test_steps_and_tool_calls_run_on_dask(
    tmp_path: Path, cluster: Any, scripted: ScriptedModel
) -> None:
    srv = start_thread_server(
        tmp_path / "data",
        executor="dask",
        dask_scheduler=cluster.scheduler_address,
        models_url=scripted.v1,
        wall_time_s=5.0,
    )
    goal = scripted.script("count with dask", tool("len", value=[1, 2, 3]), final("3"))
    try:
        assert srv.orchestrator.executor.name == "dask"
        with srv.client() as c:
            body = {
                "inputs": {"n": 10},
                "steps": [
                    {"id": "a", "run": "range(0, inputs.n) | sum"},
                    {"id": "b", "depends_on": ["a"], "run": "steps.a.result * 2"},
                    {"id": "c", "depends_on": ["a"], "run": "1 / 0"},
                    {"id": "t", "task": {"goal": goal, "tools": ["len"], "max_steps": 3}},
                    {"id": "slow", "run": "sleep(20000)", "timeout_s": 1},
                ],
            }
            wf = c.post(f"{API}/workflows", json=body).json()
            done = wait_for(c, f"{API}/workflows/{wf['id']}", finished, 120)
        steps = {s["id"]: s for s in done["steps"]}
        assert steps["a"]["result"] == 45 and steps["b"]["result"] == 90
        assert steps["c"]["error"]["kind"] == "ZeroDivisionError"
        assert steps["t"]["status"] == "succeeded" and steps["t"]["result"] == "3"
        assert steps["slow"]["error"]["kind"] == "TimeoutError"
        # The work really went to the cluster's workers.
        client = distributed.Client(cluster.scheduler_address)
        try:
            counts = client.run(
                lambda: __import__(
                    "conch.worker_process", fromlist=["_RUNNERS"]
                )._RUNNERS.__len__()
            )
        finally:
            client.close()
        assert sum(counts.values()) >= 1
    finally:
        srv.stop()
