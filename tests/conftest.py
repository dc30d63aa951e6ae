"""Fixtures every test directory may use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testsupport.scripted_model import ScriptedModel


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedModel]:
    """A scripted model server on loopback (testsupport/scripted_model.py), one per module."""
    model = ScriptedModel().start()
    yield model
    model.stop()
