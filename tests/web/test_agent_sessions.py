"""Sessions over HTTP: the resource, its files, and the ``session`` field of the execution
and stream routes, against a real agent server (real workers, real SQLite)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testsupport.servers import Server, start_thread_server

ENVELOPE = {"success", "result", "type", "value", "output", "error", "elapsed_ms"}
PUBLIC = {"id", "status", "created_at", "last_used_at", "expires_at", "ttl_s", "limits",
          "allow_network", "allow_process", "workspace_bytes", "runs"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_thread_server(
        tmp_path_factory.mktemp("sessions-web"), workers=1, session_spares=1, wall_time_s=5.0,
        max_body_bytes=64 * 1024, session_upload_mb=2, session_disk_mb=3)
    yield running
    running.stop()


@pytest.fixture()
def c(server: Server) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def _new(c: httpx.Client, **body: Any) -> str:
    r = c.post("/api/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _run(c: httpx.Client, sid: str | None, command: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"command": command, **extra}
    if sid is not None:
        body["session"] = sid
    r = c.post("/api/v1/execute", json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        out.append((lines["event"], json.loads(lines["data"])))
    return out


# -- the resource ---------------------------------------------------------------------------


def test_create_answers_the_session(c: httpx.Client, server: Server) -> None:
    r = c.post("/api/v1/sessions", json={"ttl_s": 600, "limits": {"steps": 5000}})
    assert r.status_code == 201
    body = r.json()
    assert set(body) == PUBLIC
    assert body["id"].startswith("sess_") and body["status"] == "active"
    assert body["ttl_s"] == 600.0 and body["workspace_bytes"] == 0 and body["runs"] == 0
    assert body["limits"]["steps"] == 5000
    assert body["limits"]["wall_time_s"] == server.settings.wall_time_s
    assert body["created_at"].endswith("Z") and body["expires_at"] > body["created_at"]
    # No body at all is a session with the server's defaults.
    empty = c.post("/api/v1/sessions")
    assert empty.status_code == 201 and empty.json()["ttl_s"] == server.settings.session_ttl_s


@pytest.mark.parametrize(("body", "where"), [
    ({"ttl": 5}, "ttl"),
    ({"limits": {"steps": 10**12}}, "limits.steps"),
    ({"limits": {"stepz": 5}}, "limits.stepz"),
    ({"allow_process": True}, "allow_process"),
    ({"allow_network": "yes"}, "allow_network"),
    ({"ttl_s": -1}, "ttl_s"),
    ([1, 2], "body"),
])
def test_create_refuses_what_it_cannot_honour(c: httpx.Client, body: Any, where: str) -> None:
    r = c.post("/api/v1/sessions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["kind"] == "RequestError" and error["where"] == where


def test_get_list_pause_delete(c: httpx.Client) -> None:
    sid = _new(c)
    assert _run(c, sid, 'let mut n = 1; let name = "a"; write("a.txt", "hi")')["success"]
    got = c.get(f"/api/v1/sessions/{sid}").json()
    assert set(got) >= PUBLIC | {"bindings", "files"}
    assert got["bindings"] == [{"name": "n", "type": "Int"}, {"name": "name", "type": "String"}]
    assert [f["name"] for f in got["files"]] == ["a.txt"]
    assert got["runs"] == 1 and got["workspace_bytes"] == 2
    listed = c.get("/api/v1/sessions").json()
    assert sid in [s["id"] for s in listed] and set(listed[0]) == PUBLIC
    paused = c.post(f"/api/v1/sessions/{sid}/pause")
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    assert sid in [s["id"] for s in c.get("/api/v1/sessions", params={"status": "paused"}).json()]
    assert _run(c, sid, "n + 1")["value"] == 2  # resumed
    assert c.get(f"/api/v1/sessions/{sid}").json()["status"] == "active"
    deleted = c.delete(f"/api/v1/sessions/{sid}")
    assert deleted.status_code == 200 and deleted.json() == {"id": sid, "deleted": True}
    for r in (c.get(f"/api/v1/sessions/{sid}"), c.delete(f"/api/v1/sessions/{sid}"),
              c.post(f"/api/v1/sessions/{sid}/pause"),
              c.post("/api/v1/execute", json={"command": "1", "session": sid})):
        assert r.status_code == 404 and r.json()["error"]["kind"] == "NotFound", r.text


def test_previews_come_from_the_saved_state_and_run_nothing(c: httpx.Client) -> None:
    sid = _new(c)
    program = ('let n = 42; let mut c = 0; let s = "hi"; let t = [{x: 1}, {x: 2}]; '
               'fn double(x) => x * n; let big = range(0, 5000) | map(fn(i) => i) | sort; '
               'let r = range(0, 10); let lz = range(0, 3) | map(fn(i) => i)')
    ran = _run(c, sid, program)
    assert ran["success"] and [u["name"] for u in ran["unsaved"]] == ["lz"]
    runs = c.get(f"/api/v1/sessions/{sid}").json()["runs"]
    c.post(f"/api/v1/sessions/{sid}/pause")
    got = c.get(f"/api/v1/sessions/{sid}", params={"preview": "true"}).json()
    by = {b["name"]: b for b in got["bindings"]}
    assert "lz" not in by  # not saved: no preview pretends it is
    assert by["n"]["preview"] == "42" and by["n"]["kind"] == "let" and by["n"]["mutable"] is False
    assert by["c"]["kind"] == "let mut" and by["c"]["mutable"] is True
    assert by["s"]["preview"] == '"hi"' and by["s"]["length"] == 2
    assert by["t"]["type"] == "Table" and by["t"]["preview"] == "[{x: 1}, {x: 2}]"
    assert by["t"]["length"] == 2
    assert by["double"]["type"] == "Function" and by["double"]["preview"] == "fn double(x) => x * n"
    assert by["r"]["preview"] == "range(0, 10)"
    big = by["big"]
    assert big["length"] == 5000 and big["preview"].startswith("[0, 1, 2, ")
    assert big["preview"].endswith("…") and len(big["preview"]) <= 161
    assert all(b["bytes"] > 0 for b in got["bindings"])
    # Reading previews ran nothing: the session stays paused, its run count unchanged.
    again = c.get(f"/api/v1/sessions/{sid}").json()
    assert again["status"] == "paused" and again["runs"] == runs
    assert set(again["bindings"][0]) == {"name", "type"}  # without ?preview, as before
    assert again["disk_quota_bytes"] == 3 * 1024 * 1024
    assert again["upload_max_bytes"] == 2 * 1024 * 1024
    bad = c.get(f"/api/v1/sessions/{sid}", params={"preview": "maybe"})
    assert bad.status_code == 400 and "preview" in bad.text


def test_the_list_gives_each_workspace_as_it_is_now(c: httpx.Client) -> None:
    sid = _new(c)
    assert _run(c, sid, 'write("a.txt", "12345")')["success"]  # a program's write: unmeasured
    listed = {s["id"]: s for s in c.get("/api/v1/sessions").json()}
    assert listed[sid]["workspace_bytes"] == 5
    assert _run(c, sid, 'write("b.txt", "123")')["success"]
    assert c.post(f"/api/v1/sessions/{sid}/pause").json()["status"] == "paused"
    listed = {s["id"]: s for s in c.get("/api/v1/sessions").json()}
    assert listed[sid]["status"] == "paused" and listed[sid]["workspace_bytes"] == 8


# -- runs -----------------------------------------------------------------------------------


def test_every_run_route_takes_a_session(c: httpx.Client) -> None:
    sid = _new(c)
    first = _run(c, sid, "let base = 40; let mut hits = 0")
    assert set(first) == ENVELOPE | {"unsaved"} and first["unsaved"] == []
    assert _run(c, sid, "hits = hits + 1; base + hits")["value"] == 41
    body = c.post("/api/v1/eval", json={"code": "hits = hits + 1; base + hits",
                                        "session": sid}).json()
    assert body["value"] == 42 and body["unsaved"] == []
    called = c.post("/api/v1/call/map", json={"args": [[1, 2], "fn(x) => x + base"],
                                              "session": sid}).json()
    assert called["value"] == [41, 42] and called["unsaved"] == []
    piped = c.post("/api/v1/pipeline", json={"input": [1, 2], "steps": ["map(fn(x) => x * base)"],
                                             "session": sid}).json()
    assert piped["value"] == [40, 80] and set(piped) >= {"steps", "unsaved"}
    for route, key in (("execute", "command"), ("eval", "code")):
        r = c.post(f"/api/v1/stream/{route}", json={key: "hits = hits + 1; hits", "session": sid})
        events = _sse(r.text)
        assert events[0][0] == "start" and events[-1][0] == "complete"
        assert events[-1][1]["unsaved"] == []
    assert events[-1][1]["result"] == "4"
    r = c.post("/api/v1/stream/pipeline", json={"input": [1], "steps": ["map(fn(x) => x + hits)"],
                                                "session": sid})
    assert ("data", {"result": "5"}) in _sse(r.text)  # an Array streams its elements
    failed = c.post("/api/v1/stream/execute", json={"command": "let bad = 1 / 0", "session": sid})
    assert _sse(failed.text)[-1] == ("error", {**_sse(failed.text)[-1][1], "unsaved": []})
    lazy = _run(c, sid, "let later = range(0, 3) | map(fn(i) => i)")
    assert lazy["unsaved"][0]["name"] == "later" and lazy["unsaved"][0]["reason"]


def test_without_a_session_every_route_answers_as_before(c: httpx.Client) -> None:
    assert set(_run(c, None, "1 + 1")) == ENVELOPE
    assert set(c.post("/api/v1/eval", json={"code": "let x = 1"}).json()) == ENVELOPE
    assert set(c.post("/api/v1/call/len", json={"args": [[1]]}).json()) == ENVELOPE
    assert set(c.post("/api/v1/pipeline", json={"input": [1], "steps": ["sum"]}).json()) \
        == ENVELOPE | {"steps"}
    events = _sse(c.post("/api/v1/stream/execute", json={"command": "1"}).text)
    assert set(events[-1][1]) == {"result", "elapsed_ms", "type"}
    # Bindings of a session never reach a run without one.
    sid = _new(c)
    _run(c, sid, "let secret = 1")
    assert _run(c, None, "secret")["error"]["kind"] == "NameError"


def test_a_bad_session_field_is_a_precise_error(c: httpx.Client) -> None:
    for path, body in (("/api/v1/execute", {"command": "1"}), ("/api/v1/eval", {"code": "1"}),
                       ("/api/v1/pipeline", {"input": 1, "steps": ["sum"]}),
                       ("/api/v1/call/len", {"args": [[1]]}),
                       ("/api/v1/stream/execute", {"command": "1"})):
        missing = c.post(path, json={**body, "session": "sess_000000000000000000000000"})
        assert missing.status_code == 404, (path, missing.text)
        assert missing.json()["error"] == {"kind": "NotFound", "message": (
            "no session 'sess_000000000000000000000000'"), "where": "session"}
        typed = c.post(path, json={**body, "session": 5})
        assert typed.status_code == 400 and "session" in typed.json()["error"]["message"]
    odd = c.post("/api/v1/execute", json={"command": "1", "session": "../../etc"})
    assert odd.status_code == 404


# -- files ----------------------------------------------------------------------------------


def test_upload_and_download_round_trip(c: httpx.Client, server: Server) -> None:
    sid = _new(c)
    data = bytes(range(256)) * 4096  # 1 MiB, past max_body_bytes: uploads have their own limit
    assert len(data) > server.settings.max_body_bytes
    r = c.put(f"/api/v1/sessions/{sid}/files/in/data.bin", content=data)
    assert r.status_code == 200, r.text
    assert r.json() == {**r.json(), "name": "in/data.bin", "type": "file", "size": len(data)}
    got = c.get(f"/api/v1/sessions/{sid}/files/in/data.bin")
    assert got.status_code == 200 and got.content == data
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.headers["content-length"] == str(len(data))
    c.put(f"/api/v1/sessions/{sid}/files/sales.csv", content=b"region,amount\nnorth,3\nsouth,4\n")
    # The session's programs see its files, and what they write comes back out.
    total = _run(c, sid, 'let rows = cat("sales.csv") | from_csv; rows | map(fn(r) => r.amount) '
                         '| sum')
    assert total["value"] == 7, total
    assert _run(c, sid, 'mkdir("out"); write("out/report.json", to_json({total: 7}))')["success"]
    report = c.get(f"/api/v1/sessions/{sid}/files/out/report.json")
    assert report.json() == {"total": 7} and report.headers["content-type"] == "application/json"
    listed = c.get(f"/api/v1/sessions/{sid}/files").json()
    assert [e["name"] for e in listed] == ["in", "out", "sales.csv"]
    inner = c.get(f"/api/v1/sessions/{sid}/files", params={"dir": "in"}).json()
    assert inner == [{**inner[0], "name": "in/data.bin", "type": "file", "size": len(data)}]
    assert c.delete(f"/api/v1/sessions/{sid}/files/in").status_code == 409  # not empty
    assert c.delete(f"/api/v1/sessions/{sid}/files/in", params={"recursive": "true"}).status_code \
        == 200
    assert c.get(f"/api/v1/sessions/{sid}/files/in/data.bin").status_code == 404
    assert not _run(c, sid, 'exists("in/data.bin")')["value"]
    # Another session sees none of it.
    other = _new(c)
    assert c.get(f"/api/v1/sessions/{other}/files/sales.csv").status_code == 404
    assert _run(c, other, 'exists("sales.csv")')["value"] is False


def test_paths_follow_the_filesystem_rules(c: httpx.Client) -> None:
    sid = _new(c)
    for bad in ("..%2Fescape", "a/../../escape"):
        r = c.put(f"/api/v1/sessions/{sid}/files/{bad}", content=b"x")
        assert r.status_code in (400, 404), r.text
        if r.status_code == 400:
            assert r.json()["error"]["where"] == "path"
    r = c.get(f"/api/v1/sessions/{sid}/files", params={"dir": "../.."})
    assert r.status_code == 400 and r.json()["error"]["where"] == "dir"
    assert c.get(f"/api/v1/sessions/{sid}/files/nothing.txt").status_code == 404


def test_uploads_are_bounded_by_size_and_quota(c: httpx.Client) -> None:
    sid = _new(c)
    big = c.put(f"/api/v1/sessions/{sid}/files/big.bin", content=b"x" * (2 * 1024 * 1024 + 1))
    assert big.status_code == 413, big.text
    assert big.json()["error"]["kind"] == "LimitError"
    assert "session_upload_mb" in big.json()["error"]["message"]
    mib = b"y" * (1024 * 1024)
    assert c.put(f"/api/v1/sessions/{sid}/files/a", content=mib * 2).status_code == 200
    over = c.put(f"/api/v1/sessions/{sid}/files/b", content=mib * 2)  # 4 MiB of 3
    assert over.status_code == 413 and over.json()["error"]["kind"] == "LimitError"
    assert "session_disk_mb" in over.json()["error"]["message"]
    names = [e["name"] for e in c.get(f"/api/v1/sessions/{sid}/files").json()]
    assert names == ["a"]  # nothing left behind
    # The server goes on serving.
    assert _run(c, sid, "1 + 1")["value"] == 2


def test_a_session_of_its_own_is_kept_after_the_server_restarts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_thread_server(data, workers=1, session_spares=1)
    try:
        with first.client() as c:
            sid = _new(c)
            _run(c, sid, 'let mut count = 41; write("kept.txt", "yes")')
    finally:
        first.stop()
    second = start_thread_server(data, workers=1, session_spares=1)
    try:
        with second.client() as c:
            assert _run(c, sid, 'count = count + 1; [count, cat("kept.txt")]')["value"] \
                == [42, "yes"]
    finally:
        second.stop()
