"""A workflow's step waiting for an approval, seen in the studio across a restart of a real
``conch serve`` process stopped by SIGINT (Ctrl-C) and by SIGKILL (issue 35, item 4): the
workflow page and the approvals inbox show the step waiting with its pending call; while the
server is down both say it cannot be reached, keeping what they showed; when it is back on the
same port and data directory they pick up by themselves, without a reload, showing the same
task still waiting for the same call (no second task started for the step); approving it in
the inbox completes the workflow, and its page shows that."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.web.studio.conftest import VIEWPORT
from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import Server, finished, start_process_server, wait_for

pytestmark = pytest.mark.timeout(420)

API = "/api/v1/orchestration"
# Generous: on a busy two-core machine a poll, a restart or a page's next read can be slow.
SLOW = 60_000


def step(record: dict[str, Any], sid: str) -> dict[str, Any]:
    return next(s for s in record["steps"] if s["id"] == sid)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_a_waiting_step_survives_a_restart_in_the_studio(
    tmp_path: Path, browser: Any, shots: Path, sig: signal.Signals
) -> None:
    model = ScriptedModel().start()
    # By position: the request asked again after the restart gets the same reply.
    goal = model.script_by_position(
        f"studio restart {sig.name}: write once approved",
        tool("append", path="approved.log", content="x\n"),
        final("written"),
    )
    data, log = tmp_path / "data", tmp_path / "server.log"
    body = {
        "name": f"restart-{sig.name.lower()}",
        "steps": [
            {"id": "ask", "task": {"goal": goal, "tools": ["append"],
                                   "approvals": {"effects": {"write": "ask"}}}},
            {"id": "after", "depends_on": ["ask"], "run": "steps.ask.result + ' and after'"},
        ],
    }  # fmt: skip
    context = browser.new_context(viewport=VIEWPORT)
    errors: list[str] = []
    server: Server | None = None
    try:
        server = start_process_server(data, log, models_url=model.v1)
        url, port = server.url, int(server.url.rsplit(":", 1)[1])
        with server.client() as c:
            r = c.post(f"{API}/workflows", json=body)
            assert r.status_code == 201, r.text
            wf_id = r.json()["id"]
            before = wait_for(
                c, f"{API}/workflows/{wf_id}", lambda w: step(w, "ask")["status"] == "waiting"
            )
            task_id = step(before, "ask")["task_id"]
            waiting = c.get(f"{API}/tasks/{task_id}").json()
            assert [p["tool"] for p in waiting["pending"]] == ["append"], waiting
            call_id = waiting["pending"][0]["call_id"]

        # Two pages open across the restart: the workflow with its step's detail, and the inbox.
        flow = context.new_page()
        inbox_page = context.new_page()
        for pg in (flow, inbox_page):
            pg.on("pageerror", lambda e: errors.append(str(e)))
        flow.goto(f"{url}/#/agents/workflows/{wf_id}?step=ask")
        detail = flow.get_by_test_id("workflow-detail")
        node = detail.locator("[data-node=ask]")
        step_detail = flow.get_by_test_id("step-detail")

        def shows_the_step_waiting() -> None:
            expect(node).to_have_attribute("data-status", "waiting", timeout=SLOW)
            expect(step_detail.get_by_test_id("step-task-link")).to_have_text(task_id)
            expect(step_detail.locator(".badge[data-tone=waiting]").first).to_have_text("waiting")
            expect(step_detail.get_by_test_id("step-attempts")).to_contain_text("1")
            expect(detail.locator("tr[data-step=after] .badge")).to_have_text("pending")

        shows_the_step_waiting()
        inbox_page.goto(f"{url}/#/agents/approvals")
        inbox = inbox_page.get_by_test_id("approvals")
        card = inbox.locator(f"[data-task='{task_id}']")

        def shows_the_pending_call() -> None:
            expect(inbox.get_by_test_id("approval")).to_have_count(1, timeout=SLOW)
            expect(card.get_by_test_id("approval-workflow")).to_contain_text(body["name"])
            expect(card.get_by_test_id("approval-workflow")).to_contain_text("ask")
            pending = card.get_by_test_id("pending-call")
            expect(pending).to_have_count(1)
            expect(pending).to_contain_text("append")
            expect(pending.get_by_test_id("call-effect")).to_have_text("effect: write")
            expect(pending.get_by_test_id("call-args")).to_have_value(
                '{\n  "path": "approved.log",\n  "content": "x\\n"\n}'
            )
            expect(inbox_page.get_by_test_id("approvals-count")).to_have_text("1", timeout=SLOW)

        shows_the_pending_call()
        flow.screenshot(path=str(shots / f"restart-{sig.name}-1-workflow-waiting.png"))
        inbox_page.screenshot(path=str(shots / f"restart-{sig.name}-1-approvals-waiting.png"))

        # The server stops: Ctrl-C (a graceful stop) or SIGKILL.
        assert server.process is not None
        server.process.send_signal(sig)
        server.process.wait(60)
        if sig == signal.SIGINT:
            assert (
                server.process.returncode == 0 or "Application shutdown complete" in log.read_text()
            )

        # Both pages say the server cannot be reached, and keep showing what they last read.
        outage = detail.get_by_test_id("unreachable")
        expect(outage).to_contain_text("cannot reach the server", timeout=SLOW)
        expect(outage).to_contain_text("the workflow below is as last read")
        expect(node).to_have_attribute("data-status", "waiting")
        expect(step_detail.get_by_test_id("step-task-link")).to_have_text(task_id)
        inbox_outage = inbox.get_by_test_id("unreachable")
        expect(inbox_outage).to_contain_text("cannot reach the server", timeout=SLOW)
        expect(inbox_outage).to_contain_text("the calls below are as last read")
        expect(inbox.get_by_test_id("not-available")).to_have_count(0)
        expect(card.get_by_test_id("pending-call")).to_contain_text("append")
        flow.screenshot(path=str(shots / f"restart-{sig.name}-2-workflow-outage.png"))
        inbox_page.screenshot(path=str(shots / f"restart-{sig.name}-2-approvals-outage.png"))

        # Started again on the same port and data directory: both pages pick up by themselves.
        server = start_process_server(data, log, port=port, models_url=model.v1)
        expect(outage).to_have_count(0, timeout=SLOW)
        shows_the_step_waiting()
        expect(inbox_outage).to_have_count(0, timeout=SLOW)
        shows_the_pending_call()
        flow.screenshot(path=str(shots / f"restart-{sig.name}-3-workflow-restarted.png"))
        inbox_page.screenshot(path=str(shots / f"restart-{sig.name}-3-approvals-restarted.png"))
        with server.client() as c:
            again = c.get(f"{API}/tasks/{task_id}").json()
            assert again["status"] == "waiting", again
            assert [p["call_id"] for p in again["pending"]] == [call_id]
            assert step(c.get(f"{API}/workflows/{wf_id}").json(), "ask")["task_id"] == task_id
            assert [t["id"] for t in c.get(f"{API}/tasks").json() if t["goal"] == goal] == [task_id]

        # Approved in the inbox: the workflow completes, and its page shows it.
        card.get_by_test_id("approve").click()
        expect(inbox.get_by_test_id("approvals-empty")).to_be_visible(timeout=SLOW)
        expect(detail.locator(".row.between .badge").first).to_have_text("succeeded", timeout=SLOW)
        expect(node).to_have_attribute("data-status", "succeeded")
        expect(detail.locator("tr[data-step=after]")).to_contain_text("written and after")
        expect(step_detail.get_by_test_id("step-task-link")).to_have_text(task_id)
        expect(step_detail.get_by_test_id("step-output")).to_have_text("written")
        expect(step_detail.get_by_test_id("timeline-step")).to_have_count(2, timeout=SLOW)
        # The header's badge on the workflow's page follows at its next poll.
        expect(flow.get_by_test_id("approvals-count")).to_have_count(0, timeout=SLOW)
        flow.screenshot(path=str(shots / f"restart-{sig.name}-4-workflow-done.png"))
        inbox_page.screenshot(path=str(shots / f"restart-{sig.name}-4-approvals-done.png"))

        with server.client() as c:
            done = wait_for(c, f"{API}/workflows/{wf_id}", finished, 60)
            tasks = [t for t in c.get(f"{API}/tasks").json() if t["goal"] == goal]
    finally:
        context.close()
        if server is not None:
            server.stop()
        model.stop()

    assert done["status"] == "succeeded", done
    assert step(done, "ask")["task_id"] == task_id and step(done, "ask")["attempts"] == 1
    assert step(done, "after")["result"] == "written and after"
    # One task for the step, ever; its approved call ran once.
    assert [t["id"] for t in tasks] == [task_id]
    assert (data / "workspace" / "approved.log").read_text() == "x\n"
    assert not errors, f"uncaught errors in the page: {errors}"
