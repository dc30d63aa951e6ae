"""What this process is for, set once at its start by the entry point that knows.

A sandbox worker (``conch.sandbox.worker``) reaches models over HTTP and never loads
one, so importing :mod:`conch.inference` there (for ``ai``/``embed``) must not map llama.cpp's
libraries into it (:mod:`conch.inference.engines.llama.native`). A module attribute, not an environment
variable, so that programs never see it in ``env()``.
"""

from __future__ import annotations

sandbox_worker = False
