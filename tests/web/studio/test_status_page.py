"""Status (issue 21, item 6) in a real browser against the real servers: tokens/s from the
live counter while an answer is being written, the page's own polling left out of the request
rates, charts with axes and units, loaded models, and an outage shown as one with automatic
reconnection (the inference server cut off from the browser, then reachable again)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.web.studio.conftest import VIEWPORT, InferenceProcess, Servers

MODEL = "smollm2-135m-instruct"


def test_an_idle_server_reads_zero_and_charts_have_axes(
    servers: Servers, page: Any, shots: Path
) -> None:
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
