"""llama.cpp start-up: the backend initialised once, the model file opened, the fast calls bound."""

from __future__ import annotations

import ctypes
import logging
import os
import struct
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_backend_lock = threading.Lock()
_backend_ready = False
_fast: Any = None
_log_capture = threading.local()
_log_callback: Any = None


def init_backend() -> Any:
    """Import llama_cpp once, quiet its native logging, and initialise the backend."""
    global _backend_ready, _log_callback
    import llama_cpp

    with _backend_lock:
        if not _backend_ready:
            import llama_cpp._logger as lc_logger  # its callback honours the level below

            logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
            forward = lc_logger.llama_log_callback

            # llama.cpp's log goes on to llama_cpp's callback as before; a thread inside
            # llama_log() also keeps its lines (a context's creation reports its buffers there).
            @llama_cpp.llama_log_callback
            def callback(level: int, text: bytes, user_data: Any) -> None:
                lines = getattr(_log_capture, "lines", None)
                if lines is not None:
                    lines.append(text.decode("utf-8", "replace"))
                forward(level, text, user_data)

            _log_callback = callback  # a ctypes callback must outlive its registration
            llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _backend_ready = True
    return llama_cpp


@contextmanager
def llama_log() -> Iterator[list[str]]:
    """The lines llama.cpp logs on this thread meanwhile, at every level (an enclosing block
    sees the lines of the blocks inside it too)."""
    init_backend()  # the callback that keeps them
    lines: list[str] = []
    outer: list[str] | None = getattr(_log_capture, "lines", None)
    _log_capture.lines = lines
    try:
        yield lines
    finally:
        _log_capture.lines = outer
        if outer is not None:
            outer.extend(lines)


def fast_calls() -> Any:
    """Short llama.cpp calls bound through ``PyDLL``, which keeps the GIL held.

    ctypes' default ``CDLL`` drops and retakes the GIL around every call; when the event loop
    thread is busy, retaking it can wait a whole switch interval (5 ms). Sampling one token
    takes well under that, so the worker keeps the GIL for it and releases it only in
    ``llama_decode``, where the real work happens.
    """
    global _fast
    if _fast is None:
        from llama_cpp import llama_cpp as raw

        lib = ctypes.PyDLL(raw._lib._name)
        lib.llama_sampler_sample.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]
        lib.llama_sampler_sample.restype = ctypes.c_int32
        lib.llama_vocab_is_eog.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        lib.llama_vocab_is_eog.restype = ctypes.c_bool
        lib.llama_token_to_piece.argtypes = [
            ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_bool,
        ]
        lib.llama_token_to_piece.restype = ctypes.c_int32
        lib.llama_get_logits_ith.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        lib.llama_get_logits_ith.restype = ctypes.c_void_p
        _fast = lib
    return _fast


_OMP_PAUSE_SOFT = 1  # omp_pause_soft in omp.h
_omp_pause: Any = None
_omp_pause_looked_up = False


def release_openmp_threads() -> None:
    """Give back the calling thread's OpenMP worker threads, when llama.cpp runs on OpenMP.

    libgomp keeps a pool of worker threads for every thread that ever started a parallel
    region, and once the pools together hold more threads than there are CPUs it stops
    spinning at barriers and sleeps on a futex instead; ggml meets at a barrier after every
    graph node, so from then on a decode step costs a few hundred futex round trips. Measured
    on a 16-core machine: decoding from a second thread after the loading thread had computed
    ran at 48 tokens/s instead of 292. So a thread that computed once (a load, an embedding, an
    idle decode worker) releases its pool, and only the thread that decodes keeps one.
    """
    global _omp_pause, _omp_pause_looked_up
    if not _omp_pause_looked_up:
        _omp_pause_looked_up = True
        _omp_pause = _find_omp_pause()
    if _omp_pause is not None:
        _omp_pause(_OMP_PAUSE_SOFT)


def _find_omp_pause() -> Any:
    """``omp_pause_resource_all`` of the libgomp llama.cpp loaded, if it loaded one."""
    try:
        with open("/proc/self/maps") as fh:
            path = next((line.split()[-1] for line in fh if "libgomp" in line and "/" in line), None)
    except OSError:
        return None
    if path is None:
        return None
    try:
        fn = ctypes.CDLL(path).omp_pause_resource_all
    except (OSError, AttributeError):  # an OpenMP older than 5.0
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


# ggml's CPU flash attention computes a micro-batch of this many query rows or more with its
# tiled kernel (GGML_FA_TILE_Q), fewer with its one-row-at-a-time kernel.
FA_TILE_ROWS = 64
_CPU_DEVICE = 0  # GGML_BACKEND_DEVICE_TYPE_CPU


class ReferenceKernels:
    """Switches one llama.cpp context's CPU backend to ggml's reference kernels and back.

    ggml's CPU backend picks a kernel by the shape of a micro-batch: flash attention over one
    query row and 512+ KV cells sums the cells in one chunk per thread and merges the chunks
    (split-KV), over 64+ rows it runs a tiled kernel, and K-quant matrix products take a tiled
    path from 8 rows on. Each rounds differently, so a token's logits depended on how many other
    rows shared its micro-batch, and the split-KV sum on where its cells sit in the KV pool.
    With the reference kernels (``ggml_backend_cpu_set_use_ref``) every row is computed alone,
    in the same order, whatever else the micro-batch holds: a token decoded in a one-row step,
    in a step with drafted tokens after it or beside other streams gets bitwise the same
    logits, and its sum over the KV cells depends only on their order, not their place.

    The scheduler turns them on for steps under :data:`FA_TILE_ROWS` rows (decode steps,
    verified drafts) and off for long prompt chunks, where the tiled kernels are what makes
    prefill fast. Setting it is a store into the backend's context, read at the next compute.
    """

    def __init__(self, backend: int, setter: Any) -> None:
        self._backend = backend
        self._setter = setter
        self._on: bool | None = None

    def set(self, on: bool) -> None:
        if on is not self._on:
            self._setter(self._backend, on)
            self._on = on


def reference_kernels(ctx: Any) -> ReferenceKernels | None:
    """The switch for the CPU backend of the llama.cpp context ``ctx`` (a ``llama_context *``),
    or None where it cannot be found (another platform, a ggml without the switch).

    llama.h does not hand out a context's backends, so the backend is found in the context
    object itself: the word pointing to a ggml backend whose guid is the CPU backend's and whose
    device is the CPU device. Memory is read through ``/proc/self/mem``, which answers an error
    instead of faulting on an address that is not mapped."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        ggml = ctypes.CDLL("libggml.so.0")  # already loaded by libllama: the same copy
        base = ctypes.CDLL("libggml-base.so.0")
    except OSError:
        return None
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_init_by_type.argtypes = [ctypes.c_int, ctypes.c_char_p]
    ggml.ggml_backend_init_by_type.restype = ctypes.c_void_p
    for name, args, res in (
        ("ggml_backend_guid", [ctypes.c_void_p], ctypes.c_void_p),
        ("ggml_backend_free", [ctypes.c_void_p], None),
        ("ggml_backend_get_device", [ctypes.c_void_p], ctypes.c_void_p),
        ("ggml_backend_name", [ctypes.c_void_p], ctypes.c_char_p),
        ("ggml_backend_dev_backend_reg", [ctypes.c_void_p], ctypes.c_void_p),
        ("ggml_backend_reg_get_proc_address", [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p),
    ):
        fn = getattr(base, name)
        fn.argtypes, fn.restype = args, res
    device = ggml.ggml_backend_dev_by_type(_CPU_DEVICE)
    if not device:
        return None
    address = base.ggml_backend_reg_get_proc_address(base.ggml_backend_dev_backend_reg(device),
                                                     b"ggml_backend_cpu_set_use_ref")
    if not address:
        return None
    setter = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_bool)(address)
    probe = ggml.ggml_backend_init_by_type(_CPU_DEVICE, None)
    if not probe:
        return None
    guid = base.ggml_backend_guid(probe)
    base.ggml_backend_free(probe)
    start = ctx if isinstance(ctx, int) else ctypes.cast(ctx, ctypes.c_void_p).value
    if not start or not guid:
        return None
    try:
        fd = os.open("/proc/self/mem", os.O_RDONLY)
    except OSError:
        return None
    try:
        blob = b""
        for size in (4096, 2048, 1024):  # the object is ~1 KB; past it the heap may end
            try:
                blob = os.pread(fd, size, start)
                break
            except OSError:
                continue
        for off in range(0, len(blob) - 7, 8):
            (word,) = struct.unpack_from("<Q", blob, off)
            if word < 4096 or word >= 1 << 63:
                continue
            try:
                head = os.pread(fd, 8, word)
            except OSError:
                continue
            if len(head) != 8 or struct.unpack("<Q", head)[0] != guid:
                continue
            if base.ggml_backend_get_device(word) == device and base.ggml_backend_name(word) == b"CPU":
                return ReferenceKernels(word, setter)
    finally:
        os.close(fd)
    return None


def open_model(path: str, *, n_gpu_layers: int | None = None, main_gpu: int = 0) -> Any:
    """The GGUF file mapped into memory as a llama.cpp model (``llama_cpp._internals.LlamaModel``),
    with ``n_gpu_layers`` of its layers on the GPU (None: llama.cpp's default)."""
    llama_cpp = init_backend()
    from llama_cpp._internals import LlamaModel

    mparams = llama_cpp.llama_model_default_params()
    mparams.use_mmap = True
    # A CPU build keeps llama.cpp's own default: setting 0 there changes how the CPU backend
    # lays out (repacks) the weights, and with it the last bits of the logits.
    if n_gpu_layers is not None and llama_cpp.llama_supports_gpu_offload():
        mparams.n_gpu_layers = n_gpu_layers
        mparams.main_gpu = main_gpu
    return LlamaModel(path_model=path, params=mparams, verbose=False)


def open_context(model: Any, **params: Any) -> Any:
    """A llama.cpp context on ``model`` with the given ``llama_context_params`` fields set."""
    llama_cpp = init_backend()
    from llama_cpp._internals import LlamaContext

    cparams = llama_cpp.llama_context_default_params()
    for name, value in params.items():
        setattr(cparams, name, value)
    return LlamaContext(model=model, params=cparams, verbose=False)
