"""The small ones of issue 35 (item 8), each in a real browser against the real servers: the
chat form refuses max_tokens −3 itself (an accessible error on the field, Send off, nothing
sent); a new chat takes the system prompt just typed in the previous one; a task opened from a
workflow step links back to its workflow and step."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.web.studio.conftest import Servers
from tests.web.studio.test_accessibility import AXE
from testsupport.scripted_model import ScriptedModel, final
from testsupport.servers import Server

API = "/api/v1/orchestration"
MODEL = "smollm2-135m-instruct"


def _serious(page: Any) -> list[str]:
    if not AXE.exists():
        return []  # axe-core not installed (npm ci in ui/): test_accessibility says so
    page.add_script_tag(content=AXE.read_text(encoding="utf-8"))
    found = page.evaluate(
        """async () => (await axe.run(document, {resultTypes: ['violations']})).violations
            .filter(v => ['serious', 'critical'].includes(v.impact)).map(v => v.id + ': ' + v.help)"""
    )
    return list(found)


def test_the_chat_form_refuses_max_tokens_minus_three(servers: Servers, browser: Any, shots: Path) -> None:
    # axe is injected by the test; the studio's CSP allows only its own scripts.
    context = browser.new_context(viewport={"width": 1280, "height": 800}, bypass_csp=True)
    page = context.new_page()
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if r.url.endswith("/v1/chat/completions") else None)
    try:
        page.goto(servers.agent + "/#/chat")
        send = page.get_by_test_id("send")
        expect(send).to_be_enabled(timeout=20_000)
        field = page.get_by_label("Max tokens")
        field.fill("-3")
        error = page.get_by_test_id("chat-max-tokens-error")
        expect(error).to_have_text("Max tokens must be from 1 to 32,768; -3 is not.")
        expect(error).to_have_attribute("role", "alert")
        expect(field).to_have_attribute("aria-invalid", "true")
        expect(field).to_have_attribute("aria-describedby", "chat-max-tokens-error")
        # The field's accessible description is the error.
        assert field.evaluate("el => document.getElementById(el.getAttribute('aria-describedby')).textContent") \
            == "Max tokens must be from 1 to 32,768; -3 is not."
        expect(send).to_be_disabled()
        expect(page.get_by_test_id("chat-invalid")).to_contain_text("Max tokens must be from 1 to 32,768")
        page.get_by_test_id("chat-input").fill("Hello?")
        page.get_by_test_id("chat-input").press("Enter")  # Enter sends, but not now
        page.wait_for_timeout(500)
        assert not sent, sent
        expect(page.get_by_test_id("msg-user")).to_have_count(0)
        assert not _serious(page)
        page.screenshot(path=str(shots / "chat-max-tokens-refused.png"))
        # Not a whole number, nor empty, either.
        field.fill("2.5")
        expect(error).to_have_text("Max tokens must be a whole number from 1 to 32,768.")
        field.fill("")
        expect(error).to_have_text("Max tokens must be a number from 1 to 32,768.")
        # Mended: the error is gone, and what is sent carries the value.
        field.fill("8")
        expect(error).to_have_count(0)
        expect(field).not_to_have_attribute("aria-invalid", "true")
        with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as req:
            page.get_by_test_id("chat-input").press("Enter")
        assert json.loads(req.value.post_data or "{}")["max_tokens"] == 8
        expect(page.get_by_test_id("msg-assistant")).to_have_attribute("data-status", "done", timeout=120_000)
        # Top P is checked the same way.
        top_p = page.get_by_label("Top P")
        top_p.fill("1.5")
        expect(page.get_by_test_id("chat-top-p-error")).to_have_text("Top P must be from 0 to 1; 1.5 is not.")
        expect(send).to_be_disabled()
        top_p.fill("0.9")
        expect(send).to_be_enabled()
    finally:
        context.close()


def test_a_new_chat_takes_the_system_prompt_just_typed(servers: Servers, page: Any, shots: Path) -> None:
    page.goto(servers.agent + "/#/chat")
    expect(page.get_by_test_id("send")).to_be_enabled(timeout=20_000)
    page.get_by_label("Max tokens").fill("8")
    page.get_by_test_id("chat-input").fill("First chat.")
    page.get_by_test_id("chat-input").press("Enter")
    expect(page).to_have_url(re.compile(r"#/chat/c"))
    expect(page.get_by_test_id("msg-assistant")).to_have_attribute("data-status", "done", timeout=120_000)
    # In the kept chat, a system prompt is typed; then a new chat.
    system = page.get_by_label("System prompt")
    system.fill("You are a pirate. Answer in one word.")
    page.get_by_test_id("new-chat").click()
    expect(page).to_have_url(re.compile(r"#/chat$"))
    expect(page.get_by_test_id("chat-title")).to_have_text("New chat")
    expect(system).to_have_value("You are a pirate. Answer in one word.")
    expect(page.get_by_label("Max tokens")).to_have_value("8")
    with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as req:
        page.get_by_test_id("chat-input").fill("Who are you?")
        page.get_by_test_id("chat-input").press("Enter")
    body = json.loads(req.value.post_data or "{}")
    assert body["messages"][0] == {"role": "system", "content": "You are a pirate. Answer in one word."}, body
    expect(page.get_by_test_id("msg-assistant")).to_have_attribute("data-status", "done", timeout=120_000)
    # After a reload too (the new chat is kept with it).
    page.reload()
    expect(page.get_by_label("System prompt")).to_have_value("You are a pirate. Answer in one word.")
    page.screenshot(path=str(shots / "chat-new-takes-system-prompt.png"))


def test_a_task_opened_from_a_workflow_step_links_back(
    orch: Server, scripted: ScriptedModel, page: Any, shots: Path
) -> None:
    goal = scripted.script("Say done (a workflow's task step)", final("done"))
    body = {"name": "link-back", "steps": [
        {"id": "prep", "run": '"ready"'},
        {"id": "ask", "depends_on": ["prep"], "task": {"goal": goal, "tools": [], "max_steps": 2}},
    ]}
    with orch.client() as c:
        wf = c.post(f"{API}/workflows", json=body).json()
        deadline = time.monotonic() + 60
        while (rec := c.get(f"{API}/workflows/{wf['id']}").json())["status"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert rec["status"] == "succeeded", rec
    task_id = next(s["task_id"] for s in rec["steps"] if s["id"] == "ask")
    page.goto(f"{orch.url}/#/agents/workflows/{wf['id']}?step=ask")
    page.get_by_test_id("step-detail").get_by_test_id("step-task-link").click()
    expect(page).to_have_url(re.compile(rf"#/agents/tasks/{task_id}\?workflow={wf['id']}$"))
    back = page.get_by_test_id("task-workflow-link")
    expect(back).to_have_text("ask of workflow link-back")
    expect(page.get_by_test_id("task-workflow")).to_have_text("Started by step ask of workflow link-back")
    page.screenshot(path=str(shots / "task-links-back-to-workflow.png"))
    back.click()
    expect(page).to_have_url(re.compile(rf"#/agents/workflows/{wf['id']}\?step=ask$"))
    expect(page.get_by_test_id("step-detail")).to_contain_text("agent task")
    # A task of a workflow opened from the task list (its address names no workflow) is
    # found among the workflows all the same; a task of none says nothing of one.
    page.goto(f"{orch.url}/#/agents/tasks/{task_id}")
    expect(page.get_by_test_id("task-workflow-link")).to_have_attribute(
        "href", f"#/agents/workflows/{wf['id']}?step=ask")
    with orch.client() as c:
        alone = c.post(f"{API}/tasks", json={"goal": goal, "tools": [], "max_steps": 2}).json()
    page.goto(f"{orch.url}/#/agents/tasks/{alone['id']}")
    expect(page.get_by_test_id("task-detail")).to_contain_text(goal)
    page.wait_for_load_state("networkidle")
    expect(page.get_by_test_id("task-workflow")).to_have_count(0)
    # A workflow named in the address that did not start this task is not believed.
    page.goto(f"{orch.url}/#/agents/tasks/{alone['id']}?workflow={wf['id']}")
    expect(page.get_by_test_id("task-detail")).to_contain_text(goal)
    page.wait_for_load_state("networkidle")
    expect(page.get_by_test_id("task-workflow")).to_have_count(0)
    assert httpx.get(f"{orch.url}{API}/tasks/{alone['id']}", timeout=10).status_code == 200
