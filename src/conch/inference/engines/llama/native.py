"""Loading llama.cpp's shared libraries before numpy's.

On an NVIDIA machine (2026-11-22) a CUDA build of libllama loaded *after* numpy crashed with
SIGSEGV inside the BPE tokenizer's ``std::regex`` while loading a model; loaded before numpy it
ran. The cause was not found (both bring C++ runtime and OpenMP libraries into the process, and
the first one loaded wins the symbols), so conch makes the safe order the only one: importing
:mod:`conch.inference` (every module that can load a model is in it) maps libllama and the ggml
libraries it links into the process first. That is a ``dlopen`` of about 10 ms; numpy and
llama_cpp's Python modules are still imported only when needed.
``tests/inference/gpu/test_import_order.py`` checks the order for every entry point.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import sys
from pathlib import Path

from conch import process_role

log = logging.getLogger(__name__)

_handle: ctypes.CDLL | None = None
_error: OSError | None = None


def llama_library_path() -> Path | None:
    """Where llama_cpp will load libllama from (its own rule: ``$LLAMA_CPP_LIB_PATH``, else its lib/)."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        base = Path(override)
    else:
        spec = importlib.util.find_spec("llama_cpp")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            return None
        base = Path(next(iter(spec.submodule_search_locations))) / "lib"
    names = {"linux": ["libllama.so"], "darwin": ["libllama.so", "libllama.dylib"]}
    for name in names.get("darwin" if sys.platform == "darwin" else "linux", []):
        if (base / name).exists():
            return base / name
    return None


def load_llama_first() -> None:
    """Map libllama (and the ggml backends it links) into the process, once.

    A build that cannot load (a CUDA build on a machine without the driver) is not fatal here:
    importing llama_cpp raises the same error, with its own message, when a model is loaded.
    """
    global _handle, _error
    if _handle is not None or _error is not None or not sys.platform.startswith(("linux", "darwin")):
        return
    if process_role.sandbox_worker:  # a sandbox worker never loads a model
        return
    if "numpy" in sys.modules and "llama_cpp" not in sys.modules:
        log.warning("numpy was imported before llama.cpp's libraries; a CUDA build may crash while "
                    "loading a model (import conch.inference before numpy)")
    path = llama_library_path()
    if path is None:
        return
    try:
        _handle = ctypes.CDLL(str(path))  # the mode llama_cpp uses, so its own load reuses this one
    except OSError as exc:
        _error = exc
