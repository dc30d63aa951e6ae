"""`make bench`: every benchmark, each comparing conch with its peers side by side.

Pass names to run a subset: ``python benchmarks/run.py lang inference``.

Before the suites run, every peer they compare with is checked (Nushell and Prefect installed into
``.bench-cache``, llama.cpp's llama-server built there); the first table says which peers are
ready, and why any is not, so a missing column in a later table is never a silent dash. ``make
bench`` installs the Python peers through the ``bench`` extra.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SUITES = ["lang", "lsp", "agent_server", "sandbox", "sessions", "inference", "speculative", "vision", "prompt_cache", "models", "budget", "providers", "studio", "orchestration", "marketplace", "gpu"]


def _imports(module: str) -> Callable[[], None]:
    def check() -> None:
        # In a child process: importing a server module here would load it into every suite.
        proc = subprocess.run(
            [sys.executable, "-c", f"import {module}"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines()
            raise RuntimeError(lines[-1] if lines else f"import {module} failed")

    return check


def _nushell() -> None:
    import lang

    lang.find_nu()


def _prefect() -> None:
    import orchestration

    orchestration.find_prefect()


def _litellm() -> None:
    import providers

    providers.find_litellm()


def _llama_server() -> None:
    import serving

    serving.build_llama_server()  # once: about 10 minutes on two cores; then found in .bench-cache


def _jupyter() -> None:
    try:
        _imports("jupyter_client, ipykernel")()
    except RuntimeError:
        from peers import peer_venv

        from sessions import JUPYTER_REQUIREMENTS

        peer_venv("jupyter", JUPYTER_REQUIREMENTS, "jupyter_client, ipykernel")


def _curl() -> None:
    if shutil.which("curl") is None:
        raise RuntimeError("curl is not on PATH")


# suite -> (peer, check that raises with the reason it cannot run)
PEERS: dict[str, list[tuple[str, Callable[[], None]]]] = {
    "lang": [("Nushell", _nushell)],
    "agent_server": [("Starlette on uvloop + httptools", _imports("uvloop, httptools"))],
    "sessions": [("a Jupyter kernel (ipykernel, driven by jupyter_client)", _jupyter)],
    "inference": [
        ("llama-cpp-python in-process", _imports("llama_cpp")),
        ("llama-cpp-python server", _imports("llama_cpp.server.app")),
        ("llama.cpp llama-server (built into .bench-cache)", _llama_server),
    ],
    "speculative": [("llama.cpp llama-server (built into .bench-cache)", _llama_server)],
    "vision": [("llama.cpp llama-server (built into .bench-cache)", _llama_server)],
    "models": [
        ("curl", _curl),
        ("llama.cpp convert_hf_to_gguf.py (needs torch, transformers)", _imports("torch, transformers")),
        ("sentence-transformers", _imports("sentence_transformers")),
    ],
    "providers": [
        ("llama-cpp-python server", _imports("llama_cpp.server.app")),
        ("LiteLLM proxy (its own virtualenv)", _litellm),
    ],
    "orchestration": [("Prefect 3 (its own virtualenv)", _prefect), ("Dask", _imports("dask"))],
}


def check_peers(suites: list[str]) -> None:
    print("=== peers ===")
    for suite in suites:
        for name, check in PEERS.get(suite, []):
            try:
                check()
                status = "ready"
            except Exception as exc:
                status = f"NOT RUN: {exc}"
            print(f"{suite:<14}{name:<60}{status}", flush=True)


def main(argv: list[str]) -> int:
    chosen = argv or SUITES
    check_peers(chosen)
    failed = []
    for name in chosen:
        print(f"\n=== {name} ===", flush=True)
        try:
            importlib.import_module(name).main()
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"\nbenchmarks that failed to run: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
