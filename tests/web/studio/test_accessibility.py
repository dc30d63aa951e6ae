"""Phone and accessibility (issue 21, item 7): axe-core finds no serious or critical violation
on any page, at 1440x900, at 390x844 and in dark mode (1440x900), including a chat with
messages (a finished, a failed, a cut-off and a stopped answer), a task with steps and a task
waiting for a person, and the approvals inbox with it; at 390 px the page never scrolls sideways (tables and
graphs scroll inside their own box), every header link can be reached, and every control has a
name. axe-core is the npm package (a devDependency of ui/): the test reads
ui/node_modules/axe-core/axe.min.js and skips, naming why, when `npm ci` has not been run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.web.studio.conftest import Servers
from testsupport.scripted_model import ScriptedModel, final, tool
from testsupport.servers import Server

AXE = Path(__file__).resolve().parents[3] / "ui" / "node_modules" / "axe-core" / "axe.min.js"
API = "/api/v1/orchestration"
DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}
DARK = {**DESKTOP, "dark": True}  # the system's dark scheme, which the studio follows

# Every page and the sub-routes that matter; "workflow" and "model" are filled in from objects
# made (or found) on the servers, so the DAG, the step table and a model's record are checked too.
ROUTES = [
    "playground",
    "chat",
    "chat-messages",
    "models",
    "model",
    "agents/tasks",
    "task",
    "task-waiting",
    "agents/workflows",
    "workflow",
    "agents/approvals",
    "approvals-waiting",
    "agents/agents",
    "marketplace",
    "status",
    "no-such-page",
]


@pytest.fixture(scope="module")
def axe_source() -> str:
    if not AXE.exists():
        pytest.skip(f"axe-core is not installed: no {AXE} (run `cd ui && npm ci`)")
    return AXE.read_text(encoding="utf-8")


# A chat kept in the browser (IndexedDB, as the studio stores it) with an answer of each
# kind: finished (Markdown: a heading, a list, a table, code, a link), failed, cut off (left
# "streaming" by a closed page) and stopped.
_SEED_CHAT = r"""async () => {
    const db = await new Promise((ok, no) => {
        const r = indexedDB.open("conch-studio", 1);
        r.onupgradeneeded = () => r.result.createObjectStore("chats", { keyPath: "id" });
        r.onsuccess = () => ok(r.result); r.onerror = () => no(r.error);
    });
    const at = Date.now(), stats = "42 tokens · 12.3 tokens/s · first token 120 ms";
    const messages = [
        { id: "m0", role: "user", at, content: "How do I sort a table by size?" },
        { id: "m1", role: "assistant", at, status: "done", model: "smollm2", stats, content:
            "## Sorting\n\nUse `sort_by`:\n\n```\nls() | sort_by(\"size\")\n```\n\n"
            + "- **first** point\n- second, see [the docs](https://example.org/docs)\n\n"
            + "| name | size |\n|---|---|\n| a | 1 |\n| b | 2 |\n\n> quoted" },
        { id: "m2", role: "user", at, content: "And in reverse?" },
        { id: "m3", role: "assistant", at, status: "failed", model: "broken", content: "",
            error: "500 · the model could not be loaded" },
        { id: "m4", role: "user", at, content: "Are you there?" },
        { id: "m5", role: "assistant", at, status: "streaming", model: "smollm2", content: "Yes, I am" },
        { id: "m6", role: "user", at, content: "Count to ten." },
        { id: "m7", role: "assistant", at, status: "stopped", model: "smollm2", stats: stats + " · stopped",
            content: "1, 2, 3" },
    ];
    const chat = { id: "a11y-chat", title: "Sorting a table", created: at, updated: at,
        settings: { model: "", system: "", temperature: 0.7, maxTokens: 256, topP: 1 }, messages };
    await new Promise((ok, no) => {
        const tx = db.transaction("chats", "readwrite"); tx.objectStore("chats").put(chat);
        tx.oncomplete = ok; tx.onerror = () => no(tx.error);
    });
}"""


def _wait(c: httpx.Client, path: str, *status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while (rec := c.get(path).json())["status"] not in status:
        assert time.monotonic() < deadline, f"{path} is {rec['status']}, not {status}"
        time.sleep(0.2)
    return rec  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def objects(servers: Servers, orch: Server, scripted: ScriptedModel) -> dict[str, str]:
    """A finished workflow (so its graph and step table are drawn), a model id, and on the
    orchestration server driven by a scripted model, a finished task with steps (a call, a
    call that failed, the answer) and a task waiting for a person (addresses with their server)."""
    found: dict[str, str] = {}
    with httpx.Client(base_url=servers.agent, timeout=30) as c:
        if c.get(f"{API}/workflows").status_code != 404:
            body = {
                "name": "a11y-diamond",
                "inputs": {"n": 3},
                "steps": [
                    {"id": "range", "run": "range(1, inputs.n + 1)"},
                    {"id": "squares", "depends_on": ["range"], "run": "steps.range.result | map(fn(x) => x * x)"},
                    {"id": "total", "depends_on": ["range"], "run": "steps.range.result | sum"},
                    {"id": "a-long-step-name-report", "depends_on": ["squares", "total"], "run": '"done"'},
                ],
            }
            wf = c.post(f"{API}/workflows", json=body).json()
            deadline = time.monotonic() + 60
            while c.get(f"{API}/workflows/{wf['id']}").json()["status"] not in ("succeeded", "failed", "cancelled"):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            found["workflow"] = f"agents/workflows/{wf['id']}"
    models = httpx.get(servers.inference + "/v1/models", timeout=30).json().get("data", [])
    if models:
        found["model"] = f"models/{models[0]['id']}"
    with orch.client() as c:
        goal = scripted.script(
            "List the workspace, then read a file that is not there",
            tool("ls", path="."), tool("ls", path="no/such/folder"), final("The workspace is empty."),
        )
        task = c.post(f"{API}/tasks", json={"goal": goal, "tools": ["ls"], "max_steps": 5}).json()
        _wait(c, f"{API}/tasks/{task['id']}", "succeeded", "failed")
        found["task"] = f"{orch.url}/#/agents/tasks/{task['id']}"
        goal = scripted.script("List the workspace (waits for a person)", tool("ls", path="."), final("listed"))
        body = {"goal": goal, "tools": ["ls"], "max_steps": 4, "approvals": {"tools": {"ls": "ask"}}}
        waiting = c.post(f"{API}/tasks", json=body).json()
        _wait(c, f"{API}/tasks/{waiting['id']}", "waiting")
        found["task-waiting"] = f"{orch.url}/#/agents/tasks/{waiting['id']}"
        found["approvals-waiting"] = f"{orch.url}/#/agents/approvals"
    return found


def _open(page: Any, servers: Servers, objects: dict[str, str], route: str) -> None:
    if route == "chat-messages":
        page.goto(f"{servers.agent}/#/models")
        page.evaluate(_SEED_CHAT)
        route = "chat/a11y-chat"
    if route in ("workflow", "model", "task", "task-waiting", "approvals-waiting"):
        if route not in objects:
            pytest.skip(f"no {route} on this server to open")
        route = objects[route]
    page.goto(route if route.startswith("http") else f"{servers.agent}/#/{route}")
    if route == "chat/a11y-chat":
        page.reload()  # read from storage by a new document, as when the chat is reopened
        expect(page.locator("[data-testid=messages] article")).to_have_count(8)
        expect(page.get_by_test_id("retry")).to_have_count(3)
    expect(page.locator("main")).to_be_visible()
    # Let the page's first requests land (lists, charts' first samples); a waiting task's page
    # keeps its event stream open, so the network is never idle there.
    if route != objects.get("task-waiting"):
        page.wait_for_load_state("networkidle")
    if route == "status":
        expect(page.locator("figure.chart polyline").first).to_be_attached(timeout=20_000)
    if route.startswith("agents/workflows/"):
        expect(page.get_by_test_id("dag")).to_be_visible()
    if "/#/agents/tasks/" in route:
        expect(page.locator("[data-testid=timeline-step], [data-testid=pending-call]").first).to_be_visible()
    if route.endswith("/#/agents/approvals"):
        expect(page.get_by_test_id("pending-call").first).to_be_visible()
    page.wait_for_timeout(300)


def _serious(page: Any, axe_source: str) -> list[str]:
    page.add_script_tag(content=axe_source)
    result = page.evaluate(
        """async () => {
            const r = await axe.run(document, {resultTypes: ['violations']});
            return r.violations.map(v => ({
                id: v.id, impact: v.impact, help: v.help,
                nodes: v.nodes.slice(0, 5).map(n => n.target.join(' ') + ': ' + n.failureSummary.split('\\n').slice(1).join(' ')),
            }));
        }"""
    )
    return [
        f"[{v['impact']}] {v['id']}: {v['help']}\n    " + "\n    ".join(v["nodes"])
        for v in result
        if v["impact"] in ("serious", "critical")
    ]


# Controls with no accessible name (axe checks this too; this names them plainly).
UNNAMED = """() => {
    const out = [];
    for (const el of document.querySelectorAll('input, select, textarea, button, [role=tab], [role=button], a[href]')) {
        if (el.type === 'hidden' || el.closest('[hidden], [aria-hidden=true]')) continue;
        if (el.closest('.cm-editor') && el.tagName !== 'BUTTON') continue;
        const named = (el.getAttribute('aria-label') || '').trim()
            || (el.getAttribute('aria-labelledby') || '').split(/\\s+/).some(id => document.getElementById(id)?.textContent.trim())
            || (el.labels && [...el.labels].some(l => l.textContent.trim()))
            || (el.getAttribute('title') || '').trim()
            || (['BUTTON', 'A'].includes(el.tagName) || el.getAttribute('role')) && el.textContent.trim();
        if (!named) out.push(el.outerHTML.slice(0, 120));
    }
    return out;
}"""


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("viewport", [DESKTOP, PHONE, DARK], ids=["1440", "390", "1440-dark"])
def test_no_serious_accessibility_violations(
    servers: Servers,
    browser: Any,
    axe_source: str,
    objects: dict[str, str],
    shots: Path,
    route: str,
    viewport: dict[str, int],
) -> None:
    # The studio's CSP allows only its own scripts; axe is injected by the test.
    size = {"width": viewport["width"], "height": viewport["height"]}
    scheme = "dark" if viewport.get("dark") else "light"
    context = browser.new_context(viewport=size, color_scheme=scheme, bypass_csp=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        _open(page, servers, objects, route)
        found = _serious(page, axe_source)
        if scheme == "dark":  # the dark variables are the ones in use
            assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(15, 19, 24)"
            page.screenshot(path=str(shots / f"dark-{route.replace('/', '-')}.png"), full_page=True)
        assert not found, f"#/{route} at {viewport['width']} px ({scheme}):\n" + "\n".join(found)
        unnamed = page.evaluate(UNNAMED)
        assert not unnamed, f"#/{route}: controls without a name: {unnamed}"
        if viewport is PHONE:
            name = route.replace("/", "-")
            page.screenshot(path=str(shots / f"phone-390-{name}.png"), full_page=True)
            width = page.evaluate("document.documentElement.scrollWidth")
            wide = page.evaluate(
                """() => [...document.querySelectorAll('body *')]
                    .filter(e => e.getBoundingClientRect().right > 391 && !e.closest('.scroll-x, .cm-editor, .table-wrap, .dag-wrap'))
                    .slice(0, 5).map(e => e.tagName + '.' + e.className)"""
            )
            assert width <= 390, f"#/{route} is {width} px wide at 390 px; too wide: {wide}"
            # Every page link in the header is on screen (the header wraps) and can be followed.
            links = page.locator("header a[href^='#/']")
            assert links.count() >= 5
            for i in range(links.count()):
                link = links.nth(i)
                expect(link).to_be_visible()
                box = link.bounding_box()
                assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, (link.inner_text(), box)
        assert not errors, errors
    finally:
        context.close()


def test_header_links_work_at_phone_width(servers: Servers, browser: Any) -> None:
    context = browser.new_context(viewport=PHONE)
    page = context.new_page()
    try:
        page.goto(servers.agent + "/#/playground")
        nav = page.locator("header nav")
        for name, hash_ in (("Status", "#/status"), ("Models", "#/models"), ("Chat", "#/chat")):
            nav.get_by_role("link", name=name, exact=False).first.click()
            expect(page).to_have_url(f"{servers.agent}/{hash_}")
    finally:
        context.close()
