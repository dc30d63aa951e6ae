"""Sessions in the studio (issue 35, item 3), in a real browser against real servers: the
playground runs in a session (state kept from run to run, shown in its variables panel), its
files panel (upload by drag and drop and by the file picker, download, delete, the quota and
a 413 past it), a session that is gone (expired or deleted) said so and replaced, a
stateless mode, and the session list with pause and delete. axe-core in both themes on the
changed pages, and the playground's first paint."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from conch import db
from tests.web.studio.conftest import VIEWPORT, Servers, start_servers, stop_servers
from tests.web.studio.test_accessibility import AXE, UNNAMED, _serious
from tests.web.studio.test_playground import run_program

API = "/api/v1/sessions"
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """Servers whose sessions have a small disk quota (1 MiB) under a larger upload limit
    (2 MiB), so that one upload can pass the quota."""
    running_servers, running = start_servers(
        tmp_path_factory.mktemp("studio-sessions"), session_disk_mb=1, session_upload_mb=2
    )
    yield running_servers
    stop_servers(running)
    db.dispose_all()


@pytest.fixture()
def pg(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    context.close()
    assert not errors, errors


def _session_of(page: Any) -> str:
    sid = page.evaluate("localStorage.getItem('conch.playground.session')")
    assert sid and sid.startswith("sess_"), sid
    return str(sid)


def _wait_result(page: Any, text: str) -> None:
    expect(page.get_by_test_id("result")).to_contain_text(text, timeout=30_000)
    expect(page.get_by_test_id("run")).to_be_enabled(timeout=30_000)


def _fresh_playground(page: Any, base: str) -> None:
    page.goto(base + "/#/playground")
    page.evaluate("localStorage.removeItem('conch.playground.session'); localStorage.removeItem('conch.playground.stateless')")
    page.reload()
    expect(page.get_by_test_id("no-session")).to_be_visible()


def test_state_is_kept_across_runs_and_shown_as_variables(small: Servers, pg: Any, shots: Path) -> None:
    _fresh_playground(pg, small.agent)
    run_program(pg, 'let mut n = 41\nlet t = [{x: 1, y: "a"}, {x: 2, y: "b"}]\nfn double(v) => v * 2\nlet lz = range(0, 3) | map(fn(i) => i)\nn')
    _wait_result(pg, "41")
    sid = _session_of(pg)  # made on the first run, kept in this browser
    # The second run sees the first one's bindings and changes one of them.
    run_program(pg, "n = n + 1\ndouble(n)")
    _wait_result(pg, "84")
    expect(pg.get_by_test_id("result-type")).to_have_text("Int")
    variables = pg.get_by_test_id("variables")
    expect(variables.locator("tr[data-var='n']")).to_contain_text("42", timeout=15_000)
    expect(variables.locator("tr[data-var='n']")).to_contain_text("mut")
    expect(variables.locator("tr[data-var='t']")).to_contain_text("Table")
    expect(variables.locator("tr[data-var='t']")).to_contain_text('[{x: 1, y: "a"}, {x: 2, y: "b"}]')
    expect(variables.locator("tr[data-var='double']")).to_contain_text("fn double(v) => v * 2")
    expect(pg.get_by_test_id("session-link")).to_have_attribute("href", f"#/sessions/{sid}")
    # The lazy Array of the first run could not be saved; the second run's answer names none.
    expect(variables.locator("tr[data-var='lz']")).to_have_count(0)
    # What the panel shows is what the server holds.
    got = httpx.get(f"{small.agent}{API}/{sid}", timeout=30).json()
    assert {b["name"] for b in got["bindings"]} == {"n", "t", "double"}
    assert got["runs"] == 2
    # A reload keeps the session: the state is still there for the next run.
    pg.reload()
    expect(pg.get_by_test_id("variables").locator("tr[data-var='n']")).to_contain_text("42")
    run_program(pg, "n * 10")
    _wait_result(pg, "420")
    assert _session_of(pg) == sid
    pg.screenshot(path=str(shots / "sessions-playground-variables.png"), full_page=True)


def test_unsaved_bindings_are_named(small: Servers, pg: Any) -> None:
    _fresh_playground(pg, small.agent)
    run_program(pg, "let lz = range(0, 3) | map(fn(i) => i)\n1")
    _wait_result(pg, "1")
    unsaved = pg.get_by_test_id("unsaved")
    expect(unsaved).to_contain_text("lz")
    expect(unsaved).to_contain_text("lazy Array")


def _drop(page: Any, name: str, content: str, mime: str = "text/plain") -> None:
    """A drop of one file on the files panel, as the browser sends it: dragover then drop,
    each with a DataTransfer holding the file."""
    dt = page.evaluate_handle(
        """([name, content, mime]) => {
            const dt = new DataTransfer();
            dt.items.add(new File([content], name, {type: mime}));
            return dt;
        }""",
        [name, content, mime],
    )
    page.dispatch_event("[data-testid=files]", "dragenter", {"dataTransfer": dt})
    page.dispatch_event("[data-testid=files]", "dragover", {"dataTransfer": dt})
    page.dispatch_event("[data-testid=files]", "drop", {"dataTransfer": dt})


def test_files_upload_by_drop_and_picker_download_and_delete(small: Servers, pg: Any, shots: Path, tmp_path: Path) -> None:
    _fresh_playground(pg, small.agent)
    pg.get_by_test_id("no-session").get_by_role("button", name="Start one now").click()
    files = pg.get_by_test_id("files")
    expect(files).to_be_visible()
    sid = _session_of(pg)
    expect(pg.get_by_test_id("quota")).to_contain_text("0 B of 1 MiB used")
    expect(pg.get_by_test_id("quota")).to_contain_text("one upload at most 2 MiB")
    # Drag and drop.
    _drop(pg, "sales.csv", "region,amount\nnorth,10\nsouth,32\n", "text/csv")
    expect(files.locator("li[data-file='sales.csv']")).to_be_visible()
    # The file picker.
    picked = tmp_path / "notes.txt"
    picked.write_text("picked by the file picker\n")
    pg.get_by_test_id("file-input").set_input_files(str(picked))
    expect(files.locator("li[data-file='notes.txt']")).to_be_visible()
    expect(pg.get_by_test_id("quota")).to_contain_text("of 1 MiB used")
    expect(pg.get_by_test_id("quota")).not_to_contain_text("0 B of")
    listed = httpx.get(f"{small.agent}{API}/{sid}/files", timeout=30).json()
    assert sorted(e["name"] for e in listed) == ["notes.txt", "sales.csv"]
    # A run in the session reads the dropped file from its workspace.
    run_program(pg, 'cat("sales.csv") | from_csv | map(fn(r) => int(r.amount)) | sum')
    _wait_result(pg, "42")
    pg.screenshot(path=str(shots / "sessions-files.png"), full_page=True)
    # Download.
    with pg.expect_download() as got:
        files.get_by_role("button", name="Download notes.txt").click()
    download = got.value
    assert download.suggested_filename == "notes.txt"
    assert Path(download.path()).read_text() == "picked by the file picker\n"
    # A file a run writes shows up too (the panel is read again after each run).
    run_program(pg, 'write("top.json", "[1]")\n"written"')
    _wait_result(pg, "written")
    expect(files.locator("li[data-file='top.json']")).to_be_visible()
    # Delete.
    files.get_by_role("button", name="Delete sales.csv").click()
    expect(files.locator("li[data-file='sales.csv']")).to_have_count(0)
    listed = httpx.get(f"{small.agent}{API}/{sid}/files", timeout=30).json()
    assert sorted(e["name"] for e in listed) == ["notes.txt", "top.json"]


def test_quota_exceeded_is_shown_and_nothing_is_written(small: Servers, pg: Any, shots: Path) -> None:
    _fresh_playground(pg, small.agent)
    pg.get_by_test_id("no-session").get_by_role("button", name="Start one now").click()
    expect(pg.get_by_test_id("files")).to_be_visible()
    sid = _session_of(pg)
    # 1.5 MiB: within the upload limit (2 MiB), past the disk quota (1 MiB).
    pg.get_by_test_id("file-input").set_input_files(
        files=[{"name": "big.bin", "mimeType": "application/octet-stream", "buffer": b"\0" * (3 * MIB // 2)}]
    )
    err = pg.get_by_test_id("files-error")
    expect(err).to_contain_text("413")
    expect(err).to_contain_text("session_disk_mb")
    expect(err).to_contain_text("Delete files to make room")
    expect(pg.get_by_test_id("files").locator("li[data-file='big.bin']")).to_have_count(0)
    assert httpx.get(f"{small.agent}{API}/{sid}/files", timeout=30).json() == []
    pg.screenshot(path=str(shots / "sessions-quota-exceeded.png"), full_page=True)
    # Recoverable: dismissed, and a file that fits is taken.
    err.get_by_role("button", name="Dismiss").click()
    expect(err).to_have_count(0)
    _drop(pg, "small.txt", "fits")
    expect(pg.get_by_test_id("files").locator("li[data-file='small.txt']")).to_be_visible()


def test_a_session_gone_is_said_plainly_and_replaced(small: Servers, pg: Any, shots: Path) -> None:
    _fresh_playground(pg, small.agent)
    run_program(pg, "let kept = 1\nkept")
    _wait_result(pg, "1")
    sid = _session_of(pg)
    # Deleted behind the page's back (as an expiry would).
    assert httpx.delete(f"{small.agent}{API}/{sid}", timeout=30).status_code == 200
    run_program(pg, "kept + 1")
    gone = pg.get_by_test_id("session-gone")
    expect(gone).to_contain_text("no longer exists")
    expect(gone).to_contain_text(sid)
    expect(pg.get_by_test_id("run-error")).to_contain_text("NotFound")
    pg.screenshot(path=str(shots / "sessions-gone.png"), full_page=True)
    gone.get_by_role("button", name="Start a new session").click()
    expect(gone).to_have_count(0)
    new = _session_of(pg)
    assert new != sid
    expect(pg.get_by_test_id("variables")).to_contain_text("No variables yet")
    run_program(pg, "let again = 2\nagain * 21")
    _wait_result(pg, "42")
    # New session: a fresh one, the old one left in the list.
    pg.get_by_test_id("new-session").click()
    expect(pg.get_by_test_id("session-link")).not_to_have_attribute("href", f"#/sessions/{new}")
    assert _session_of(pg) != new
    assert httpx.get(f"{small.agent}{API}/{new}", timeout=30).status_code == 200


def test_stateless_runs_keep_nothing(small: Servers, pg: Any) -> None:
    _fresh_playground(pg, small.agent)
    pg.get_by_test_id("keep-state").uncheck()
    expect(pg.get_by_test_id("stateless")).to_be_visible()
    run_program(pg, "let z = 1\nz")
    _wait_result(pg, "1")
    run_program(pg, "z")
    expect(pg.get_by_test_id("run-error")).to_contain_text("NameError")
    assert pg.evaluate("localStorage.getItem('conch.playground.session')") is None
    pg.get_by_test_id("keep-state").check()
    expect(pg.get_by_test_id("no-session")).to_be_visible()


def test_session_list_pause_and_delete(small: Servers, pg: Any, shots: Path) -> None:
    c = httpx.Client(base_url=small.agent, timeout=30)
    a = c.post(API, json={}).json()["id"]
    b = c.post(API, json={}).json()["id"]
    assert c.post("/api/v1/execute", json={"session": a, "command": 'let v = 1; write("f.txt", "12345")'}).json()["success"]
    pg.goto(small.agent + "/#/sessions")
    table = pg.get_by_test_id("sessions-table")
    row_a = table.locator(f"tr[data-session='{a}']")
    expect(row_a.get_by_test_id("session-status")).to_have_text("active")
    expect(row_a.get_by_test_id("session-size")).to_have_text("5 B")
    expect(row_a).to_contain_text("s ago")
    pg.screenshot(path=str(shots / "sessions-list.png"), full_page=True)
    # Pause.
    row_a.get_by_role("button", name=f"Pause {a}").click()
    expect(row_a.get_by_test_id("session-status")).to_have_text("paused")
    assert c.get(f"{API}/{a}").json()["status"] == "paused"
    expect(row_a.get_by_role("button", name=f"Pause {a}")).to_be_disabled()
    # Delete, behind a confirmation.
    table.locator(f"tr[data-session='{b}']").get_by_role("button", name=f"Delete {b}").click()
    dialog = pg.get_by_role("dialog")
    expect(dialog).to_contain_text(b)
    dialog.get_by_role("button", name="Delete session").click()
    expect(table.locator(f"tr[data-session='{b}']")).to_have_count(0)
    assert c.get(f"{API}/{b}").status_code == 404
    # One session's page: its variables (read from the saved state: the paused session stays
    # paused) and files; "Open in the playground" makes it the playground's.
    row_a.get_by_role("link").first.click()
    detail = pg.get_by_test_id("session-detail")
    expect(detail).to_contain_text(a)
    expect(pg.get_by_test_id("variables").locator("tr[data-var='v']")).to_contain_text("1")
    expect(pg.get_by_test_id("files").locator("li[data-file='f.txt']")).to_be_visible()
    expect(detail.get_by_test_id("session-status")).to_have_text("paused")
    pg.screenshot(path=str(shots / "sessions-detail.png"), full_page=True)
    detail.get_by_role("button", name="Open in the playground").click()
    expect(pg).to_have_url(re.compile("#/playground$"))
    run_program(pg, "v + 1")
    _wait_result(pg, "2")  # resumed from disk
    assert _session_of(pg) == a
    # A session that is not there: its page says so.
    pg.goto(f"{small.agent}/#/sessions/{b}")
    expect(pg.get_by_test_id("not-found")).to_contain_text("Session not found")
    c.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_no_serious_accessibility_violations_on_session_pages(small: Servers, browser: Any, shots: Path, scheme: str) -> None:
    if not AXE.exists():
        pytest.skip(f"axe-core is not installed: no {AXE} (run `cd ui && npm ci`)")
    axe = AXE.read_text(encoding="utf-8")
    c = httpx.Client(base_url=small.agent, timeout=30)
    sid = c.post(API, json={}).json()["id"]
    c.post("/api/v1/execute", json={"session": sid, "command": 'let rows = [{a: 1}]; fn f(x) => x; write("r.txt", "x")'})
    c.put(f"{API}/{sid}/files/data/in.csv", content=b"a\n1\n")
    context = browser.new_context(viewport={"width": 1440, "height": 900}, color_scheme=scheme, bypass_csp=True)
    page = context.new_page()
    try:
        page.goto(small.agent + "/#/playground")
        page.evaluate(f"localStorage.setItem('conch.playground.session', '{sid}')")
        checks = {
            "playground": lambda: expect(page.get_by_test_id("variables").locator("tr[data-var='rows']")).to_be_visible(),
            "sessions": lambda: expect(page.get_by_test_id("sessions-table")).to_be_visible(),
            f"sessions/{sid}": lambda: expect(page.get_by_test_id("files").locator("li[data-file='r.txt']")).to_be_visible(),
        }
        for route, ready in checks.items():
            page.goto(f"{small.agent}/#/{route}")
            page.reload()
            ready()
            found = _serious(page, axe)
            assert not found, f"#/{route} ({scheme}):\n" + "\n".join(found)
            assert not page.evaluate(UNNAMED), f"#/{route}: controls without a name"
            name = "session" if route.startswith("sessions/") else route
            page.screenshot(path=str(shots / f"sessions-axe-{name}-{scheme}.png"), full_page=True)
        # The quota error, too.
        page.goto(f"{small.agent}/#/playground")
        page.get_by_test_id("file-input").set_input_files(
            files=[{"name": "big.bin", "mimeType": "application/octet-stream", "buffer": b"\0" * (3 * MIB // 2)}]
        )
        expect(page.get_by_test_id("files-error")).to_contain_text("413")
        found = _serious(page, axe)
        assert not found, f"quota error ({scheme}):\n" + "\n".join(found)
    finally:
        context.close()
        c.close()


def test_playground_first_paint_with_a_session(small: Servers, browser: Any) -> None:
    """The playground's first paint stays within 300 ms on loopback with a session holding
    variables and files (a warm context: the bundle cached, as when a link is followed)."""
    c = httpx.Client(base_url=small.agent, timeout=30)
    sid = c.post(API, json={}).json()["id"]
    c.post("/api/v1/execute", json={"session": sid, "command": "let xs = range(0, 1000) | map(fn(i) => {i: i}) | sort_by(\"i\")"})
    context = browser.new_context(viewport=VIEWPORT)
    warm = context.new_page()
    warm.goto(small.agent + "/#/playground")
    warm.evaluate(f"localStorage.setItem('conch.playground.session', '{sid}')")
    warm.wait_for_load_state("networkidle")
    paints = []
    for _ in range(3):
        page = context.new_page()
        page.goto(small.agent + "/#/playground")
        paints.append(float(page.wait_for_function(
            "() => { const e = performance.getEntriesByName('first-contentful-paint')[0];"
            " return e ? e.startTime : false }", polling="raf").json_value()))
        expect(page.get_by_test_id("variables").locator("tr[data-var='xs']")).to_be_visible()
        page.close()
    context.close()
    c.close()
    print(f"playground first paint with a session: {paints} ms")
    assert max(paints) <= 300, paints


def test_session_pages_fit_a_phone(small: Servers, browser: Any, shots: Path) -> None:
    c = httpx.Client(base_url=small.agent, timeout=30)
    sid = c.post(API, json={}).json()["id"]
    c.post("/api/v1/execute", json={"session": sid, "command": 'let long_name_of_a_record = {a: "' + "x" * 300 + '"}; write("a-file-with-a-rather-long-name.txt", "x")'})
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    try:
        page.goto(small.agent + "/#/playground")
        page.evaluate(f"localStorage.setItem('conch.playground.session', '{sid}')")
        for route, ready in (
            ("playground", "variables"),
            ("sessions", "sessions-table"),
            (f"sessions/{sid}", "files"),
        ):
            page.goto(f"{small.agent}/#/{route}")
            page.reload()
            expect(page.get_by_test_id(ready)).to_be_visible()
            page.wait_for_timeout(200)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"#/{route} is {width} px wide at 390 px"
            name = "session" if route.startswith("sessions/") else route
            page.screenshot(path=str(shots / f"phone-390-sessions-{name}.png"), full_page=True)
    finally:
        context.close()
        c.close()
