"""The curated agents a fresh server starts with, so that search answers on first run.

The agents are data, in ``catalogue.toml`` next to this module. Each uses only bundled
builtins, and its system prompt is written for a small local model (SmolLM2-135M, the bundled
default): short sentences, one job, the tools named with what to pass them, and the exact
shape of the answer. They are published as ``1.0.0`` by ``conch``; a later catalogue change
ships as a new version, never as an edit of a published one.
"""

from __future__ import annotations

import tomllib
from importlib.resources import files
from typing import Any

from conch.marketplace.records import PublishRequest

_DATA: dict[str, Any] = tomllib.loads(
    files("conch.marketplace").joinpath("catalogue.toml").read_text(encoding="utf-8")
)

MODEL: str = _DATA["model"]
AUTHOR: str = _DATA["author"]

# The file's top-level version, model and author hold for every agent that names none.
_DEFAULTS = {"version": _DATA["version"], "model": MODEL, "author": AUTHOR}
CATALOGUE: tuple[PublishRequest, ...] = tuple(
    PublishRequest(**{**_DEFAULTS, **agent}) for agent in _DATA["agent"]
)
