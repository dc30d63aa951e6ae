"""llama.cpp start-up: the backend initialised once, the model file opened, the fast calls bound."""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

_backend_lock = threading.Lock()
_backend_ready = False
_fast: Any = None


def init_backend() -> Any:
    """Import llama_cpp once, quiet its native logging, and initialise the backend."""
    global _backend_ready
    import llama_cpp

    with _backend_lock:
        if not _backend_ready:
            import llama_cpp._logger  # installs the log callback that honours the level below

            logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
            llama_cpp.llama_backend_init()
            _backend_ready = True
    return llama_cpp


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
