"""``conch models list|show|rm`` against a real store in a temporary data directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conch.cli.models import app
from conch.inference.models.bundled import BUNDLED_ID


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


LONG_ID = "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q4_K_M"  # 48 characters, a real-world shape


@pytest.mark.parametrize("columns", [200, 80, 60, 40])
def test_list_never_cuts_an_id_short(data_dir: Path, smollm2_path: Path, columns: int) -> None:
    from conch.config import Settings
    from conch.inference.models.bundled import ensure_bundled_model
    from conch.inference.models.store import ModelRecord, ModelStore

    store = ModelStore(Settings(data_dir=data_dir))
    ensure_bundled_model(store)
    store.register(ModelRecord(id=LONG_ID, path=str(smollm2_path), size_bytes=smollm2_path.stat().st_size,
                               architecture="llama", context_length=131072, quantization="Q4_K_M",
                               capabilities=["chat", "embeddings"], source="huggingface"))
    out = CliRunner().invoke(app, ["list"], env={"COLUMNS": str(columns)})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    # Each id whole on one line, and no line wider than the terminal but for an id that is itself.
    for model_id in (LONG_ID, BUNDLED_ID):
        assert any(model_id in line for line in lines), out.output
    assert "…" not in out.output
    assert all(len(line) <= max(columns, len(LONG_ID) + len("  ready")) for line in lines), out.output
    if columns >= 200:
        assert "CAPABILITIES" in out.output and "ARCH" in out.output  # a wide terminal shows every column
    if columns >= len(LONG_ID) + 4:
        assert "ID" in lines[1]  # still a table: the other columns gave way, not the ids
