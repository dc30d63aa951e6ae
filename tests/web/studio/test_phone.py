"""On a phone (390 x 844; issue 35, item 6): the open object (a chat, a task, a workflow, a
model) takes the screen with its list one tap away; a chat's message box is on screen from the
start (before, with nine conversations it began below the screen) and stays there; opening a
workflow brings its detail into view (before, it opened under the form and the list, with
nothing visible changing), at desktop width too when the list was scrolled."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.web.studio.conftest import Servers
from testsupport.scripted_model import ScriptedModel, final
from testsupport.servers import Server

PHONE = {"width": 390, "height": 844}
API = "/api/v1/orchestration"
MODEL = "smollm2-135m-instruct"

# Nine chats kept in this browser, the first a long one (40 messages).
_SEED_NINE = r"""async () => {
    const db = await new Promise((ok, no) => {
        const r = indexedDB.open("conch-studio", 1);
        r.onupgradeneeded = () => r.result.createObjectStore("chats", { keyPath: "id" });
        r.onsuccess = () => ok(r.result); r.onerror = () => no(r.error);
    });
    const at = Date.now();
    const chats = [];
    for (let c = 0; c < 9; c++) {
        const n = c === 0 ? 40 : 2 + c;
        const messages = [];
        for (let i = 0; i < n; i++)
            messages.push({ id: `m${c}-${i}`, role: i % 2 ? "assistant" : "user", at: at - (n - i) * 1000,
                status: i % 2 ? "done" : undefined,
                content: i % 2 ? `Answer ${i} of chat ${c}: ` + "a fairly long line of text. ".repeat(6) : `Question ${i} of chat ${c}?` });
        chats.push({ id: `phone-chat-${c}`, title: `Conversation number ${c + 1}`, created: at - c, updated: at - c,
            settings: { model: "", system: "", temperature: 0.7, maxTokens: 16, topP: 1 }, messages });
    }
    await new Promise((ok, no) => {
        const tx = db.transaction("chats", "readwrite");
        for (const chat of chats) tx.objectStore("chats").put(chat);
        tx.oncomplete = ok; tx.onerror = () => no(tx.error);
    });
}"""


@pytest.fixture()
def phone(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    context.close()
    assert not errors, errors


def _on_screen(page: Any, locator: Any) -> None:
    """Wholly within the viewport (not below the screen, not under the sticky header)."""
    expect(locator).to_be_visible()
    box = locator.bounding_box()
    header = page.locator("header.top").bounding_box()
    assert box is not None and header is not None
    assert box["y"] >= header["y"] + header["height"] - 1, (box, header)
    assert box["y"] + box["height"] <= PHONE["height"] + 1, box
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] + 1, box


def _page_does_not_scroll(page: Any) -> None:
    sizes = page.evaluate("[document.documentElement.scrollHeight, innerHeight, document.documentElement.scrollWidth]")
    assert sizes[0] <= sizes[1] + 1, f"the page scrolls: {sizes}"
    assert sizes[2] <= PHONE["width"], sizes


def test_a_chat_takes_the_screen_with_its_message_box_and_its_list_a_tap_away(
    servers: Servers, phone: Any, shots: Path
) -> None:
    page = phone
    page.goto(servers.agent + "/#/models")
    page.evaluate(_SEED_NINE)
    page.goto(servers.agent + "/#/chat/phone-chat-0")
    page.reload()  # read from storage by a new document
    expect(page.locator("[data-testid=messages] article").last).to_contain_text("Answer 39 of chat 0")
    # The message box and Send are on screen from the start; the chat itself (not the page)
    # scrolls; the list is not in the way.
    _on_screen(page, page.get_by_test_id("chat-input"))
    _on_screen(page, page.get_by_test_id("send"))
    _on_screen(page, page.locator("[data-testid=messages] article").last)
    expect(page.get_by_test_id("chat-list")).to_be_hidden()
    _page_does_not_scroll(page)
    page.screenshot(path=str(shots / "phone-chat-nine.png"))
    # Scrolled up through the messages, the box stays put.
    page.get_by_test_id("messages").evaluate("el => el.scrollTop = 0")
    expect(page.locator("[data-testid=messages] article").first).to_contain_text("Question 0 of chat 0")
    _on_screen(page, page.get_by_test_id("chat-input"))
    # The settings fold above the messages; opened, the box is still on screen.
    page.locator(".chat-settings summary").tap()
    expect(page.get_by_label("Max tokens")).to_be_visible()
    _on_screen(page, page.get_by_test_id("chat-input"))
    page.locator(".chat-settings summary").tap()

    # The list: one tap away, and a tap on a chat opens it in its place.
    opener = page.get_by_test_id("open-chat-list")
    expect(opener).to_have_text("☰ Chats (9)")
    opener.tap()
    listed = page.get_by_test_id("chat-list").locator("a.chat-link")
    expect(listed).to_have_count(9)
    expect(page.get_by_test_id("chat-input")).to_be_hidden()
    page.screenshot(path=str(shots / "phone-chat-list.png"))
    listed.filter(has_text="Conversation number 5").tap()
    expect(page).to_have_url(re.compile(r"#/chat/phone-chat-4$"))
    expect(page.get_by_test_id("chat-list")).to_be_hidden()
    _on_screen(page, page.get_by_test_id("chat-input"))
    # Back to the chat without choosing another.
    page.get_by_test_id("open-chat-list").tap()
    page.get_by_test_id("close-chat-list").tap()
    _on_screen(page, page.get_by_test_id("chat-input"))
    expect(page).to_have_url(re.compile(r"#/chat/phone-chat-4$"))

    # A new chat: its box is on screen too, and an answer streams with the box still there.
    page.get_by_test_id("open-chat-list").tap()
    page.get_by_test_id("new-chat").tap()
    expect(page).to_have_url(re.compile(r"#/chat$"))
    _on_screen(page, page.get_by_test_id("chat-input"))
    expect(page.get_by_test_id("send")).to_be_enabled(timeout=20_000)
    page.get_by_test_id("chat-input").fill("Say hello.")
    page.get_by_test_id("send").tap()
    expect(page.get_by_test_id("msg-assistant")).to_have_count(1)
    expect(page.get_by_test_id("msg-assistant")).to_have_attribute("data-status", "done", timeout=120_000)
    _on_screen(page, page.get_by_test_id("chat-input"))
    _page_does_not_scroll(page)
    page.screenshot(path=str(shots / "phone-chat-answered.png"))


def _wait(c: httpx.Client, path: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while (rec := c.get(path).json())["status"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, rec
        time.sleep(0.2)
    return rec  # type: ignore[no-any-return]


def test_an_open_task_workflow_or_model_takes_the_screen(
    orch: Server, scripted: ScriptedModel, servers: Servers, phone: Any, shots: Path
) -> None:
    page = phone
    goal = scripted.script("Answer at once (phone)", final("done"))
    with orch.client() as c:
        task = c.post(f"{API}/tasks", json={"goal": goal, "tools": [], "max_steps": 2}).json()
        _wait(c, f"{API}/tasks/{task['id']}")
        wf = c.post(f"{API}/workflows", json={"name": "phone-flow", "steps": [
            {"id": "one", "run": "1"}, {"id": "two", "depends_on": ["one"], "run": "steps.one.result + 1"}]}).json()
        _wait(c, f"{API}/workflows/{wf['id']}")

    # A workflow opened from the list: its detail in view, the form and the list gone, and the
    # list back with one tap.
    page.goto(orch.url + "/#/agents/workflows")
    item = page.get_by_test_id("workflow-list").locator(f"[data-workflow='{wf['id']}']")
    item.scroll_into_view_if_needed()
    item.tap()
    detail = page.get_by_test_id("workflow-detail")
    expect(detail.get_by_test_id("dag")).to_be_visible()
    _on_screen(page, detail.locator("h2"))
    expect(page.get_by_test_id("workflow-list")).to_be_hidden()
    expect(page.get_by_role("form", name="New workflow")).to_be_hidden()
    page.screenshot(path=str(shots / "phone-workflow-open.png"))
    # A step's detail, opened from the step table below the graph, comes into view too.
    detail.locator("tr[data-step='two'] a").tap()
    _on_screen(page, page.get_by_test_id("step-detail").locator("h3"))
    back = detail.get_by_test_id("back-to-list")
    expect(back).to_have_text("← All workflows")
    back.tap()
    expect(page.get_by_test_id("workflow-list")).to_be_visible()
    expect(page.get_by_test_id("workflow-detail")).to_have_count(0)

    # A workflow run from the form at the top: its detail replaces the form and is in view.
    page.get_by_role("button", name="JSON example").tap()
    page.get_by_test_id("create-workflow").tap()
    _on_screen(page, page.get_by_test_id("workflow-detail").locator("h2"))
    expect(page.get_by_test_id("workflow-detail").locator("h2")).to_have_text("numbers")

    # A task, the same way.
    page.goto(orch.url + "/#/agents/tasks")
    page.get_by_test_id("task-list").locator(f"[data-task='{task['id']}']").tap()
    tdetail = page.get_by_test_id("task-detail")
    _on_screen(page, tdetail.locator("h2"))
    expect(page.get_by_test_id("task-list")).to_be_hidden()
    page.screenshot(path=str(shots / "phone-task-open.png"))
    tdetail.get_by_test_id("back-to-list").tap()
    expect(page.get_by_test_id("task-list")).to_be_visible()

    # A model: its record takes the screen; Close is the way back to the store.
    page.goto(servers.agent + "/#/models")
    page.get_by_test_id("models-table").locator(f"[data-model='{MODEL}'] a").first.tap()
    record = page.get_by_test_id("model-detail")
    _on_screen(page, record.locator("h2"))
    expect(page.get_by_test_id("models-table")).to_be_hidden()
    page.screenshot(path=str(shots / "phone-model-open.png"))
    record.get_by_test_id("back-to-list").tap()
    expect(page.get_by_test_id("models-table")).to_be_visible()


def test_a_workflow_opened_far_down_the_list_comes_into_view_at_desktop_width(
    orch: Server, page: Any, shots: Path
) -> None:
    with orch.client() as c:
        ids = [c.post(f"{API}/workflows", json={"name": f"many-{i}", "steps": [{"id": "s", "run": str(i)}]}).json()["id"]
               for i in range(30)]
        _wait(c, f"{API}/workflows/{ids[0]}")
    page.goto(orch.url + "/#/agents/workflows")
    first = page.get_by_test_id("workflow-list").locator(f"[data-workflow='{ids[0]}']")
    first.scroll_into_view_if_needed()  # the oldest of them: the list is scrolled down to it
    assert page.evaluate("scrollY") > 200 or page.evaluate(
        "document.querySelector('[data-testid=workflow-list]').scrollTop") > 0
    first.click()
    heading = page.get_by_test_id("workflow-detail").locator("h2")
    expect(heading).to_have_text("many-0")
    box = heading.bounding_box()
    assert box is not None and 0 < box["y"] < 800 - box["height"], box
    page.screenshot(path=str(shots / "workflow-opened-from-far-down.png"))
