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
        _fast = lib
    return _fast


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
