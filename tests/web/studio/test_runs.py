"""Runs you can inspect (issue 21, item 3), in a real browser against an agent server whose
model is scripted (testsupport/scripted_model.py): the workflow graph drawn from the
definitions in the record (also after a reload), nodes that open their step's detail
(duration, attempts, output, the error with a caret under the code, the link to a task step's
task), skipped steps in their own colour, task steps as a timeline with durations and tokens,
rerun, and TOML definitions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import expect

from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import Server

API = "/api/v1/orchestration"
FINISHED = ("succeeded", "failed", "cancelled")


def wait_done(c: httpx.Client, path: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        rec = c.get(path).json()
        if rec["status"] in FINISHED or time.monotonic() > deadline:
            return rec
        time.sleep(0.2)


def test_a_reopened_workflow_draws_its_edges_and_its_steps_open(
    orch: Server, page: Any, shots: Path
) -> None:
    body = {
        "name": "inspect-me",
        "inputs": {"n": 4},
        "steps": [
            {"id": "range", "run": "range(1, inputs.n + 1)"},
            {"id": "total", "depends_on": ["range"], "run": "steps.range.result | sum"},
            {
                "id": "broken",
                "depends_on": ["range"],
                "retries": 1,
                "backoff_s": 0,
                "run": "let x = 1\nx + nope_not_defined",
            },
            {"id": "after", "depends_on": ["broken", "total"], "run": "1"},
        ],
    }
    with orch.client() as c:
        wf = c.post(f"{API}/workflows", json=body).json()
        done = wait_done(c, f"{API}/workflows/{wf['id']}")
    assert done["status"] == "failed"
    # Opened from its address alone (as after a reload): the edges come from the record.
    page.goto(f"{orch.url}/#/agents/workflows/{wf['id']}")
    dag = page.get_by_test_id("dag")
    expect(dag.locator("[data-node]")).to_have_count(4)
    expect(dag.locator("[data-edge]")).to_have_count(4)
    for edge in ("range->total", "range->broken", "broken->after", "total->after"):
        expect(dag.locator(f"[data-edge='{edge}']")).to_have_count(1)
    page.reload()
    expect(dag.locator("[data-edge]")).to_have_count(4)
    # Skipped is not drawn like running: its own badge tone and its own fill.
    expect(dag.locator("[data-node='after']")).to_have_attribute("data-status", "skipped")
    skipped_badge = page.locator("tr[data-step='after'] .badge")
    expect(skipped_badge).to_have_attribute("data-tone", "skipped")
    expect(skipped_badge).to_be_visible()
    expect(page.locator(".dag-legend .badge", has_text="skipped")).to_be_visible()
    running_look = page.evaluate(
        "() => { const b = document.createElement('span'); b.className = 'badge busy'; document.body.append(b);"
        " const c = getComputedStyle(b).color; b.remove(); return c; }"
    )
    assert skipped_badge.evaluate("e => getComputedStyle(e).color") != running_look
    skipped_fill = dag.locator("[data-node='after'] rect").evaluate("e => getComputedStyle(e).fill")
    done_fill = dag.locator("[data-node='total'] rect").evaluate("e => getComputedStyle(e).fill")
    assert skipped_fill != done_fill
    # A node is a button: it opens the step's detail, with its own address.
    dag.locator("[data-node='broken']").click()
    detail = page.get_by_test_id("step-detail")
    expect(detail).to_contain_text("broken")
    expect(page).to_have_url(f"{orch.url}/#/agents/workflows/{wf['id']}?step=broken")
    expect(detail.get_by_test_id("step-attempts")).to_contain_text("2 of 2")
    expect(detail.get_by_test_id("step-duration")).to_contain_text("ms")
    error = detail.get_by_test_id("run-error")
    expect(error).to_contain_text("nope_not_defined")
    expect(error.get_by_test_id("error-position")).to_contain_text("line 2")
    caret = error.get_by_test_id("caret")
    expect(caret).to_contain_text("2 | x + nope_not_defined")
    expect(caret).to_contain_text("^")
    page.screenshot(path=str(shots / "workflow-step-error.png"))
    # By the keyboard too; the output of a step that succeeded.
    dag.locator("[data-node='total']").focus()
    page.keyboard.press("Enter")
    expect(detail.get_by_test_id("step-output")).to_have_text("10")
    # The address survives a reload with the step open.
    page.reload()
    expect(page.get_by_test_id("step-detail").get_by_test_id("step-output")).to_have_text("10")
    # Run again: the same definition, a new workflow.
    page.get_by_test_id("rerun").click()
    expect(page).not_to_have_url(f"{orch.url}/#/agents/workflows/{wf['id']}")
    expect(page.get_by_test_id("dag").locator("[data-edge]")).to_have_count(4)
    expect(page.get_by_test_id("dag").locator("[data-node='after']")).to_have_attribute(
        "data-status", "skipped", timeout=30_000
    )
    new_id = page.url.rsplit("/", 1)[1]
    assert new_id != wf["id"] and new_id.startswith("wf_")
    with orch.client() as c:
        again = c.get(f"{API}/workflows/{new_id}").json()
    assert [s["definition"] for s in again["steps"]] == body["steps"]


def test_a_toml_definition_runs_and_its_errors_point_at_the_line(
    orch: Server, page: Any, shots: Path
) -> None:
    page.goto(f"{orch.url}/#/agents/workflows")
    definition = page.locator("textarea[name=definition]")
    definition.fill(
        'name = "toml-one"\n[inputs]\nn = 3\n\n[[steps]]\nid = "a"\nrun = "inputs.n * 2"\n\n[[steps]]\nid = "b"\ndepends_on = ["a"]\nrun = "steps.a.result + 1"\n'
    )
    expect(page.get_by_test_id("definition-format")).to_have_text("read as TOML")
    page.get_by_test_id("create-workflow").click()
    dag = page.get_by_test_id("dag")
    expect(dag.locator("[data-edge='a->b']")).to_have_count(1)
    expect(dag.locator("[data-node='b']")).to_have_attribute(
        "data-status", "succeeded", timeout=30_000
    )
    expect(page.locator("tr[data-step='b']")).to_contain_text("7")
    # A TOML mistake is shown where it is, before anything is sent.
    definition.fill('name = "bad"\n[[steps]]\nid = "a"\nrun = = "1"\n')
    page.get_by_test_id("create-workflow").click()
    err = page.locator("form[aria-label='New workflow']").get_by_test_id("run-error")
    expect(err).to_contain_text("TOML")
    expect(err.get_by_test_id("error-position")).to_contain_text("line 4")
    expect(err.get_by_test_id("caret")).to_contain_text('4 | run = = "1"')
    page.screenshot(path=str(shots / "workflow-toml-error.png"))
    # The examples: TOML runs as it is.
    page.get_by_role("button", name="TOML example").click()
    page.get_by_test_id("create-workflow").click()
    expect(page.get_by_test_id("dag").locator("[data-node='report']")).to_have_attribute(
        "data-status", "succeeded", timeout=30_000
    )


def test_a_task_step_links_to_its_task_and_shows_its_timeline(
    orch: Server, scripted: ScriptedModel, page: Any, shots: Path
) -> None:
    goal = "Count the entries in the workspace (studio timeline)"
    scripted.script(
        goal, tool("ls", path="."), tool("len", value=[1, 2, 3]), final("three entries")
    )
    body = {
        "name": "with-a-task",
        "steps": [
            {"id": "prep", "run": '"ready"'},
            {
                "id": "ask",
                "depends_on": ["prep"],
                "task": {"goal": goal, "tools": ["ls", "len"], "max_steps": 5},
            },
        ],
    }
    with orch.client() as c:
        wf = c.post(f"{API}/workflows", json=body).json()
        done = wait_done(c, f"{API}/workflows/{wf['id']}")
    assert done["status"] == "succeeded", done
    page.goto(f"{orch.url}/#/agents/workflows/{wf['id']}?step=ask")
    detail = page.get_by_test_id("step-detail")
    expect(detail.get_by_test_id("step-output")).to_contain_text("three entries")
    steps = detail.get_by_test_id("timeline-step")
    expect(steps).to_have_count(3)
    expect(steps.nth(0)).to_contain_text("ls")
    expect(steps.nth(0).get_by_test_id("step-tokens")).to_contain_text("15 tokens")
    expect(steps.nth(2)).to_contain_text("final answer")
    expect(detail.get_by_test_id("timeline-summary")).to_contain_text("45 tokens")
    page.screenshot(path=str(shots / "workflow-task-step.png"))
    detail.get_by_test_id("step-task-link").click()
    task = page.get_by_test_id("task-detail")
    expect(task).to_contain_text(goal)
    tsteps = task.get_by_test_id("timeline-step")
    expect(tsteps).to_have_count(3)
    # Each step is numbered once, with its duration.
    expect(tsteps.nth(0).locator(".tl-num")).to_have_text("1")
    expect(tsteps.nth(0).get_by_test_id("step-duration")).to_contain_text("ms")
    page.screenshot(path=str(shots / "task-timeline.png"))
