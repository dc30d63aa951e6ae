"""The Makefile's choice of llama.cpp build (scripts/llama_build_flags.py), on a CPU machine.

``nvcc`` and ``nvidia-smi`` are NVIDIA's tools, which cannot run here: the tests put small
scripts with those names on PATH that print what the real ones print (``nvidia-smi
--query-gpu=compute_cap --format=csv,noheader`` prints one "major.minor" line per GPU).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "llama_build_flags.py"


def _has_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def tool(folder: Path, name: str, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def want(tmp_path: Path, *args: str, path: str = "/usr/bin:/bin", extra_env: dict[str, str] | None = None
         ) -> tuple[str, str, dict[str, str]]:
    state = tmp_path / "venv" / ".llama-build-wanted"
    env = {"PATH": path, **(extra_env or {})}
    out = subprocess.run([sys.executable, str(SCRIPT), "want", "--state", str(state), *args],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip(), out.stderr.strip(), json.loads(state.read_text())


def test_no_toolkit_is_the_cpu_build(tmp_path: Path) -> None:
    flags, said, state = want(tmp_path)
    assert flags == "" and state["backend"] == "cpu"
    assert said.startswith("conch: llama.cpp build: CPU (no CUDA toolkit")


def test_toolkit_and_gpus_build_for_their_architectures(tmp_path: Path) -> None:
    bin_ = tmp_path / "bin"
    tool(bin_, "nvcc", "echo 'Cuda compilation tools, release 12.4'")
    tool(bin_, "nvidia-smi", "printf '9.0\\n8.6\\n9.0\\n'")
    flags, said, state = want(tmp_path, path=f"{bin_}:/usr/bin:/bin")
    assert flags == "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=86;90"
    assert state == {"backend": "cuda", "cmake_args": flags}
    assert "CUDA" in said and "GPU=off forces the CPU build" in said


def test_gpu_off_forces_the_cpu_build(tmp_path: Path) -> None:
    bin_ = tmp_path / "bin"
    tool(bin_, "nvcc", "true")
    tool(bin_, "nvidia-smi", "echo 9.0")
    flags, said, state = want(tmp_path, "--gpu", "off", path=f"{bin_}:/usr/bin:/bin")
    assert flags == "" and state["backend"] == "cpu" and "GPU=off" in said


def test_cuda_home_without_nvcc_on_path(tmp_path: Path) -> None:
    home = tmp_path / "cuda"
    tool(home / "bin", "nvcc", "true")
    bin_ = tmp_path / "bin"
    tool(bin_, "nvidia-smi", "echo 8.9")
    flags, _, _ = want(tmp_path, path=f"{bin_}:/usr/bin:/bin", extra_env={"CUDA_HOME": str(home)})
    assert flags == f"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=89 -DCMAKE_CUDA_COMPILER={home}/bin/nvcc"


@pytest.mark.skipif(_has_driver(), reason="this machine has an NVIDIA driver")
def test_toolkit_without_driver_keeps_the_cpu_build(tmp_path: Path) -> None:
    bin_ = tmp_path / "bin"
    tool(bin_, "nvcc", "true")  # no nvidia-smi, no libcuda.so.1: a CI image with the toolkit only
    flags, said, state = want(tmp_path, path=f"{bin_}:/usr/bin:/bin")
    assert flags == "" and state["backend"] == "cpu" and "no NVIDIA driver" in said
    # GPU=on builds for CUDA anyway (a build host), for a portable list of architectures
    flags, _, _ = want(tmp_path, "--gpu", "on", path=f"{bin_}:/usr/bin:/bin")
    assert flags.startswith("-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=75-virtual;")


def test_explicit_architectures_and_custom_flags(tmp_path: Path) -> None:
    bin_ = tmp_path / "bin"
    tool(bin_, "nvcc", "true")
    tool(bin_, "nvidia-smi", "echo 9.0")
    flags, _, _ = want(tmp_path, "--archs", "80", path=f"{bin_}:/usr/bin:/bin")
    assert flags.endswith("-DCMAKE_CUDA_ARCHITECTURES=80")
    flags, said, state = want(tmp_path, "--cmake-args=-DGGML_VULKAN=on")
    assert flags == "-DGGML_VULKAN=on" and state["backend"] == "custom" and "custom" in said


def test_gpu_on_without_toolkit_fails(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "want", "--gpu", "on", "--state", str(tmp_path / "s")],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode != 0 and "no CUDA toolkit" in out.stderr


def test_state_file_is_rewritten_only_when_the_choice_changes(tmp_path: Path) -> None:
    state = tmp_path / "venv" / ".llama-build-wanted"
    want(tmp_path)
    before = state.stat().st_mtime_ns
    os.utime(state, ns=(before - 10**9, before - 10**9))
    want(tmp_path)
    assert state.stat().st_mtime_ns == before - 10**9  # same choice: make sees nothing to do
    want(tmp_path, "--cmake-args=-DGGML_VULKAN=on")
    assert state.stat().st_mtime_ns != before - 10**9


def test_ensure_accepts_the_installed_cpu_build(tmp_path: Path) -> None:
    """The CPU machine's path through `make`: nothing is rebuilt, the build is recorded."""
    state = tmp_path / ".llama-build-wanted"
    state.write_text(json.dumps({"backend": "cpu", "cmake_args": ""}, sort_keys=True) + "\n")
    out = subprocess.run([sys.executable, str(SCRIPT), "ensure", "--state", str(state)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "rebuilding" not in out.stderr
    assert (tmp_path / ".llama-build-installed").read_text() == state.read_text()
