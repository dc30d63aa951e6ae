"""Where models run, over HTTP: the device and GPU memory in /v1/status and /metrics, a loaded
model's placement in GET /v1/models/{id} and in `conch models show` (docs/gpu.md).

On a CPU build (CI) the device is "cpu"; on a GPU machine the same tests check the GPU's figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conch.inference.engines.llama import device
from conch.inference.models.bundled import BUNDLED_ID
from tests.web.conftest import RunningServer

M = BUNDLED_ID
SRC = Path(__file__).resolve().parents[2] / "src"
GPU = device.gpu_offload_supported() and bool(device.device_info(fresh=True).gpus)


def _load(server: RunningServer) -> None:
    with server.client() as c:
        r = c.post("/v1/chat/completions", json={"model": M, "max_tokens": 2, "temperature": 0,
                                                 "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200, r.text


def test_status_reports_the_device(inference_server: RunningServer) -> None:
    with inference_server.client() as c:
        d = c.get("/v1/status").json()["device"]
    assert set(d) == {"device", "backend", "gpu_offload", "memory_used_bytes", "memory_total_bytes", "gpus"}
    if not GPU:
        assert d == {"device": "cpu", "backend": "cpu", "gpu_offload": False, "memory_used_bytes": None,
                     "memory_total_bytes": None, "gpus": []}
    else:
        assert d["device"] != "cpu" and d["gpu_offload"] and d["gpus"]
        assert 0 < d["memory_used_bytes"] <= d["memory_total_bytes"]


def test_metrics_report_the_device_and_models(inference_server: RunningServer) -> None:
    _load(inference_server)
    with inference_server.client() as c:
        text = c.get("/metrics").text
    info = next(line for line in text.splitlines() if line.startswith("conch_inference_device_info{"))
    assert _value(info) == 1
    layers = next(line for line in text.splitlines() if line.startswith("conch_inference_model_gpu_layers{"))
    assert f'model="{M}"' in layers
    if not GPU:
        assert _labels(info) == {"device": "cpu", "backend": "cpu"}
        assert _value(layers) == 0
        assert "conch_inference_gpu_memory_total_bytes{" not in text
    else:
        assert "conch_inference_gpu_memory_total_bytes{" in text and _value(layers) > 0


def _value(sample: str) -> float:
    """A Prometheus sample's value (the exposition writes 1 as ``1.0``)."""
    return float(sample.rsplit(" ", 1)[1])


def _labels(sample: str) -> dict[str, str]:
    """A Prometheus sample's labels, in whatever order the exposition writes them."""
    inside = sample[sample.index("{") + 1 : sample.rindex("}")]
    return dict((k, v.strip('"')) for k, v in (pair.split("=", 1) for pair in inside.split(",")))


def test_model_details_say_where_it_runs(inference_server: RunningServer) -> None:
    _load(inference_server)
    with inference_server.client() as c:
        where = c.get(f"/v1/models/{M}").json()["placement"]
    assert where["n_layers"] in (None, 30)
    if not GPU:
        assert where == {"device": "cpu", "offload": "none", "n_gpu_layers": 0, "n_layers": None,
                         "vram_bytes": None, "note": "runs on the CPU (no GPU backend in this llama.cpp build)"}
    else:
        assert where["offload"] == "full" and where["n_gpu_layers"] == 30 and where["vram_bytes"] > 0


def test_models_show_asks_the_running_server(inference_server: RunningServer) -> None:
    _load(inference_server)
    env = dict(os.environ, CONCH_DATA_DIR=str(inference_server.settings.data_dir),
               CONCH_MODELS_PORT=str(inference_server.settings.models_port),
               CONCH_CONFIG=str(inference_server.settings.data_dir / "none.toml"),
               PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = subprocess.run([sys.executable, "-m", "conch.cli.main", "models", "show", M, "--json"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    where = json.loads(out.stdout)["placement"]
    assert where["loaded"] is True
    assert where["offload"] == ("full" if GPU else "none")
    text = subprocess.run([sys.executable, "-m", "conch.cli.main", "models", "show", M],
                          capture_output=True, text=True, env=env, timeout=120).stdout
    line = next(ln for ln in text.splitlines() if ln.startswith("placement"))
    assert ("layers on the GPU" in line) if GPU else ("loaded on the CPU" in line)
