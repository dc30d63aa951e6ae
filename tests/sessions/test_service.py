"""SessionService over a real database and data directory: what a create may ask for, the
directories it makes, describe, delete, files through the service, and the sweep."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from conch.config import Settings
from conch.sessions.errors import InvalidRequest, SessionNotFound
from conch.sessions.limits import run_limits
from conch.sessions.service import ORPHAN_AGE_S, SessionService


def test_create_lowers_and_never_raises(service: SessionService, settings: Settings) -> None:
    s = service.create(limits={"steps": 10, "wall_time_s": 1.5}, allow_process=False)
    assert s.limits == {"wall_time_s": 1.5, "steps": 10, "recursion": settings.max_recursion,
                        "output_bytes": settings.max_output_bytes,
                        "collection_size": settings.max_collection_size}  # fmt: skip
    assert (s.allow_network, s.allow_process) == (False, False)
    assert s.ttl_s == settings.session_ttl_s == 86_400.0
    short = service.create(ttl_s=60)
    assert short.expires_at - short.created_at == 60
    cases = [
        ({"limits": {"steps": settings.max_steps + 1}}, "limits.steps", "never raise them"),
        ({"limits": {"stepz": 1}}, "limits.stepz", "did you mean 'steps'"),
        ({"limits": {"steps": 1.5}}, "limits.steps", "whole number"),
        ({"limits": {"recursion": 0}}, "limits.recursion", "greater than 0"),
        ({"limits": {"wall_time_s": True}}, "limits.wall_time_s", "must be a number"),
        ({"limits": [1]}, "limits", "must be an object"),
        ({"allow_network": True}, "allow_network", "does not allow it"),
        ({"allow_process": "yes"}, "allow_process", "true or false"),
        ({"ttl_s": 0}, "ttl_s", "more than 0"),
        ({"ttl_s": 10**12}, "ttl_s", "a year"),
        ({"ttl_s": "1h"}, "ttl_s", "number of seconds"),
    ]
    for kwargs, where, text in cases:
        with pytest.raises(InvalidRequest) as err:
            service.create(**kwargs)  # type: ignore[arg-type]
        assert (err.value.status, err.value.where) == (400, where), kwargs
        assert text in err.value.message, (kwargs, err.value.message)
    assert len(service.list()) == 2  # the refused ones made nothing
    assert len(os.listdir(settings.sessions_dir)) == 2


def test_run_limits_take_the_lower_of_session_and_server(settings: Settings) -> None:
    lowered = settings.model_copy(update={"max_steps": 5})
    assert run_limits({"steps": 10, "recursion": 7}, lowered)["steps"] == 5
    assert run_limits({"steps": 10, "recursion": 7}, lowered)["recursion"] == 7


def test_directories_and_describe(service: SessionService, settings: Settings) -> None:
    s = service.create(tenant="t")
    root = settings.sessions_dir / s.id
    assert sorted(os.listdir(root)) == ["state", "tmp", "workspace"]
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o711
    assert stat.S_IMODE(os.stat(root / "state").st_mode) == 0o700
    files = service.files(s.id, tenant="t")
    files.put("notes/a.txt", [b"hello"])
    service.state(s.id).save([{"name": "x", "type": "Int", "value": 1}])
    d = service.describe(s.id, tenant="t")
    assert d["id"] == s.id and d["status"] == "active" and d["runs"] == 0
    assert d["bindings"] == [{"name": "x", "type": "Int"}]
    assert [e["name"] for e in d["files"]] == ["notes"]
    assert d["state_bytes"] > 0
    assert service.measure(s.id) == 5 and service.get(s.id).workspace_bytes == 5
    for bad in ("../etc", "a/b", "", "x" * 100):
        with pytest.raises(SessionNotFound):
            service.get(bad)
    with pytest.raises(SessionNotFound):
        service.describe(s.id, tenant="other")
    with pytest.raises(SessionNotFound):
        service.files(s.id, tenant="other")


def test_files_use_moves_expiry(service: SessionService) -> None:
    s = service.create(ttl_s=100)
    time.sleep(0.05)
    service.files(s.id)
    assert service.get(s.id).expires_at > s.expires_at


def test_delete_removes_files_state_and_row(service: SessionService, settings: Settings) -> None:
    s = service.create(tenant="t")
    service.files(s.id).put("a.txt", [b"x"])
    with pytest.raises(SessionNotFound):
        service.delete(s.id, tenant="someone-else")
    service.delete(s.id, tenant="t")
    assert not (settings.sessions_dir / s.id).exists()
    assert service.store.existing([s.id]) == set()
    with pytest.raises(SessionNotFound):
        service.files(s.id)
    with pytest.raises(SessionNotFound):
        service.delete(s.id)


def test_sweep_expires_finishes_and_removes_orphans(
    service: SessionService, settings: Settings
) -> None:
    old = service.create(ttl_s=10)
    fresh = service.create(ttl_s=1000)
    half = service.create()
    service.store.mark_deleting(half.id)  # a server died between the row and the files
    orphan = settings.sessions_dir / "sess_orphan"
    service.dirs.create("sess_orphan")  # a server died between the files and the row
    young = service.dirs.create("sess_young")
    now = time.time() + 100
    os.utime(orphan, (now - ORPHAN_AGE_S - 1, now - ORPHAN_AGE_S - 1))
    os.utime(young, (now - 5, now - 5))
    done = service.sweep(now=now)
    assert done == {"expired": [old.id], "deleted": [half.id], "orphans": ["sess_orphan"]}
    assert sorted(os.listdir(settings.sessions_dir)) == sorted([fresh.id, "sess_young"])
    assert [s.id for s in service.list()] == [fresh.id]
    assert service.sweep(now=now) == {"expired": [], "deleted": [], "orphans": []}


def test_removing_a_very_deep_tree(service: SessionService, settings: Settings) -> None:
    """A program can nest directories deeper than Python recurses: deleting the session
    still removes them."""
    s = service.create()
    ws = settings.sessions_dir / s.id / "workspace"
    fd = os.open(ws, os.O_RDONLY)
    try:
        for _ in range(1200):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)
    service.delete(s.id)
    assert not (settings.sessions_dir / s.id).exists()


def test_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings(data_dir=tmp_path)
    assert s.sessions_dir == tmp_path / "sessions"
    assert (s.session_idle_s, s.session_ttl_s, s.session_disk_mb, s.session_upload_mb) == (
        300.0, 86_400.0, 512, 100,
    )  # fmt: skip
    monkeypatch.setenv("CONCH_SESSIONS_DIR", "/srv/conch-sessions")
    assert Settings(data_dir=tmp_path).sessions_dir == Path("/srv/conch-sessions")
