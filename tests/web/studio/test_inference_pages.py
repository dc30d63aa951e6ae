"""Chat, Models and Status in a real browser: the studio served by the agent server calls the
real inference server on its own port (CORS), as under ``conch up``."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.inference.sources.conftest import make_small_gguf
from tests.inference.sources.servers import FileServer
from tests.web.studio.conftest import Servers


def _active_sequences(servers: Servers) -> float:
    text = httpx.get(servers.inference + "/metrics", timeout=10).text
    m = re.search(r"^conch_inference_active_sequences (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_chat_streams_tokens_and_stops(servers: Servers, page: Any, shots: Path) -> None:
    page.goto(servers.agent + "/#/chat")
    expect(page.get_by_test_id("model-picker")).to_have_value("smollm2-135m-instruct")
    page.get_by_label("Max tokens").fill("900")
    page.get_by_test_id("chat-input").fill(
        "Write a very long story about a lighthouse keeper, with many chapters."
    )
    page.get_by_test_id("send").click()
    answer = page.get_by_test_id("msg-assistant").last
    stop = page.get_by_test_id("stop")
    # Tokens show while the answer is still being generated (the Stop button is still up).
    expect(answer.locator(".md")).not_to_have_text("", timeout=60_000)
    expect(stop).to_be_visible()
    seen = [len(answer.locator(".md").inner_text())]
    for _ in range(50):
        time.sleep(0.05)
        seen.append(len(answer.locator(".md").inner_text()))
        if seen[-1] > seen[0]:
            break
    assert seen[-1] > seen[0], "the answer did not grow while streaming"
    expect(answer.get_by_test_id("chat-stats")).to_contain_text("tokens/s")
    page.screenshot(path=str(shots / "chat.png"))
    stop.click()
    expect(answer.get_by_test_id("chat-stats")).to_contain_text("stopped")
    expect(page.get_by_test_id("send")).to_be_visible()
    # The text stays as it was, and the server stopped generating (disconnect cancels).
    final = answer.locator(".md").inner_text()
    deadline = time.monotonic() + 10
    while _active_sequences(servers) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _active_sequences(servers) == 0
    assert answer.locator(".md").inner_text() == final


def test_chat_answer_runs_to_the_end(servers: Servers, page: Any, shots: Path) -> None:
    page.goto(servers.agent + "/#/chat")
    page.get_by_label("Max tokens").fill("160")
    page.get_by_test_id("chat-input").fill("Show a Python function that adds two numbers, in a code block.")
    page.get_by_test_id("chat-input").press("Enter")
    expect(page.get_by_test_id("send")).to_be_visible(timeout=120_000)
    answer = page.get_by_test_id("msg-assistant").last
    stats = answer.get_by_test_id("chat-stats")
    expect(stats).to_contain_text("tokens/s")
    expect(stats).not_to_contain_text("stopped")
    assert answer.locator(".md").inner_text().strip()
    page.screenshot(path=str(shots / "chat-answer.png"))


def test_pull_a_model_with_a_live_progress_bar(servers: Servers, page: Any, shots: Path, tmp_path: Path) -> None:
    # 16 MiB: the url source reports progress every 4 MiB.
    gguf = make_small_gguf(tmp_path / "tiny.gguf", n=64 * 65536)
    files = FileServer({"tiny.gguf": gguf})
    files.chunk_delay = 0.01  # per 64 KiB: a slow link, so that the bar has time to move
    with files.run() as url:
        page.goto(servers.agent + "/#/models")
        expect(page.get_by_test_id("models-table")).to_contain_text("smollm2-135m-instruct")
        page.get_by_label("Id in the store").fill("tiny-pulled")
        page.get_by_label("Source").select_option("url")
        page.locator("input[name=locator]").fill(f"{url}/tiny.gguf")
        page.get_by_test_id("pull").click()
        bar = page.get_by_role("progressbar")
        # Part-way first, then 100 % and ready.
        page.wait_for_function(
            "() => { const b = document.querySelector('[role=progressbar]');"
            " const v = b && Number(b.getAttribute('aria-valuenow'));"
            " return v > 0 && v < 100; }",
            timeout=30_000,
        )
        page.screenshot(path=str(shots / "models-pulling.png"))
        expect(bar).to_have_attribute("aria-valuenow", "100", timeout=60_000)
        expect(page.get_by_test_id("job-status")).to_have_text("ready")
        expect(page.get_by_test_id("progress-text")).to_have_text("100 %")
    row = page.locator("tr[data-model='tiny-pulled']")
    expect(row).to_contain_text("ready")
    expect(row).to_contain_text("gguf")
    page.screenshot(path=str(shots / "models.png"))
    # Delete it, through the confirmation dialog.
    row.get_by_role("button", name="Delete tiny-pulled").click()
    dialog = page.locator("dialog[open]")
    expect(dialog).to_contain_text("tiny-pulled")
    dialog.get_by_role("button", name="Delete").click()
    expect(row).to_have_count(0)
    assert httpx.get(servers.inference + "/v1/models/tiny-pulled").status_code == 404


def test_storage_cleanup(servers: Servers, page: Any) -> None:
    page.goto(servers.agent + "/#/models")
    expect(page.get_by_test_id("storage-stats")).to_contain_text("models")
    page.get_by_role("button", name="Clean up").click()
    expect(page.get_by_role("status")).to_contain_text("cleanup freed")


def test_status_page(servers: Servers, page: Any, shots: Path) -> None:
    page.goto(servers.agent + "/#/status")
    expect(page.get_by_test_id("agent-health")).to_contain_text("healthy")
    expect(page.get_by_test_id("inference-health")).to_contain_text("running")
    local = page.locator("tr[data-provider='local']")
    local.get_by_role("button", name="Validate").click()
    expect(local.get_by_test_id("validation")).to_contain_text("valid")
    # The charts fill from /metrics every 2 s.
    expect(page.locator(".chart polyline").first).to_have_attribute("points", re.compile(r"\S+ \S+"), timeout=15_000)
    page.screenshot(path=str(shots / "status.png"))


def test_inference_server_alone_serves_its_pages(servers: Servers, page: Any) -> None:
    page.goto(servers.inference + "/")
    nav = page.get_by_role("navigation", name="Pages")
    expect(nav.get_by_role("link")).to_have_text(["Chat", "Models", "Status"])
    page.goto(servers.inference + "/#/status")
    expect(page.get_by_test_id("inference-health")).to_contain_text("running")
