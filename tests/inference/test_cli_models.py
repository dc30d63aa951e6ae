"""``conch models list|show|rm`` against a real store in a temporary data directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conch.cli.models import app
from conch.inference.bundled import BUNDLED_ID


@pytest.fixture()
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CONCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CONCH_CONFIG", str(tmp_path / "missing.toml"))
    return tmp_path / "data"


def test_list_show_rm(data_dir: Path, smollm2_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(app, ["list", "--json"])
    assert out.exit_code == 0, out.output
    models = json.loads(out.output)
    assert [m["id"] for m in models] == [BUNDLED_ID]
    assert models[0]["quantization"] == "Q4_1"

    table = runner.invoke(app, ["list"])
    assert table.exit_code == 0 and "smollm2" in table.output

    shown = runner.invoke(app, ["show", BUNDLED_ID, "--json"])
    assert shown.exit_code == 0
    assert json.loads(shown.output)["path"] == str(smollm2_path)
    assert "architecture" in runner.invoke(app, ["show", BUNDLED_ID]).output

    missing = runner.invoke(app, ["show", "nope"])
    assert missing.exit_code == 1

    removed = runner.invoke(app, ["rm", BUNDLED_ID])
    assert removed.exit_code == 0
    assert smollm2_path.is_file()  # linked, never deleted
    assert runner.invoke(app, ["rm", BUNDLED_ID]).exit_code == 1
