"""Both servers' /metrics carry the process's own series (prometheus_client's ProcessCollector
and PlatformCollector on each app's registry): the studio's Status page charts
process_resident_memory_bytes for each server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from conch import db
from conch.config import Settings
from conch.web.common.metrics import HTTPMetrics


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def test_each_registry_has_the_process_series() -> None:
    # Two apps in one process (as in tests) each get their own collectors, without clashing.
    a, b = HTTPMetrics(), HTTPMetrics()
    for m in (a, b):
        text = m.render().decode()
        assert "python_info{" in text
        if sys.platform.startswith("linux"):
            assert _value(text, "process_resident_memory_bytes") > 10e6


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the process collector reads /proc")
def test_both_servers_expose_their_resident_memory(tmp_path: Path) -> None:
    from conch.web.agent.app import create_app as create_agent_app
    from conch.web.inference.app import create_app as create_inference_app

    settings = Settings(data_dir=tmp_path, n_parallel=1, n_ctx=512)
    try:
        for create in (create_agent_app, create_inference_app):
            with TestClient(create(settings), base_url="http://127.0.0.1") as c:
                r = c.get("/metrics")
                assert r.status_code == 200, r.text
                assert "# TYPE process_resident_memory_bytes gauge" in r.text
                assert _value(r.text, "process_resident_memory_bytes") > 10e6
                assert _value(r.text, "process_cpu_seconds_total") >= 0
    finally:
        db.dispose_all()
