"""Status (issue 21, item 6; issue 35, item 5) in a real browser against the real servers:
tokens/s from the live counter while an answer is being written, the page's own polling left
out of the request rates, charts with axes and units drawn from each server's own history (full
on arrival), agent tasks and sandbox runs apart, loaded models (greyed as last known while the
inference server is away), and an outage shown as one with automatic reconnection (the
inference server cut off from the browser, then reachable again)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.web.studio.conftest import (
    VIEWPORT,
    InferenceProcess,
    Servers,
    start_servers,
    stop_servers,
)
from testsupport.scripted_model import ScriptedModel, final
from testsupport.servers import Server

MODEL = "smollm2-135m-instruct"


@pytest.fixture()
def idle(tmp_path: Path) -> Iterator[Servers]:
    """Servers that have served nothing: the charts show each server's last 15 minutes (its
    own history), so the session's servers, busy in earlier tests, would show those peaks."""
    fresh, running = start_servers(tmp_path / "idle")
    yield fresh
    stop_servers(running)


def test_an_idle_server_reads_zero_and_charts_have_axes(
    idle: Servers, page: Any, shots: Path
) -> None:
    servers = idle
    page.goto(servers.agent + "/#/status")
    requests = page.locator("figure.chart", has_text="Inference requests")
    expect(requests.locator("polyline")).to_have_attribute(
        "points", re.compile(r"\S+ \S+ \S+"), timeout=20_000
    )
    # This page polls both servers every 2 s, but its own polling is not counted.
    expect(requests.get_by_test_id("chart-value")).to_have_text("0.00")
    expect(page.get_by_test_id("charts-note")).to_contain_text("leave out monitoring requests")
    # Axes: values in the unit, and time.
    expect(requests.locator("figcaption")).to_contain_text("req/s")
    axis = requests.locator(".axis text")
    texts = axis.all_text_contents()
    assert (
        "now" in texts and "0" in texts and "req/s" in texts and any("min" in t for t in texts)
    ), texts
    tps = page.get_by_test_id("chart-tps")
    expect(tps.locator("figcaption")).to_contain_text("tokens/s")
    expect(page.get_by_test_id("loaded-models")).to_be_visible()
    # Each server's resident memory (process_resident_memory_bytes of its /metrics), in MB.
    for server in ("inference", "agent"):
        memory = page.get_by_test_id(f"chart-memory-{server}")
        expect(memory.locator("figcaption")).to_contain_text("MB")
        expect(memory.locator("polyline")).to_be_attached()
        assert "MB" in memory.locator(".axis text").all_text_contents()
        shown = memory.get_by_test_id("chart-value").inner_text().replace(",", "")
        assert 10 < float(shown) < 100_000, shown
    # Counts (sequences, queued requests, runs) are whole numbers, on the axis too, and the
    # axis says "count": what is counted is in the caption, pluralised, not a unit.
    for testid, noun in (("chart-sequences", "sequences"), ("chart-queue", "requests"), ("chart-runs", "runs")):
        chart = page.get_by_test_id(testid)
        expect(chart.locator("figcaption")).to_have_text(re.compile(rf": 0 {noun}$"))
        assert chart.locator(".axis text").all_text_contents()[:4] == ["2", "1", "0", "count"]
        expect(chart.locator("svg")).to_have_attribute("aria-label", re.compile(rf"now 0 {noun}; peak 0 {noun} "))
    # Rates' axes carry no needless digits.
    assert requests.locator(".axis text").all_text_contents()[:4] == ["1", "0.5", "0", "req/s"]
    page.screenshot(path=str(shots / "status-memory.png"), full_page=True)


def _count_axes(page: Any) -> list[str]:
    return page.locator("[data-testid=chart-sequences] .axis text, [data-testid=chart-queue] .axis text").all_text_contents()


def test_tokens_per_second_move_while_an_answer_is_written(
    servers: Servers, page: Any, shots: Path
) -> None:
    page.goto(servers.agent + "/#/status")
    tps = page.get_by_test_id("chart-tps")
    expect(tps.locator("polyline")).to_have_attribute(
        "points", re.compile(r"\S+ \S+"), timeout=20_000
    )
    done = threading.Event()
    seen_during: list[str] = []
    count_axes: list[str] = []

    def ask() -> None:
        body = {
            "model": MODEL,
            "messages": [
                {
                    "role": "user",
                    "content": "Write a very long story about a lighthouse keeper, with many chapters.",
                }
            ],
            "max_tokens": 900,
            "stream": True,
        }
        try:
            with httpx.stream(
                "POST", servers.inference + "/v1/chat/completions", json=body, timeout=300
            ) as r:
                for _ in r.iter_lines():
                    pass
        finally:
            done.set()

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not done.is_set() and time.monotonic() < deadline:
            value = tps.get_by_test_id("chart-value").inner_text()
            if value not in ("0.00", "0"):
                seen_during.append(value)
                break
            count_axes.extend(_count_axes(page))
            time.sleep(0.2)
        # The rate was there while the answer was still being written (the completion counter
        # alone would only move at its end).
        assert seen_during and not done.is_set(), "tokens/s stayed at 0 during generation"
        assert float(seen_during[0].replace(",", "")) > 0
        # A sequence generating: the count charts' axes still read whole numbers.
        count_axes.extend(_count_axes(page))
        ticks = [t for t in count_axes if t not in ("count", "now") and "min" not in t]
        assert ticks and all(t.replace(",", "").isdigit() for t in ticks), count_axes
        loaded = page.get_by_test_id("loaded-models")
        expect(loaded).to_contain_text(MODEL, timeout=15_000)
        page.screenshot(path=str(shots / "status-generating.png"))
    finally:
        thread.join(timeout=300)


def test_an_outage_is_shown_and_the_page_reconnects(
    servers: Servers, page: Any, shots: Path
) -> None:
    page.goto(servers.agent + "/#/status")
    expect(page.get_by_test_id("inference-health")).to_contain_text("running")
    origin = servers.inference
    # The inference server becomes unreachable from the browser.
    page.route(lambda url: url.startswith(origin), lambda r: r.abort("connectionrefused"))
    outage = page.get_by_test_id("outage")
    expect(outage).to_contain_text("The inference server is unreachable", timeout=15_000)
    expect(outage).to_contain_text("asking again")
    expect(page.get_by_test_id("inference-health")).to_contain_text("unreachable")
    page.screenshot(path=str(shots / "status-outage.png"))
    # It answers again: the page picks up by itself, with no reload.
    page.unroute_all()
    expect(outage).to_have_count(0, timeout=15_000)
    expect(page.get_by_test_id("reconnected")).to_contain_text("answers again")
    expect(page.get_by_test_id("inference-health")).to_contain_text("running", timeout=15_000)
    expect(page.get_by_test_id("inference-health")).not_to_contain_text("unreachable")


def test_a_server_killed_and_started_again_is_picked_up(
    browser: Any, inference: InferenceProcess, shots: Path
) -> None:
    """The real thing: the inference server (serving this studio alone) is killed, then
    started again on its port; the open Status page shows the outage, then recovers by itself."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(inference.url + "/#/status")
        health = page.get_by_test_id("inference-health")
        expect(health).to_contain_text("running", timeout=30_000)
        inference.kill()
        expect(page.get_by_test_id("outage")).to_contain_text("unreachable", timeout=20_000)
        expect(health).to_contain_text("unreachable")
        inference.start()
        expect(page.get_by_test_id("outage")).to_have_count(0, timeout=30_000)
        expect(page.get_by_test_id("reconnected")).to_be_visible()
        expect(health).to_contain_text("running", timeout=20_000)
        page.screenshot(path=str(shots / "status-reconnected.png"))
    finally:
        context.close()
    assert not errors, errors


# -- issue 35, item 5: each server's own history, tasks and runs apart, loaded models greyed ---

POLL = {"X-Conch-Poll": "studio"}


def _history(servers: Servers, base: str, path: str, **params: Any) -> dict[str, Any]:
    key = servers.settings.api_key
    r = httpx.get(base + path, params=params, headers={**POLL, **({"Authorization": f"Bearer {key}"} if key else {})}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _points(page: Any, testid: str) -> int:
    return int(page.evaluate(
        "id => { const p = document.querySelector(`[data-testid=${id}] polyline`);"
        " return p ? p.getAttribute('points').trim().split(/\\s+/).length : 0 }", testid))


def test_charts_are_full_on_arrival_and_this_pages_polling_is_not_traffic(
    servers: Servers, page: Any, shots: Path
) -> None:
    """The servers sample themselves: a page opened now draws what they kept (not an empty
    chart filling up), and its own polling (marked X-Conch-Poll) is not counted as requests."""
    # Each server samples from its own start: wait until both have kept six.
    deadline = time.monotonic() + 30
    for base, path in ((servers.inference, "/v1/status/history"), (servers.agent, "/api/v1/status/history")):
        while len(_history(servers, base, path)["samples"]) < 6:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    held = len(_history(servers, servers.inference, "/v1/status/history")["samples"])
    opened = time.time()
    page.goto(servers.agent + "/#/status")
    # On arrival: before the page's second read (2 s), every sample each server held is drawn.
    drawn = (
        "([id, n]) => { const p = document.querySelector(`[data-testid=${id}] polyline`);"
        " return p && p.getAttribute('points').trim().split(/\\s+/).length >= n }"
    )
    page.wait_for_function(drawn, arg=["chart-requests", held], timeout=1900)
    page.wait_for_function(drawn, arg=["chart-memory-agent", 5], timeout=1900)
    for m in (2, 5, 15):
        page.locator(f"[data-range='{m}']").click()
        expect(page.locator(f"[data-range='{m}']")).to_have_attribute("aria-pressed", "true")
        expect(page.get_by_test_id("chart-tps").locator(".axis text").nth(4)).to_have_text(f"−{m} min")
    # The page keeps reading both servers every 2 s (history, loaded models; health every 10 s)
    # and the header its approvals badge: none of it is traffic.
    time.sleep(7)
    for base, path in ((servers.inference, "/v1/status/history"), (servers.agent, "/api/v1/status/history")):
        since = [s for s in _history(servers, base, path, since=opened)["samples"] if s["t"] - s["dt"] >= opened]
        assert len(since) >= 2, since
        assert all(s["requests_per_s"] == 0 for s in since), (path, since)
    expect(page.locator("figure.chart", has_text="Inference requests").get_by_test_id("chart-value")).to_have_text("0.00")
    page.screenshot(path=str(shots / "status-history.png"), full_page=True)


def test_agent_tasks_and_sandbox_runs_are_charted_apart(
    orch: Server, scripted: ScriptedModel, page: Any, shots: Path
) -> None:
    """Two agent tasks (their model takes 8 s to answer) and one sandbox run: "Active agent tasks:
    2 tasks" and "Sandbox runs: 1 run" (before, one chart counted the runs only)."""
    goal = scripted.script("Take your time.", {"content": final("done"), "delay": 8})
    page.goto(orch.url + "/#/status")
    tasks, runs = page.get_by_test_id("chart-tasks"), page.get_by_test_id("chart-runs")
    expect(tasks.locator("figcaption")).to_have_text(re.compile(r"Active agent tasks: 0 tasks$"), timeout=15_000)
    with orch.client() as c:
        for _ in range(2):
            assert c.post("/api/v1/orchestration/tasks", json={"goal": goal, "tools": [], "max_steps": 2}).status_code == 201
    run = threading.Thread(target=lambda: httpx.post(
        orch.url + "/api/v1/execute", json={"command": "sleep(6000)\n1"}, timeout=60), daemon=True)
    run.start()
    try:
        expect(tasks.locator("figcaption")).to_have_text(re.compile(r": 2 tasks$"), timeout=15_000)
        expect(runs.locator("figcaption")).to_have_text(re.compile(r"Sandbox runs: 1 run$"), timeout=10_000)
        expect(tasks.locator("svg")).to_have_attribute("aria-label", re.compile(r"now 2 tasks; peak 2 tasks"))
        page.screenshot(path=str(shots / "status-tasks-and-runs.png"), full_page=True)
    finally:
        run.join(timeout=60)
    expect(tasks.locator("figcaption")).to_have_text(re.compile(r": 0 tasks$"), timeout=20_000)


def test_loaded_models_are_greyed_while_the_inference_server_is_away(
    servers: Servers, page: Any, shots: Path
) -> None:
    httpx.post(servers.inference + "/api/generate", json={"model": MODEL, "prompt": "", "stream": False},
               timeout=120).raise_for_status()
    page.goto(servers.agent + "/#/status")
    loaded = page.get_by_test_id("loaded-models")
    expect(loaded).to_contain_text(MODEL, timeout=15_000)
    expect(loaded).not_to_have_attribute("data-stale", "true")
    origin = servers.inference
    page.route(lambda url: url.startswith(origin), lambda r: r.abort("connectionrefused"))
    expect(page.get_by_test_id("outage")).to_contain_text("The inference server is unreachable", timeout=15_000)
    # Still listed, as what was last known, greyed and saying so.
    expect(loaded).to_have_attribute("data-stale", "true")
    expect(loaded.get_by_test_id("loaded-stale")).to_contain_text("Last known at")
    expect(loaded.get_by_test_id("loaded-stale")).to_contain_text("may no longer be true")
    expect(loaded).to_contain_text(MODEL)
    colour = loaded.locator("li a").first.evaluate("a => getComputedStyle(a).fontStyle")
    assert colour == "italic"
    page.screenshot(path=str(shots / "status-outage-loaded-models.png"))
    page.unroute_all()
    expect(loaded).not_to_have_attribute("data-stale", "true", timeout=15_000)
    expect(loaded.get_by_test_id("loaded-stale")).to_have_count(0)
