"""Stand-ins for Ollama and Anthropic on loopback (see standins.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.inference.providers import standins


@pytest.fixture(scope="module")
def ollama_standin() -> Iterator[Any]:
    app = standins.ollama_app()
    with standins.serve(app) as url:
        app.state.url = url
        yield app


@pytest.fixture(scope="module")
def anthropic_standin() -> Iterator[Any]:
    app = standins.anthropic_app()
    with standins.serve(app) as url:
        app.state.url = url
        yield app
