"""The tour of SPEC §1.3 (examples/tour.conch) runs end to end in a prepared workspace."""

from __future__ import annotations

from pathlib import Path

from conch.lang import run, values
from conch.lang.context import Context

TOUR = Path(__file__).resolve().parents[2] / "examples" / "tour.conch"


def test_tour(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.py").write_text("x" * 5000)
    (src / "bigger.py").write_text("y" * 9000)
    (src / "small.py").write_text("z")
    (src / "pkg").mkdir()
    (tmp_path / "notes.txt").write_text("first\nsecond\nthird\nfourth\n")
    printed: list[str] = []
    ctx = Context(workspace=tmp_path, output=printed.append)
    result = values.to_json_value(run(TOUR.read_text(), context=ctx))
    assert result == {
        "greeting": "hello world",
        "square": 144,
        "clamp": 10,
        "double": 42,
        "fields": ["a", 2, None],
        "indexing": [1, 3, "el"],
        "total": 60,
        "big": ["src/bigger.py", "src/big.py"],
        "joined": "a-b-c",
        "summed": 55,
        "bumped": 42,
        "column": ["x", "y"],
        "file_count": 3,
        "first_notes": ["first", "second", "third"],
        "kinds": ["zero", "small", "negative", "array", "named z", "other"],
        "n": 3,
        "r": "ZeroDivisionError",
        "thrown": "UserError",
    }
    assert sorted(printed) == ["src/big.py", "src/bigger.py", "src/pkg", "src/small.py"]
