"""Saved bindings on a real file system: round trips, updates that write only what changed,
a save cut short (and a process killed with SIGKILL mid-save) leaving the last completed
state, damaged documents named, and the cost of a small save."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conch.sessions.state import MANIFESTS, SessionState


def doc(name: str, value: object, type: str = "Int") -> dict[str, object]:
    return {"name": name, "type": type, "value": value}


def test_save_load_update_delete(tmp_path: Path) -> None:
    st = SessionState(tmp_path / "state")
    assert st.version() == 0 and st.load().bindings == {} and st.bindings() == []
    assert (
        st.save([doc("a", 1), doc("b", [1, 2], "Array"), doc("f", {"src": "x"}, "Function")]) == 1
    )
    fresh = SessionState(tmp_path / "state").load()
    assert fresh.version == 1 and fresh.damaged == []
    assert fresh.bindings == {"a": doc("a", 1), "b": doc("b", [1, 2], "Array"),
                              "f": doc("f", {"src": "x"}, "Function")}  # fmt: skip
    assert st.bindings() == [{"name": "a", "type": "Int"}, {"name": "b", "type": "Array"},
                             {"name": "f", "type": "Function"}]  # fmt: skip

    files = tmp_path / "state" / "bindings"
    before = {p.name: p.stat().st_mtime_ns for p in files.iterdir()}
    time.sleep(0.01)
    assert st.save([doc("a", 2)], removed=["f", "never-there"]) == 2
    after = {p.name: p.stat().st_mtime_ns for p in files.iterdir()}
    # a went to its other slot; b was not written; f's file is gone.
    assert set(after) == {"a.0.json", "a.1.json", "b.0.json"}
    assert after["b.0.json"] == before["b.0.json"]
    assert SessionState(tmp_path / "state").load().bindings == {"a": doc("a", 2),
                                                                 "b": doc("b", [1, 2], "Array")}  # fmt: skip
    assert st.save() == 2 and st.save([], removed=["f"]) == 2  # nothing to do: no new version
    assert st.save([doc("a", 3)], removed=["a"]) == 3  # a name in both is saved
    assert st.replace([doc("c", 1)]) == 4
    assert SessionState(tmp_path / "state").load().bindings == {"c": doc("c", 1)}
    assert sorted(p.name for p in files.iterdir()) == ["c.0.json"]
    doc_bytes = len(b'{"name":"c","type":"Int","value":1}')
    assert st.size_bytes() == doc_bytes + _current_manifest_bytes(tmp_path / "state")


def _current_manifest_bytes(state: Path) -> int:
    """The size of the manifest slot with the highest version."""
    sizes = []
    for name in MANIFESTS:
        p = state / name
        head = p.read_bytes().split(b"\n", 1)[0].split(b" ")
        sizes.append((int(head[2]), p.stat().st_size))
    return max(sizes)[1]


def test_any_name_and_large_values(tmp_path: Path) -> None:
    st = SessionState(tmp_path / "state")
    names = ["données", "a" * 300, "with space", "../../etc/passwd", "x.y"]
    st.save([doc(n, n) for n in names] + [doc("big", list(range(200_000)), "Array")])
    got = SessionState(tmp_path / "state").load()
    assert list(got.bindings) == [*names, "big"]  # the order they were first saved in
    assert got.bindings["big"]["value"] == list(range(200_000))
    assert all(".." not in p.name for p in (tmp_path / "state" / "bindings").iterdir())
    raw = SessionState(tmp_path / "state").load(raw=True)
    assert raw.bindings["x.y"] == b'{"name":"x.y","type":"Int","value":"x.y"}'


def test_a_bad_document_saves_nothing(tmp_path: Path) -> None:
    st = SessionState(tmp_path / "state")
    st.save([doc("a", 1)])
    with pytest.raises(ValueError, match="'b' is not JSON-able"):
        st.save([doc("a", 2), doc("b", object())])
    with pytest.raises(ValueError, match="string name and type"):
        st.save([{"name": "c", "value": 1}])
    assert SessionState(tmp_path / "state").load().bindings == {"a": doc("a", 1)}


def test_a_save_cut_short_leaves_the_last_completed_state(tmp_path: Path) -> None:
    st = SessionState(tmp_path / "state")
    st.save([doc("a", 1), doc("b", 1)])
    st.save([doc("a", 2), doc("b", 2)])
    # The third save wrote its bindings and half of its manifest, then the server died.
    st.save([doc("a", 3), doc("b", 3)])
    torn = tmp_path / "state" / MANIFESTS[3 % 2]
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
    got = SessionState(tmp_path / "state").load()
    assert got.version == 2 and got.bindings == {"a": doc("a", 2), "b": doc("b", 2)}
    # Saving on from there reuses the torn slot.
    again = SessionState(tmp_path / "state")
    assert again.save([doc("a", 4)]) == 3
    assert SessionState(tmp_path / "state").load().bindings == {"a": doc("a", 4), "b": doc("b", 2)}


def test_a_damaged_document_is_named(tmp_path: Path) -> None:
    st = SessionState(tmp_path / "state")
    st.save([doc("a", 1), doc("b", "two", "String")])
    (tmp_path / "state" / "bindings" / "b.0.json").write_bytes(
        b'{"name":"b","type":"String","value":"tw0"}'
    )
    got = SessionState(tmp_path / "state").load()
    assert got.bindings == {"a": doc("a", 1)}
    assert got.damaged == [
        {"name": "b", "reason": "its saved document does not match its checksum"}
    ]
    (tmp_path / "state" / "bindings" / "a.0.json").unlink()
    assert [d["name"] for d in SessionState(tmp_path / "state").load().damaged] == ["a", "b"]


def test_load_collects_what_a_crash_left(tmp_path: Path) -> None:
    st = SessionState(tmp_path / "state")
    st.save([doc("a", 1), doc("gone", 1)])
    st.save(removed=["gone"])
    (tmp_path / "state" / "bindings" / "gone.0.json").write_text("{}")  # unlink never ran
    SessionState(tmp_path / "state").load(collect=False)
    assert (tmp_path / "state" / "bindings" / "gone.0.json").exists()
    SessionState(tmp_path / "state").load()
    assert sorted(os.listdir(tmp_path / "state" / "bindings")) == ["a.0.json"]


SAVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from conch.sessions.state import SessionState
    st = SessionState(Path(sys.argv[1]))
    i = 0
    while True:
        i += 1
        # Every save changes both bindings to the same value and grows them, so a mix of
        # two saves (or a torn document) would show.
        st.save([{"name": "a", "type": "Array", "value": [i] * (i % 500)},
                 {"name": "b", "type": "Array", "value": [i] * (i % 500)}])
        if i == 50:
            print("saving", flush=True)
    """
)


@pytest.mark.timeout(120)
def test_sigkill_mid_save_loses_no_completed_save(tmp_path: Path) -> None:
    """A process saving as fast as it can is killed with SIGKILL at arbitrary moments: what
    loads is always one completed save (both bindings from the same one, neither damaged)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    seen = set()
    for attempt in range(8):
        state = tmp_path / f"state{attempt}"
        proc = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(state)], stdout=subprocess.PIPE, env=env
        )
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"saving\n"
        time.sleep(0.05 + 0.037 * attempt)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        got = SessionState(state).load()
        assert got.damaged == []
        a, b = got.bindings["a"]["value"], got.bindings["b"]["value"]
        assert a == b
        v = got.version
        assert v >= 50 and a == [v] * (v % 500)
        seen.add(v)
    assert len(seen) > 1


def test_saving_one_small_binding_costs_well_under_a_millisecond(tmp_path: Path) -> None:
    st = SessionState(tmp_path / "state")
    st.save([doc(f"v{i}", i) for i in range(100)])
    times = []
    for i in range(300):
        t = time.perf_counter()
        st.save([doc("x", i)])
        times.append(time.perf_counter() - t)
    times.sort()
    assert times[len(times) // 2] < 0.0005, times[len(times) // 2]
