"""Deep links for every page and object, the 404 page, Back, tabs with arrow keys, and the
small things of issue 21 on these pages (pluralisation, empty lists, the editor's builtins)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import expect

from tests.web.studio.conftest import Servers

ORCH = "/api/v1/orchestration"
MODEL = "smollm2-135m-instruct"


def _need(servers: Servers, path: str) -> None:
    if httpx.get(servers.agent + path, timeout=30).status_code == 404:
        pytest.skip(f"this server answers 404 on {path}: the routes are not merged yet")


def _post(servers: Servers, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(servers.agent + path, json=body, timeout=60)
    assert r.status_code in (200, 201, 202), r.text
    return r.json()


def _open_and_reload(page: Any, url: str, check: Any) -> None:
    page.goto(url)
    check()
    page.reload()
    check()


def test_unknown_routes_show_the_404_page(servers: Servers, page: Any, shots: Path) -> None:
    page.goto(servers.agent + "/#/no-such-page")
    nf = page.get_by_test_id("not-found")
    expect(nf).to_contain_text("Page not found")
    expect(nf).to_contain_text("#/no-such-page")
    # Not the playground, silently: no page link is current, and the title says so.
    expect(page.locator(".cm-content")).to_have_count(0)
    expect(page.get_by_role("navigation", name="Pages").locator("[aria-current]")).to_have_count(0)
    assert page.title().startswith("Not found")
    page.screenshot(path=str(shots / "not-found.png"))
    # Its links lead to the pages.
    nf.get_by_role("link", name="Status").click()
    expect(page.get_by_test_id("inference-health")).to_be_visible()
    # Unknown sub-routes and objects are not found either.
    for route, text in [
        ("#/models/a/b", "Page not found"),
        ("#/chat/no-such-chat", "Chat not found"),
        ("#/models/no-such-model", "Model not found"),
        ("#/playground/extra", "Page not found"),
    ]:
        page.goto(f"{servers.agent}/{route}")
        expect(page.get_by_test_id("not-found")).to_contain_text(text)
    # A page the inference server alone does not serve.
    page.goto(servers.inference + "/#/agents")
    expect(page.get_by_test_id("not-found")).to_contain_text("does not serve that page")


def test_deep_links_to_models_and_chats_load_after_a_reload(servers: Servers, page: Any, shots: Path) -> None:
    url = f"{servers.agent}/#/models/{quote(MODEL, safe='')}"

    def model() -> None:
        detail = page.get_by_test_id("model-detail")
        expect(detail).to_contain_text(MODEL)
        expect(detail).to_contain_text("gguf")
        expect(detail.get_by_test_id("model-capabilities")).to_contain_text("chat")
        expect(page.locator(f"tr[data-model='{MODEL}'] a")).to_have_attribute("aria-current", "page")

    _open_and_reload(page, url, model)
    page.screenshot(path=str(shots / "models-detail.png"))
    # Links in the table lead to each model; the page's Models link to the list.
    page.goto(servers.agent + "/#/models")
    expect(page.get_by_test_id("model-detail")).to_have_count(0)
    page.locator(f"tr[data-model='{MODEL}'] a").click()
    expect(page).to_have_url(re.compile(f"#/models/{MODEL}$"))
    expect(page.get_by_test_id("model-detail")).to_contain_text(MODEL)


def test_deep_links_to_tasks_and_workflows_load_after_a_reload(servers: Servers, page: Any, shots: Path) -> None:
    _need(servers, f"{ORCH}/tasks")
    wf = _post(servers, f"{ORCH}/workflows", {"name": "linked-workflow", "steps": [{"id": "only", "run": "1 + 41"}]})

    def workflow() -> None:
        detail = page.get_by_test_id("workflow-detail")
        expect(detail).to_contain_text("linked-workflow")
        expect(detail.locator("[data-node='only']")).to_have_attribute("data-status", "succeeded", timeout=30_000)
        expect(page.get_by_role("tab", name="Workflows")).to_have_attribute("aria-selected", "true")
        expect(page.locator(f"[data-workflow='{wf['id']}']")).to_have_attribute("aria-current", "page")

    _open_and_reload(page, f"{servers.agent}/#/agents/workflows/{wf['id']}", workflow)
    page.screenshot(path=str(shots / "agents-workflow-link.png"))

    task = _post(servers, f"{ORCH}/tasks", {"goal": "A task opened by its link", "tools": ["len"], "max_steps": 1})
    httpx.post(f"{servers.agent}{ORCH}/tasks/{task['id']}/cancel", timeout=30)

    def task_detail() -> None:
        detail = page.get_by_test_id("task-detail")
        expect(detail).to_contain_text("A task opened by its link")
        expect(detail).to_contain_text(task["id"])
        expect(page.get_by_role("tab", name="Tasks")).to_have_attribute("aria-selected", "true")

    _open_and_reload(page, f"{servers.agent}/#/agents/tasks/{task['id']}", task_detail)
    page.screenshot(path=str(shots / "agents-task-link.png"))
    # Objects that do not exist.
    page.goto(f"{servers.agent}/#/agents/tasks/no-such-task")
    expect(page.get_by_test_id("not-found")).to_contain_text("Task not found")
    page.goto(f"{servers.agent}/#/agents/workflows/no-such-workflow")
    expect(page.get_by_test_id("not-found")).to_contain_text("Workflow not found")
    page.goto(f"{servers.agent}/#/agents/nonsense")
    expect(page.get_by_test_id("not-found")).to_contain_text("Page not found")


def test_deep_links_to_marketplace_agents_load_after_a_reload(servers: Servers, page: Any, shots: Path) -> None:
    _need(servers, "/api/v1/marketplace/agents")
    agents = httpx.get(servers.agent + "/api/v1/marketplace/agents", timeout=30).json()
    name = agents[-1]["name"]

    def agent() -> None:
        detail = page.get_by_test_id("market-detail")
        expect(detail).to_contain_text(name)
        expect(detail).to_contain_text(agents[-1]["description"])

    _open_and_reload(page, f"{servers.agent}/#/marketplace/{name}", agent)
    page.screenshot(path=str(shots / "marketplace-link.png"))
    page.goto(f"{servers.agent}/#/marketplace/no-such-agent")
    expect(page.get_by_test_id("not-found")).to_contain_text("Agent not found")
    # The Publish tab has its own link.
    _open_and_reload(
        page,
        f"{servers.agent}/#/marketplace?tab=publish",
        lambda: expect(page.get_by_role("tab", name="Publish")).to_have_attribute("aria-selected", "true"),
    )


def test_back_returns_to_the_previous_page_tab_and_object(servers: Servers, page: Any) -> None:
    page.goto(servers.agent + "/#/status")
    expect(page.get_by_test_id("inference-health")).to_be_visible()
    nav = page.get_by_role("navigation", name="Pages")
    nav.get_by_role("link", name="Models").click()
    expect(page.get_by_test_id("models-table")).to_be_visible()
    page.locator(f"tr[data-model='{MODEL}'] a").click()
    expect(page.get_by_test_id("model-detail")).to_be_visible()
    page.go_back()
    expect(page).to_have_url(re.compile("#/models$"))
    expect(page.get_by_test_id("model-detail")).to_have_count(0)
    page.go_back()
    expect(page).to_have_url(re.compile("#/status$"))
    expect(page.get_by_test_id("inference-health")).to_be_visible()
    page.go_forward()
    expect(page.get_by_test_id("models-table")).to_be_visible()
    if httpx.get(servers.agent + f"{ORCH}/agents", timeout=30).status_code == 404:
        return
    # Tabs are history entries too.
    nav.get_by_role("link", name="Agents").click()
    expect(page.get_by_role("tab", name="Tasks")).to_have_attribute("aria-selected", "true")
    page.get_by_role("tab", name="Workflows").click()
    expect(page).to_have_url(re.compile("#/agents/workflows$"))
    page.go_back()
    expect(page.get_by_role("tab", name="Tasks")).to_have_attribute("aria-selected", "true")
    expect(page.locator("textarea[name=goal]")).to_be_visible()
    page.go_back()
    expect(page.get_by_test_id("models-table")).to_be_visible()


def test_tabs_are_tab_panels_moved_through_with_arrow_keys(servers: Servers, page: Any, shots: Path) -> None:
    _need(servers, f"{ORCH}/agents")
    page.goto(servers.agent + "/#/agents")
    tablist = page.get_by_role("tablist", name="Orchestration")
    tabs = tablist.get_by_role("tab")
    expect(tabs).to_have_text(["Tasks", "Workflows", "Approvals", "Agents & metrics"])
    panel = page.get_by_role("tabpanel")
    expect(panel).to_have_count(1)

    def selected(name: str, url: str) -> None:
        tab = tablist.get_by_role("tab", name=name)
        expect(tab).to_have_attribute("aria-selected", "true")
        expect(tab).to_be_focused()
        # Only the selected tab is in the Tab order; the panel is labelled by it and it
        # controls the panel.
        expect(tablist.locator("[tabindex='0']")).to_have_count(1)
        expect(tab).to_have_attribute("tabindex", "0")
        tab_id = tab.get_attribute("id")
        expect(panel).to_have_attribute("aria-labelledby", tab_id)
        expect(tab).to_have_attribute("aria-controls", panel.get_attribute("id"))
        expect(page).to_have_url(re.compile(url))

    tablist.get_by_role("tab", name="Tasks").focus()
    page.keyboard.press("ArrowRight")
    selected("Workflows", "#/agents/workflows$")
    expect(panel.locator("textarea[name=definition]")).to_be_visible()
    page.keyboard.press("ArrowRight")
    selected("Approvals", "#/agents/approvals$")
    expect(panel.get_by_test_id("approvals")).to_be_visible()
    page.keyboard.press("ArrowRight")
    selected("Agents & metrics", "#/agents/agents$")
    expect(panel.get_by_test_id("metrics")).to_be_visible()
    page.keyboard.press("ArrowRight")  # wraps around
    selected("Tasks", "#/agents/tasks$")
    page.keyboard.press("ArrowLeft")  # and back
    selected("Agents & metrics", "#/agents/agents$")
    page.keyboard.press("Home")
    selected("Tasks", "#/agents/tasks$")
    page.keyboard.press("End")
    selected("Agents & metrics", "#/agents/agents$")
    page.screenshot(path=str(shots / "agents-tabs.png"))
    # Tab leaves the tablist for the panel's content.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.getAttribute('role')") != "tab"
    # The marketplace's tabs work the same way.
    if httpx.get(servers.agent + "/api/v1/marketplace/agents", timeout=30).status_code != 404:
        page.goto(servers.agent + "/#/marketplace")
        market = page.get_by_role("tablist", name="Marketplace")
        market.get_by_role("tab", name="Browse").focus()
        page.keyboard.press("ArrowRight")
        expect(market.get_by_role("tab", name="Publish")).to_be_focused()
        expect(page.locator("#pub-name")).to_be_visible()
        expect(page).to_have_url(re.compile(r"#/marketplace\?tab=publish$"))


def test_task_page_lists_numbers_steps_once_and_says_when_empty(servers: Servers, page: Any) -> None:
    _need(servers, f"{ORCH}/agents")
    # An empty task list says so (the list is answered empty here).
    page.route(re.compile(r".*/api/v1/orchestration/tasks$"), lambda r: r.fulfill(json=[]) if r.request.method == "GET" else r.continue_())
    page.goto(servers.agent + "/#/agents/tasks")
    expect(page.get_by_test_id("empty-tasks")).to_contain_text("No tasks yet")
    # The agent picker names the default agent once.
    agents = httpx.get(servers.agent + f"{ORCH}/agents", timeout=30).json()
    options = page.locator("select[name=agent] option").all_inner_texts()
    assert [o for o in options if "default" in o.lower()] == (["default"] if any(a["id"] == "default" for a in agents) else ["(server default)"])
    # Steps are numbered by the list only ("1. ls", not "1. 0. ls").
    page.unroute(re.compile(r".*/api/v1/orchestration/tasks$"))
    steps = [{"index": 0, "action": "ls", "args": {"path": "."}, "observation": "a b"}, {"index": 1, "action": "len", "args": {}, "observation": 2}]
    task = {"id": "t-steps", "goal": "count", "tools": ["ls", "len"], "max_steps": 3, "status": "succeeded", "steps": steps, "result": 2}
    page.route(re.compile(r".*/api/v1/orchestration/tasks/t-steps$"), lambda r: r.fulfill(json=task))
    page.goto(servers.agent + "/#/agents/tasks/t-steps")
    items = page.get_by_test_id("timeline-step")
    expect(items).to_have_count(2)
    assert items.first.locator("strong").inner_text() == "ls"
    assert items.evaluate_all("els => els.map(e => e.value)") == [1, 2]


def test_counts_are_pluralised(servers: Servers, page: Any) -> None:
    page.goto(servers.agent + "/#/status")
    health = page.get_by_test_id("inference-health")
    expect(health).to_contain_text("loaded")
    text = health.inner_text()
    assert not re.search(r"\b1 models\b|\b1 requests\b", text), text
    assert re.search(r"\b(1 model|\d+ models) loaded", text), text
    page.goto(servers.agent + "/#/models")
    expect(page.get_by_test_id("storage-stats")).to_contain_text("model")
    assert not re.search(r"\b1 models\b", page.get_by_test_id("storage-stats").inner_text())


def test_the_editor_colours_builtins_and_logs_no_warning(servers: Servers, page: Any) -> None:
    warnings: list[str] = []
    page.on("console", lambda m: warnings.append(m.text) if m.type in ("warning", "error") else None)
    page.goto(servers.agent + "/#/playground")
    expect(page.locator(".builtin-list li").first).to_be_visible()
    page.locator(".cm-content").click()
    page.keyboard.press("Control+End")
    page.keyboard.insert_text("\nsum([1, 2])")
    token = page.locator(".cm-line span", has_text=re.compile("^sum$")).first
    expect(token).to_be_visible()
    colour = token.evaluate("el => getComputedStyle(el).color")
    expected = page.evaluate(
        "() => { const d = document.createElement('span'); d.style.color = 'var(--hl-function)';"
        " document.body.append(d); const c = getComputedStyle(d).color; d.remove(); return c; }"
    )
    assert colour == expected, (colour, expected)
    time.sleep(0.3)
    assert not [w for w in warnings if "used at start of tag" in w or "highlighting tag" in w], warnings
