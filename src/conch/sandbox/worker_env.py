"""What a sandbox worker process inherits from the server: an allowlist, not a denylist.

A denylist of name markers (``KEY``, ``TOKEN`` …) lets ``DATABASE_URL=postgres://u:pw@host/db``
through to ``env()``; the worker gets only what a program legitimately needs (``PATH``,
``HOME``, the locale and time zone) plus what conch itself needs to start the worker
(``PYTHONPATH``, when the server was started with one, so the worker imports the same conch).

The settings a worker receives are the server's with every secret removed: workers reach
models through the inference server's API (``models_url``), never with provider keys.
"""

from __future__ import annotations

import os

from conch.config import Settings

ALLOWED_ENV = ("PATH", "HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONPATH")

_SECRETS = ("api_key", "admin_key", "hf_token", "openai_api_key", "anthropic_api_key",
            "marketplace_api_key", "database_url")


def worker_environment(settings: Settings, environ: dict[str, str] | None = None) -> dict[str, str]:
    source = os.environ if environ is None else environ
    env = {k: source[k] for k in ALLOWED_ENV if k in source}
    env.setdefault("PATH", os.defpath)
    if "PYTHONPATH" in env:
        # Resolved against the server's directory: a worker starts elsewhere (beside its
        # workspace), where a relative entry would name another conch or nothing, and an
        # empty one its own directory.
        entries = [os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(entries)
    return env


def worker_settings(settings: Settings) -> Settings:
    """The settings sent to workers: no keys, tokens or database URL, no provider table
    (its keys), so nothing a program could get a worker to reveal is secret."""
    return settings.model_copy(update={**{k: None for k in _SECRETS}, "providers": {}})
