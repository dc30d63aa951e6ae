"""Which llama.cpp build ``make`` installs (llama-cpp-python's CMake flags), and the rebuild when it changes.

Standard library only: ``want`` runs under the system Python while the Makefile is parsed,
before the virtualenv exists.

    want   --gpu auto|on|off [--archs A] [--cmake-args ARGS] --state FILE
           Decide the build, print the choice on stderr and the CMake flags on stdout (empty for
           the CPU build), and rewrite FILE only when the choice changed (so make's timestamp on
           it says "rebuild").
    ensure --state FILE          (run with the virtualenv's Python)
           Reinstall llama-cpp-python from source with the wanted flags unless the installed
           build already is that build.

The choice: ``--cmake-args`` given (``make LLAMA_CMAKE_ARGS=...``: Metal, ROCm, Vulkan...) wins;
``--gpu off`` is the CPU build; ``auto`` builds with CUDA when a toolkit is present (``nvcc`` on
PATH, or ``$CUDA_HOME/bin/nvcc``) and so is an NVIDIA driver (``nvidia-smi`` lists a GPU, or
``libcuda.so.1`` loads), for the compute capabilities ``nvidia-smi`` reports (else a portable
list). A toolkit without a driver (a CI image, a container without the GPU passed through) keeps
the CPU build: a CUDA build links the driver library and would not even import there.
``on`` builds with CUDA whenever a toolkit is present (a build host), and fails without one.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# When no GPU can be asked (a build host without a driver): Turing to Hopper as PTX/SASS, the
# subset of ggml's own non-native default that CUDA 11.8+ supports.
DEFAULT_CUDA_ARCHS = "75-virtual;80-virtual;86-real;89-real;90-virtual"

# Backend libraries llama-cpp-python installs next to libllama, by backend.
_BACKEND_LIBS = {"cuda": "ggml-cuda", "hip": "ggml-hip", "vulkan": "ggml-vulkan", "metal": "ggml-metal",
                 "sycl": "ggml-sycl"}


def find_nvcc(env: dict[str, str]) -> str | None:
    found = shutil.which("nvcc", path=env.get("PATH"))
    if found:
        return found
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
        return os.path.join(home, "bin", "nvcc")
    return None


def gpu_archs(env: dict[str, str]) -> list[str]:
    """Compute capabilities of the GPUs present ("9.0" -> "90"), sorted; [] when none can be asked."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, env=env)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    caps = set()
    for line in out.stdout.split():
        try:
            major, minor = line.strip().split(".")
            caps.add(int(major) * 10 + int(minor))
        except ValueError:
            continue
    return [str(c) for c in sorted(caps)]


def have_driver(env: dict[str, str], archs_found: list[str]) -> bool:
    if archs_found:
        return True
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def decide(gpu: str, env: dict[str, str], archs: str = "", cmake_args: str = "") -> dict[str, str]:
    """The build to install: {"backend", "cmake_args", "why"}."""
    gpu = (gpu or "auto").strip().lower()
    if cmake_args.strip():
        return {"backend": "custom", "cmake_args": cmake_args.strip(), "why": "LLAMA_CMAKE_ARGS given"}
    if gpu in ("off", "0", "no", "false", "cpu"):
        return {"backend": "cpu", "cmake_args": "", "why": "GPU=off"}
    if gpu not in ("auto", "on", "1", "yes", "true", "cuda"):
        raise SystemExit(f"GPU={gpu!r}: use GPU=auto, GPU=on or GPU=off")
    nvcc = find_nvcc(env)
    if nvcc is None:
        if gpu != "auto":
            raise SystemExit("GPU=on, but no CUDA toolkit: nvcc is not on PATH and $CUDA_HOME/bin/nvcc does not exist")
        return {"backend": "cpu", "cmake_args": "", "why": "no CUDA toolkit (nvcc not on PATH, CUDA_HOME unset)"}
    found = gpu_archs(env)
    if gpu == "auto" and not have_driver(env, found):
        return {"backend": "cpu", "cmake_args": "",
                "why": f"CUDA toolkit at {nvcc} but no NVIDIA driver or GPU; GPU=on builds for CUDA anyway"}
    chosen = archs.strip() or (";".join(found) if found else DEFAULT_CUDA_ARCHS)
    source = "CUDA_ARCHS" if archs.strip() else ("GPUs present" if found else "no GPU visible: portable list")
    args = ["-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={chosen}"]
    if shutil.which("nvcc", path=env.get("PATH")) is None:
        args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")  # found through CUDA_HOME only
    return {"backend": "cuda", "cmake_args": " ".join(args),
            "why": f"nvcc at {nvcc}; architectures {chosen} ({source})"}


def describe(choice: dict[str, str]) -> str:
    name = {"cpu": "CPU", "cuda": "CUDA", "custom": "custom"}[choice["backend"]]
    flags = f" CMAKE_ARGS='{choice['cmake_args']}'" if choice["cmake_args"] else ""
    hint = {"cpu": "", "cuda": "; GPU=off forces the CPU build",
            "custom": "; without LLAMA_CMAKE_ARGS the default build"}[choice["backend"]]
    return f"conch: llama.cpp build: {name} ({choice['why']}){flags}{hint}"


def write_if_changed(path: Path, choice: dict[str, str]) -> None:
    text = json.dumps({"backend": choice["backend"], "cmake_args": choice["cmake_args"]}, sort_keys=True) + "\n"
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def installed_backend() -> tuple[str | None, str | None]:
    """(backend of the installed llama-cpp-python, its version), read from its files, not loaded."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None, None
    libdir = Path(next(iter(spec.submodule_search_locations))) / "lib"
    names = [p.name for p in libdir.iterdir()] if libdir.is_dir() else []
    backend = "cpu"
    for name, lib in _BACKEND_LIBS.items():
        if any(n.startswith("lib" + lib) or n.startswith(lib) for n in names):
            backend = name
            break
    return backend, importlib.metadata.version("llama-cpp-python")


def ensure(state: Path) -> int:
    want = json.loads(state.read_text())
    done_path = state.with_name(state.name.replace("wanted", "installed"))
    try:
        done = json.loads(done_path.read_text())
    except (OSError, ValueError):
        done = None
    backend, version = installed_backend()
    if backend is None:
        print("conch: llama-cpp-python is not installed", file=sys.stderr)
        return 1
    if want["backend"] == "custom":
        ok = done == want
    elif done is not None:
        ok = done == want and backend == want["backend"]
    else:
        # First install: pip built with CMAKE_ARGS unless it reused a cached wheel.
        ok = backend == want["backend"]
    if ok:
        done_path.write_text(state.read_text())
        return 0
    print(f"conch: rebuilding llama-cpp-python {version} from source ({backend} build installed, "
          f"{want['backend']} wanted; this takes minutes)", file=sys.stderr, flush=True)
    env = dict(os.environ)
    env["CMAKE_ARGS"] = want["cmake_args"]
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", "--no-cache-dir",
           "--no-binary", "llama-cpp-python", f"llama-cpp-python=={version}"]
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        print("conch: the llama-cpp-python build failed; `make GPU=off ...` installs the CPU build",
              file=sys.stderr)
        return rc
    backend, _ = installed_backend()
    if want["backend"] != "custom" and backend != want["backend"]:
        print(f"conch: the rebuilt llama-cpp-python has the {backend} backend, not {want['backend']}",
              file=sys.stderr)
        return 1
    done_path.write_text(state.read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("want")
    w.add_argument("--gpu", default="auto")
    w.add_argument("--archs", default="")
    w.add_argument("--cmake-args", default="")
    w.add_argument("--state", type=Path, required=True)
    e = sub.add_parser("ensure")
    e.add_argument("--state", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "want":
        choice = decide(a.gpu, dict(os.environ), a.archs, a.cmake_args)
        write_if_changed(a.state, choice)
        print(describe(choice), file=sys.stderr)
        print(choice["cmake_args"])
        return 0
    return ensure(a.state)


if __name__ == "__main__":
    sys.exit(main())
