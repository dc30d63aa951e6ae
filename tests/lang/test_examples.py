"""Every builtin's documented examples, run as conch programs: the documentation cannot lie.

Each example runs in a fresh temporary workspace (examples that read files create them
first). The result is compared as JSON with the documented one, or by type name when the
result cannot be known in advance (``uuid()``, ``now()``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conch.host import shell_host
from conch.lang import values
from conch.lang.builtins.registry import Builtin, Example, all_builtins
from conch.lang.context import Context

try:
    from conch.lang import run
except ImportError:  # the language core has not landed yet
    run = None

CASES: list[tuple[Builtin, int, Example]] = [
    (b, i, e) for b in all_builtins() for i, e in enumerate(b.examples)
]


def test_every_builtin_has_an_example() -> None:
    missing = [b.name for b in all_builtins() if not b.examples]
    assert not missing


@pytest.mark.parametrize(
    ("builtin", "index", "example"),
    CASES,
    ids=[f"{b.name}[{i}]" for b, i, _ in CASES],
)
def test_example(builtin: Builtin, index: int, example: Example, tmp_path: Path) -> None:
    if run is None:
        pytest.skip("conch.lang.run is not available yet")
    output: list[str] = []
    # The shell's host: the ai, embed and agent examples reach models as `conch -c` does.
    ctx = Context(workspace=tmp_path, output=output.append, host=shell_host())
    result = run(example.code, context=ctx)
    if example.has_result:
        assert values.to_json_value(result) == values.to_json_value(example.result), (
            f"{builtin.name} example {index}: {example.code}"
        )
    if example.type is not None:
        assert values.type_of(result) == example.type, (
            f"{builtin.name} example {index}: {example.code}"
        )
