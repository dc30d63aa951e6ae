"""conch studio in headless Chromium against a cold `conch up`: first-load bytes, time to
interactive, and a 10,000-row Table result, each against its target (issue 13).

No peer web UI can run on this machine (llama.cpp's server UI needs the llama-server binary,
Open WebUI needs its own stack), so the figures are set against the targets and, for the
table, against the same rows rendered as a plain non-virtualised DOM table in the same browser
(what a UI that renders every row does).

Run: ``python benchmarks/studio.py`` (needs Chromium at /usr/bin/chromium and playwright).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

CHROMIUM = os.environ.get("CONCH_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROWS = 10_000
PROGRAM = (
    f"range(0, {ROWS}) | map(fn(i) => "
    '{id: i, name: "row ${i}", size: i * 7 % 1000, even: i % 2 == 0})'
)
TARGET_KB, TARGET_TTI_MS, TARGET_TABLE_MS = 300, 1000, 500
RUNS = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(data_dir: str) -> tuple[subprocess.Popen[bytes], str]:
    port, models_port = _free_port(), _free_port()
    env = {**os.environ, "CONCH_DATA_DIR": data_dir}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = str(root / "src") + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-c", "from conch.cli.main import main; main()", "up",
           "--port", str(port), "--models-port", str(models_port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    for url in (f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{models_port}/v1/health"):
        while True:
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("`conch up` did not start")
            time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}"


def _first_load(browser: Any, base: str) -> dict[str, float]:
    """A fresh context (empty cache): bytes on the wire and time to a usable playground."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
    sizes: dict[str, float] = {}
    urls: dict[str, str] = {}
    cdp.on("Network.requestWillBeSent", lambda e: urls.__setitem__(e["requestId"], e["request"]["url"]))
    cdp.on("Network.loadingFinished", lambda e: sizes.__setitem__(e["requestId"], e["encodedDataLength"]))
    page.goto(base + "/#/playground")
    # Interactive: the editor takes input and the builtin reference (an API answer) is shown.
    tti = page.wait_for_function(
        "() => document.querySelector('.cm-content') && document.querySelector('.builtin-list li')"
        " ? performance.now() : false",
        polling="raf",
    ).json_value()
    page.wait_for_load_state("networkidle")
    app = sum(v for k, v in sizes.items() if "/api/" not in urls.get(k, "") and "/v1/" not in urls.get(k, ""))
    total = sum(sizes.values())
    context.close()
    return {"app_kb": app / 1000, "total_kb": total / 1000, "tti_ms": float(tti)}


def _table(browser: Any, base: str) -> dict[str, float]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(base + "/#/playground")
    page.wait_for_selector(".builtin-list li")
    page.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.press("Delete")
    page.keyboard.insert_text(PROGRAM)
    out = []
    for _ in range(RUNS):
        page.evaluate("performance.clearMarks()")
        started = page.evaluate("performance.now()")
        page.keyboard.press("Control+Enter")
        page.wait_for_function(
            "() => performance.getEntriesByName('conch:result-rendered').length > 0", polling="raf",
            timeout=120_000,
        )
        rows = page.locator("[data-testid=result-table]").get_attribute("aria-rowcount")
        assert rows == str(ROWS + 1), rows
        marks = page.evaluate(
            "() => ['conch:run-complete', 'conch:result-rendered']"
            ".map(n => performance.getEntriesByName(n)[0].startTime)"
        )
        # Sorting the 10,000 rows by a column, to the repaint.
        sort_ms = page.evaluate(
            """() => new Promise(done => {
                const t = performance.now();
                document.querySelector('[data-testid=result-table] th:nth-child(3) button').click();
                requestAnimationFrame(() => setTimeout(() => done(performance.now() - t)));
            })"""
        )
        out.append({"render_ms": marks[1] - marks[0], "end_to_end_ms": marks[1] - started, "sort_ms": sort_ms})
    # The same rows as a plain DOM table: every row rendered.
    plain = page.evaluate(
        f"""() => new Promise(done => {{
            const t = performance.now();
            const table = document.createElement('table');
            for (let i = 0; i < {ROWS}; i++) {{
                const tr = table.insertRow();
                for (const v of [i, 'row ' + i, i * 7 % 1000, i % 2 == 0]) tr.insertCell().textContent = String(v);
            }}
            document.body.appendChild(table);
            requestAnimationFrame(() => setTimeout(() => done(performance.now() - t)));
        }})"""
    )
    context.close()
    best = min(out, key=lambda r: r["render_ms"])
    median = sorted(out, key=lambda r: r["render_ms"])[len(out) // 2]
    return {
        "render_ms": median["render_ms"],
        "render_best_ms": best["render_ms"],
        "end_to_end_ms": sorted(r["end_to_end_ms"] for r in out)[len(out) // 2],
        "sort_ms": sorted(r["sort_ms"] for r in out)[len(out) // 2],
        "plain_dom_ms": float(plain),
    }


def run() -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as data:
        proc, base = _start(data)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                cold = _first_load(browser, base)  # the first page load of a cold server
                warm = [_first_load(browser, base) for _ in range(RUNS)]
                table = _table(browser, base)
                browser.close()
        finally:
            proc.terminate()
            proc.wait(30)
    tti = sorted(w["tti_ms"] for w in warm)[len(warm) // 2]
    return {"cold": cold, "tti_ms": tti, "table": table}


def main() -> None:
    if not Path(CHROMIUM).exists():
        print(f"skipped: no Chromium at {CHROMIUM}")
        return
    r = run()
    cold, t = r["cold"], r["table"]
    rows = [
        ("first load, app (gzip)", cold["app_kb"], "KB", TARGET_KB),
        ("first load, all incl. API", cold["total_kb"], "KB", TARGET_KB),
        ("interactive, cold server", cold["tti_ms"], "ms", TARGET_TTI_MS),
        (f"interactive, median of {RUNS}", r["tti_ms"], "ms", TARGET_TTI_MS),
        (f"{ROWS:,}-row Table render", t["render_ms"], "ms", TARGET_TABLE_MS),
        (f"{ROWS:,}-row run, Ctrl+Enter to table", t["end_to_end_ms"], "ms", None),
        (f"{ROWS:,}-row sort by a column", t["sort_ms"], "ms", None),
    ]
    print(f"{'measure':<38} {'conch':>10} {'target':>10} {'ratio':>7}")
    for name, value, unit, target in rows:
        tgt = f"{target} {unit}" if target else "—"
        ratio = f"{value / target:.2f}" if target else "—"
        ok = "" if target is None else ("  ok" if value <= target else "  MISS")
        print(f"{name:<38} {value:>7.1f} {unit:<2} {tgt:>10} {ratio:>7}{ok}")
    print(
        f"{ROWS:,} rows as a plain DOM table (every row rendered): {t['plain_dom_ms']:.0f} ms; "
        f"conch's virtualised table: {t['render_ms']:.0f} ms "
        f"({t['plain_dom_ms'] / max(t['render_ms'], 0.1):.1f}x faster)"
    )


if __name__ == "__main__":
    main()
