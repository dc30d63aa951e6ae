"""The approvals inbox (issue 21, item 4), in a real browser against an agent server whose
model is scripted: tasks and workflow steps waiting for a person, each pending call with its
tool, effect, arguments and reason; approve, edit the arguments and approve, reject with a
message; the header's badge counts what waits; `#/agents/approvals` is its address."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import expect

from testsupport.scripted_model import ScriptedModel, call, final, native, tool
from testsupport.servers import Server

API = "/api/v1/orchestration"
ASK_LS = {"tools": {"ls": "ask"}}


def wait_status(c: httpx.Client, path: str, *status: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        rec = c.get(path).json()
        if rec["status"] in status:
            return rec
        assert time.monotonic() < deadline, f"{path} is {rec['status']}, not {status}"
        time.sleep(0.1)


def waiting_task(c: httpx.Client, scripted: ScriptedModel, goal: str) -> dict[str, Any]:
    scripted.script(goal, tool("ls", path="."), final(f"done: {goal}"))
    body = {"goal": goal, "tools": ["ls"], "max_steps": 4, "approvals": ASK_LS}
    task = c.post(f"{API}/tasks", json=body).json()
    return wait_status(c, f"{API}/tasks/{task['id']}", "waiting")


def test_the_inbox_approves_edits_and_rejects(
    orch: Server, scripted: ScriptedModel, page: Any, shots: Path
) -> None:
    with orch.client() as c:
        edit = waiting_task(c, scripted, "List the workspace (approve with edits)")
        refuse = waiting_task(c, scripted, "List the workspace (reject)")
        # A workflow whose task step waits for a person.
        goal = "List the workspace (a workflow's step)"
        scripted.script(goal, tool("ls", path="."), final("listed"))
        wf = c.post(
            f"{API}/workflows",
            json={
                "name": "needs-a-person",
                "steps": [
                    {"id": "prep", "run": "1"},
                    {
                        "id": "look",
                        "depends_on": ["prep"],
                        "task": {
                            "goal": goal,
                            "tools": ["ls"],
                            "max_steps": 4,
                            "approvals": ASK_LS,
                        },
                    },
                ],
            },
        ).json()
        deadline = time.monotonic() + 60
        while c.get(f"{API}/workflows/{wf['id']}").json()["steps"][1]["status"] != "waiting":
            assert time.monotonic() < deadline
            time.sleep(0.1)

    page.goto(f"{orch.url}/#/playground")
    # The header counts what waits, on any page, and links to the inbox.
    expect(page.get_by_test_id("approvals-count")).to_have_text("3", timeout=15_000)
    page.get_by_test_id("approvals-link").click()
    expect(page).to_have_url(f"{orch.url}/#/agents/approvals")
    expect(page.get_by_role("tab", name="Approvals")).to_have_attribute("aria-selected", "true")
    inbox = page.get_by_test_id("approvals")
    expect(inbox.get_by_test_id("approval")).to_have_count(3)
    expect(inbox.get_by_test_id("approvals-summary")).to_contain_text("3 tasks waiting, 3 calls")
    card = inbox.locator(f"[data-task='{edit['id']}']")
    call = card.get_by_test_id("pending-call")
    expect(call).to_contain_text("ls")
    expect(call.get_by_test_id("call-effect")).to_have_text("effect: read")
    expect(call.get_by_test_id("call-reason")).to_contain_text("ask")
    expect(call.get_by_test_id("call-args")).to_have_value('{\n  "path": "."\n}')
    step_card = inbox.locator(
        "[data-testid=approval]", has=page.get_by_test_id("approval-workflow")
    )
    expect(step_card.get_by_test_id("approval-workflow")).to_contain_text("needs-a-person")
    expect(step_card.get_by_test_id("approval-workflow")).to_contain_text("look")
    page.screenshot(path=str(shots / "approvals-inbox.png"))

    # Edit the arguments, then approve: the call runs with them.
    call.get_by_test_id("call-args").fill('{"path": "./"}')
    expect(call.get_by_test_id("approve")).to_have_text("Approve with edited arguments")
    call.get_by_test_id("approve").click()
    expect(card).to_have_count(0)
    # Reject with a message: the model is told it.
    rcard = inbox.locator(f"[data-task='{refuse['id']}']")
    rcard.get_by_test_id("reject-message").fill("Not now: answer from memory.")
    rcard.get_by_test_id("reject").click()
    expect(rcard).to_have_count(0)
    # The workflow's step: approve as it is.
    step_card.get_by_test_id("approve").click()
    expect(inbox.get_by_test_id("approval")).to_have_count(0)
    expect(inbox.get_by_test_id("approvals-empty")).to_be_visible()
    expect(page.get_by_test_id("approvals-count")).to_have_count(0, timeout=15_000)

    with orch.client() as c:
        done = wait_status(c, f"{API}/tasks/{edit['id']}", "succeeded")
        assert done["steps"][0]["args"] == {"path": "./"}
        rejected = wait_status(c, f"{API}/tasks/{refuse['id']}", "succeeded")
        assert rejected["steps"][0]["error"]["kind"] == "RejectedError"
        assert "Not now: answer from memory." in str(rejected["steps"][0]["observation"])
        flow = wait_status(c, f"{API}/workflows/{wf['id']}", "succeeded")
        assert flow["steps"][1]["result"] == "listed"


def test_a_waiting_task_is_decided_on_its_own_page(
    orch: Server, scripted: ScriptedModel, page: Any, shots: Path
) -> None:
    with orch.client() as c:
        task = waiting_task(c, scripted, "List the workspace (from the task page)")
    page.goto(f"{orch.url}/#/agents/tasks/{task['id']}")
    pending = page.get_by_test_id("task-pending")
    expect(pending.get_by_test_id("pending-call")).to_contain_text("ls")
    # Arguments that are not a JSON object cannot be sent.
    pending.get_by_test_id("call-args").fill("[1, 2")
    expect(pending.get_by_test_id("approve")).to_be_disabled()
    pending.get_by_test_id("call-args").fill('{"path": "."}')
    page.screenshot(path=str(shots / "task-waiting.png"))
    pending.get_by_test_id("approve").click()
    detail = page.get_by_test_id("task-detail")
    expect(detail.locator(".badge").first).to_have_text("succeeded", timeout=30_000)
    expect(page.get_by_test_id("task-pending")).to_have_count(0)
    expect(detail.get_by_test_id("timeline-step")).to_have_count(2)


def test_the_header_badge_counts_pending_calls(orch: Server, scripted: ScriptedModel, page: Any) -> None:
    """A task waiting on three calls of one native turn counts 3, not 1; with a second task
    waiting on one call the badge reads 4, its name says what it counts, and it follows the
    calls as they are decided."""
    scripted.tool_models.add("native-tools")
    goal = scripted.script(
        "List three folders (one turn, three calls)",
        native(call("ls", path="."), call("ls", path="./"), call("ls", path="././")),
        {"content": "listed all three"},
    )
    with orch.client() as c:
        assert c.get(f"{API}/tasks?status=waiting").json() == []
        body = {"goal": goal, "tools": ["ls"], "model": "native-tools", "approvals": ASK_LS}
        three = c.post(f"{API}/tasks", json=body).json()
        three = wait_status(c, f"{API}/tasks/{three['id']}", "waiting")
        assert len(three["pending"]) == 3, three
        one = waiting_task(c, scripted, "List the workspace (the badge's second task)")
    page.goto(f"{orch.url}/#/playground")
    badge = page.get_by_test_id("approvals-count")
    expect(badge).to_have_text("4", timeout=15_000)
    link = page.get_by_role("link", name="Approvals: 4 calls waiting for a decision, in 2 tasks")
    expect(link).to_be_visible()
    expect(link).to_have_attribute("title", "Approvals: 4 calls waiting for a decision, in 2 tasks")
    # One of the three decided elsewhere (the API): the badge follows at its next poll.
    with orch.client() as c:
        r = c.post(f"{API}/tasks/{three['id']}/approve", json={"call_id": three["pending"][0]["call_id"]})
        assert r.status_code == 200, r.text
    expect(badge).to_have_text("3", timeout=15_000)
    expect(page.get_by_role("link", name="Approvals: 3 calls waiting for a decision, in 2 tasks")).to_be_visible()
    # The inbox tells the badge at once when it reloads; deciding everything there empties it.
    page.get_by_test_id("approvals-link").click()
    inbox = page.get_by_test_id("approvals")
    expect(inbox.get_by_test_id("approvals-summary")).to_contain_text("2 tasks waiting, 3 calls")
    for _ in range(3):
        inbox.get_by_test_id("approve").first.click()
        page.wait_for_timeout(300)
    expect(inbox.get_by_test_id("approvals-empty")).to_be_visible(timeout=30_000)
    expect(badge).to_have_count(0, timeout=15_000)
    expect(page.get_by_role("link", name="Approvals: no call waiting for a decision")).to_be_visible()
    with orch.client() as c:
        assert wait_status(c, f"{API}/tasks/{three['id']}", "succeeded")["result"] == "listed all three"
        wait_status(c, f"{API}/tasks/{one['id']}", "succeeded")
