"""Where models run: the GPU backend llama.cpp was built with, the GPUs, their memory.

The backend and the devices come from ggml's own registry (the devices llama.cpp would offload
to, whatever the backend: CUDA, Metal, ROCm, Vulkan). Memory of NVIDIA GPUs is read through
NVML when ``pynvml`` (the ``nvidia-ml-py`` package) is importable, else from ``nvidia-smi``:
neither creates a CUDA context in this process. Other backends' memory comes from ggml, which
asks the driver. Without a GPU backend, or with no GPU visible, the device is ``"cpu"``.

Readings are cached for a second: ``/metrics`` may be scraped often, and ``nvidia-smi`` takes
tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

_GGML_GPU_TYPES = (1, 2)  # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU
_CACHE_S = 1.0


@functools.cache
def math_threads() -> int:
    """Threads for llama.cpp's matrix work, chosen as llama.cpp's own tools choose them
    (``common_cpu_get_num_math``): one per physical core, hyperthread siblings counted once.

    SMT siblings share a core's vector units, so a second thread on a core adds contention, not
    throughput; and llama.cpp's threads meet at a barrier every layer, so one thread more than
    there are cores to run it makes every step wait for the slowest. Falls back to half the
    logical CPUs where the topology cannot be read (llama-cpp-python's rule).
    """
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = list(range(os.cpu_count() or 1))
    cores: set[str] = set()
    for cpu in allowed:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as fh:
                cores.add(fh.read().strip())
        except OSError:
            cores.clear()
            break
    if cores:
        return len(cores)
    return max((os.cpu_count() or 2) // 2, 1)


@dataclass
class GpuDevice:
    index: int  # as llama.cpp numbers them (main_gpu), after CUDA_VISIBLE_DEVICES
    name: str
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    # this process's share of memory_used_bytes, where the driver says (NVML, nvidia-smi)
    process_used_bytes: int | None = None
    source: str = "llama.cpp"  # where the memory figures come from: nvml | nvidia-smi | llama.cpp


@dataclass
class DeviceInfo:
    backend: str  # "cuda", "metal", "rocm", "vulkan", ... or "cpu": the GPU backend compiled in
    gpu_offload: bool  # llama.cpp can put layers on a GPU (a backend and at least one device)
    gpus: list[GpuDevice] = field(default_factory=list)

    @property
    def device(self) -> str:
        """``"cpu"``, or the backend and the GPUs' names (``"cuda: NVIDIA H100 80GB HBM3"``)."""
        if not self.gpu_offload or not self.gpus:
            return "cpu"
        return f"{self.backend}: " + ", ".join(g.name for g in self.gpus)

    @property
    def memory_used_bytes(self) -> int | None:
        vals = [g.memory_used_bytes for g in self.gpus if g.memory_used_bytes is not None]
        return sum(vals) if vals else None

    @property
    def memory_total_bytes(self) -> int | None:
        vals = [g.memory_total_bytes for g in self.gpus if g.memory_total_bytes is not None]
        return sum(vals) if vals else None

    def as_dict(self) -> dict[str, Any]:
        """The fields (the GPUs as dicts too) and the figures derived from them."""
        return {**asdict(self), "device": self.device, "memory_used_bytes": self.memory_used_bytes,
                "memory_total_bytes": self.memory_total_bytes}


# -- llama.cpp / ggml ---------------------------------------------------------------------


@functools.cache
def _ggml() -> Any:
    """libllama with the ggml registry calls bound (dlsym through libllama finds its ggml libs)."""
    from llama_cpp import llama_cpp as raw

    lib = ctypes.CDLL(raw._lib._name)
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_reg_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_description.restype = ctypes.c_char_p
    lib.ggml_backend_dev_memory.argtypes = [
        ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t),
    ]
    lib.ggml_backend_dev_memory.restype = None
    return lib


@functools.cache
def gpu_offload_supported() -> bool:
    """Whether the installed llama.cpp has a GPU backend (``llama_supports_gpu_offload``)."""
    try:
        from llama_cpp import llama_cpp as raw

        return bool(raw.llama_supports_gpu_offload())
    except Exception:  # no usable build: nothing can be offloaded
        return False


@functools.cache
def backend_name() -> str:
    """The GPU backend compiled into llama.cpp (lower case), or ``"cpu"``."""
    try:
        lib = _ggml()
        names = [(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)) or b"").decode()
                 for i in range(lib.ggml_backend_reg_count())]
    except Exception:
        return "cpu"
    gpu = [n for n in names if n and n.upper() not in ("CPU", "BLAS", "RPC")]
    return gpu[0].lower() if gpu else "cpu"


def _ggml_gpus(with_memory: bool) -> list[tuple[int, str, int | None, int | None]]:
    """(index, description, free, total) of ggml's GPU devices, in llama.cpp's order."""
    lib = _ggml()
    out: list[tuple[int, str, int | None, int | None]] = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if lib.ggml_backend_dev_type(dev) not in _GGML_GPU_TYPES:
            continue
        desc = (lib.ggml_backend_dev_description(dev) or lib.ggml_backend_dev_name(dev) or b"GPU").decode()
        free = total = None
        if with_memory:
            f, t = ctypes.c_size_t(), ctypes.c_size_t()
            lib.ggml_backend_dev_memory(dev, ctypes.byref(f), ctypes.byref(t))
            free, total = f.value, t.value
        out.append((len(out), desc, free, total))
    return out


def gpu_free_bytes(index: int) -> tuple[int, int] | None:
    """(free, total) bytes of llama.cpp's GPU ``index``, from the backend itself (exact, but on
    CUDA it creates this process's context: call it where a model is about to load)."""
    if not gpu_offload_supported():
        return None
    try:
        for i, _, free, total in _ggml_gpus(with_memory=True):
            if i == index and free is not None and total is not None:
                return free, total
    except Exception:
        return None
    return None


# -- NVIDIA: NVML, nvidia-smi ---------------------------------------------------------------


def _visible(indices: list[int]) -> list[int]:
    """Physical GPU indices in CUDA's order, honouring ``CUDA_VISIBLE_DEVICES`` (numeric form)."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return indices
    wanted: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part.isdigit():
            return indices if part else wanted  # UUIDs/MIG names: cannot map, keep all
        if int(part) in indices:
            wanted.append(int(part))
    return wanted


def _nvml() -> list[GpuDevice] | None:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        pid = os.getpid()
        out: list[GpuDevice] = []
        for phys in _visible(list(range(pynvml.nvmlDeviceGetCount()))):
            h = pynvml.nvmlDeviceGetHandleByIndex(phys)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            mine = None
            try:
                for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    if proc.pid == pid and proc.usedGpuMemory is not None:
                        mine = (mine or 0) + int(proc.usedGpuMemory)
            except Exception:
                pass
            out.append(GpuDevice(len(out), name.decode() if isinstance(name, bytes) else str(name),
                                 int(mem.total), int(mem.used), mine, "nvml"))
        return out
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _smi(args: list[str]) -> list[list[str]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, *args, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return [[c.strip() for c in line.split(",")] for line in r.stdout.strip().splitlines() if line.strip()]


def _nvidia_smi() -> list[GpuDevice] | None:
    rows = _smi(["--query-gpu=index,name,memory.used,memory.total,uuid"])
    if rows is None:
        return None
    mib = 1024 * 1024
    by_index = {}
    for row in rows:
        try:
            by_index[int(row[0])] = row
        except (ValueError, IndexError):
            continue
    mine: dict[str, int] = {}
    for row in _smi(["--query-compute-apps=pid,used_memory,gpu_uuid"]) or []:
        try:
            if int(row[0]) == os.getpid():
                mine[row[2]] = mine.get(row[2], 0) + int(row[1]) * mib
        except (ValueError, IndexError):
            continue
    out: list[GpuDevice] = []
    for phys in _visible(sorted(by_index)):
        row = by_index[phys]
        try:
            used, total = int(float(row[2])) * mib, int(float(row[3])) * mib
        except (ValueError, IndexError):
            used = total = None  # type: ignore[assignment]
        uuid = row[4] if len(row) > 4 else ""
        out.append(GpuDevice(len(out), row[1], total, used, mine.get(uuid), "nvidia-smi"))
    return out


# -- the answer -------------------------------------------------------------------------------

_lock = threading.Lock()
_cached: tuple[float, DeviceInfo] | None = None


def device_info(*, fresh: bool = False) -> DeviceInfo:
    """The backend, whether layers can be offloaded, and the GPUs with their memory."""
    global _cached
    with _lock:
        now = time.monotonic()
        if not fresh and _cached is not None and now - _cached[0] < _CACHE_S:
            return _cached[1]
        info = _probe()
        _cached = (now, info)
        return info


def _probe() -> DeviceInfo:
    if not gpu_offload_supported():
        return DeviceInfo("cpu", False, [])
    backend = backend_name()
    try:
        ggml = _ggml_gpus(with_memory=False)
    except Exception:
        ggml = []
    gpus: list[GpuDevice] | None = None
    if backend == "cuda":
        gpus = _nvml() or _nvidia_smi()
    if not gpus:
        try:
            gpus = [GpuDevice(i, desc, total, None if free is None or total is None else total - free, None,
                              "llama.cpp") for i, desc, free, total in _ggml_gpus(with_memory=True)]
        except Exception:
            gpus = [GpuDevice(i, desc) for i, desc, _, _ in ggml]
    return DeviceInfo(backend, bool(ggml or gpus), gpus or [])


class CoreShare:
    """The CPU cores, shared among the models of this process that are generating.

    Each model decodes on ``math_threads()`` threads by default, which is right when it is
    the only one at work. Two models generating at once would then run twice as many threads
    as there are cores, and ggml's threads meet at a barrier after every graph node: with more
    threads than cores libgomp stops spinning there and sleeps on a futex, and every step
    pays hundreds of wake-ups (measured on 2 cores: the two models together made 0.51x of
    what each made alone; split by ``n_threads`` they made 0.86x). So a model asks for its
    threads before each step, and gets its share of the cores among the models busy then or
    within the last ``hold_s`` seconds (a model between two requests of a steady load still
    counts: changing threads every few steps costs more than it gives); a model whose threads
    were set by hand (``model_overrides.ID.n_threads``) keeps them.
    """

    def __init__(self, cores: int, hold_s: float = 2.0) -> None:
        self.cores = max(1, cores)
        self.hold_s = hold_s
        self._busy: set[int] = set()
        self._left: dict[int, float] = {}  # a model gone idle: when
        self._lock = threading.Lock()

    def enter(self, who: object) -> None:
        with self._lock:
            self._busy.add(id(who))
            self._left.pop(id(who), None)

    def leave(self, who: object, *, gone: bool = False) -> None:
        """``who`` went idle (``gone``: it was unloaded, and counts no more)."""
        with self._lock:
            if id(who) in self._busy:
                self._busy.discard(id(who))
                if not gone:
                    self._left[id(who)] = time.monotonic()
            if gone:
                self._left.pop(id(who), None)

    def threads(self, wanted: int) -> int:
        """``wanted`` threads, or the share of the cores of one of the models busy now."""
        with self._lock:
            if self._left:
                since = time.monotonic() - self.hold_s
                for key in [k for k, at in self._left.items() if at < since]:
                    del self._left[key]
            busy = len(self._busy) + len(self._left)
        if busy <= 1:
            return wanted
        return max(1, min(wanted, self.cores // busy))


# The models of this process that run on the CPU (shared by their schedulers).
CPU_CORES = CoreShare(math_threads())

