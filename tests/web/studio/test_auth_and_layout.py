"""The API-key prompt, and the studio at phone width and in dark mode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from conch import db
from tests.web.studio.conftest import Servers, start_servers, stop_servers
from tests.web.studio.test_playground import run_program

KEY = "studio-test-key"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    servers, running = start_servers(tmp_path_factory.mktemp("studio-keyed"), api_key=KEY)
    yield servers
    stop_servers(running)
    db.dispose_all()


def test_the_app_asks_for_the_key_once_and_keeps_it_for_the_session(keyed: Servers, page: Any, shots: Path) -> None:
    # The page itself is public code; the API behind it is not.
    assert httpx.get(keyed.agent + "/api/v1/builtins").status_code == 401
    page.goto(keyed.agent + "/#/playground")
    prompt = page.get_by_test_id("key-prompt")
    expect(prompt).to_be_visible()
    page.screenshot(path=str(shots / "api-key-prompt.png"))
    page.get_by_test_id("key-input").fill(KEY)
    page.keyboard.press("Enter")
    expect(prompt).to_be_hidden()
    expect(page.locator(".builtin-list li").first).to_be_visible()
    run_program(page, "[1, 2, 3] | map(fn(x) => x * 10) | sum")
    expect(page.locator(".value .scalar")).to_have_text("60")
    assert page.evaluate("sessionStorage.getItem('conch.apiKey')") == KEY
    assert page.evaluate(f"JSON.stringify(localStorage).includes('{KEY}')") is False
    # A reload in the same tab does not ask again.
    page.reload()
    expect(page.locator(".builtin-list li").first).to_be_visible()
    expect(prompt).to_be_hidden()


def test_a_wrong_key_is_asked_for_again(keyed: Servers, page: Any) -> None:
    page.goto(keyed.agent + "/#/playground")
    page.get_by_test_id("key-input").fill("wrong")
    page.keyboard.press("Enter")
    # The retry with the wrong key is refused: the page says so instead of breaking.
    expect(page.get_by_role("alert")).to_contain_text("401")
    assert page.evaluate("sessionStorage.getItem('conch.apiKey')") is None
    page.reload()
    expect(page.get_by_test_id("key-prompt")).to_be_visible()


def test_phone_width_and_dark_mode(servers: Servers, browser: Any, shots: Path) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, color_scheme="dark")
    page = context.new_page()
    page.goto(servers.agent + "/#/playground")
    expect(page.locator(".builtin-list li").first).to_be_visible()
    # Nothing wider than the screen: no horizontal scrolling of the page.
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert bg == "rgb(15, 19, 24)", bg
    page.screenshot(path=str(shots / "phone-dark-playground.png"))
    page.goto(servers.agent + "/#/chat")
    expect(page.get_by_test_id("chat-input")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.screenshot(path=str(shots / "phone-dark-chat.png"))
    context.close()


def test_keyboard_only_navigation(servers: Servers, page: Any) -> None:
    page.goto(servers.agent + "/#/playground")
    expect(page.locator(".builtin-list li").first).to_be_visible()
    # Tab reaches the page links; Enter follows one.
    for _ in range(10):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Status":
            break
        if page.evaluate("document.activeElement.getAttribute('href')") == "#/status":
            break
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("inference-health")).to_be_visible()
