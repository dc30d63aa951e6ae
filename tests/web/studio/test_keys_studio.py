"""The studio with keys (issue 32, item 6): sign-in on a server that needs a key, the pages a
key's scopes allow, sign-out; chats kept on the server per tenant (the browser's imported on
first sign-in, full-text search, seen from another browser with the same key and not with
another tenant's); the admin page (keys made, changed, rotated and revoked, usage, the audit
log); and an open loopback server that asks for nothing, as before keys."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from conch import db
from tests.web.keys_support import ADMIN, ADMIN_KEY, bearer, make_key
from tests.web.studio.conftest import VIEWPORT, Servers, start_servers, stop_servers
from tests.web.studio.test_accessibility import _serious

MODEL = "smollm2-135m-instruct"
AXE = Path(__file__).resolve().parents[3] / "ui" / "node_modules" / "axe-core" / "axe.min.js"

# A chat kept in the browser before keys: imported into the key's tenant on first sign-in.
_SEED = r"""async () => {
    const db = await new Promise((ok, no) => {
        const r = indexedDB.open("conch-studio", 1);
        r.onupgradeneeded = () => r.result.createObjectStore("chats", { keyPath: "id" });
        r.onsuccess = () => ok(r.result); r.onerror = () => no(r.error);
    });
    const at = Date.now() - 60000;
    const chat = { id: "browser-chat-1", title: "Penguins of the south", created: at, updated: at,
        settings: { model: "", system: "", temperature: 0.7, maxTokens: 16, topP: 1 },
        messages: [
            { id: "m0", role: "user", at, content: "Where do emperor penguins breed?" },
            { id: "m1", role: "assistant", at, status: "done", content: "On the Antarctic sea ice, in winter." },
        ] };
    await new Promise((ok, no) => {
        const tx = db.transaction("chats", "readwrite"); tx.objectStore("chats").put(chat);
        tx.oncomplete = ok; tx.onerror = () => no(tx.error);
    });
    db.close();
}"""

_COUNT_LOCAL = r"""() => new Promise((ok, no) => {
    const r = indexedDB.open("conch-studio", 1);
    r.onupgradeneeded = () => r.result.createObjectStore("chats", { keyPath: "id" });
    r.onsuccess = () => { const c = r.result.transaction("chats").objectStore("chats").count();
        c.onsuccess = () => { r.result.close(); ok(c.result); }; c.onerror = () => no(c.error); };
})"""


class Keys:
    def __init__(self, servers: Servers) -> None:
        self.servers = servers
        url = servers.agent
        self.alice_id, self.alice = make_key(url, name="alice", tenant="acme", scopes=["inference"],
                                             limits={"requests_per_minute": 1000})  # fmt: skip
        self.alice2_id, self.alice2 = make_key(url, name="alice-laptop", tenant="acme", scopes=["inference"])
        self.bob_id, self.bob = make_key(url, name="bob", tenant="globex", scopes=["inference", "execute"])


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    servers, running = start_servers(tmp_path_factory.mktemp("studio-keys"), admin_key=ADMIN_KEY)
    yield servers
    stop_servers(running)
    db.dispose_all()


@pytest.fixture(scope="module")
def keys(keyed: Servers) -> Keys:
    return Keys(keyed)


@pytest.fixture()
def context(browser: Any) -> Iterator[Any]:
    """A second browser (its own storage), for what another person or device sees."""
    contexts: list[Any] = []

    def make(theme: str | None = None) -> Any:
        # bypass_csp: axe-core is injected as an inline script (the studio's CSP refuses those).
        ctx = browser.new_context(viewport=VIEWPORT, bypass_csp=True,
                                  color_scheme="dark" if theme == "dark" else "light")
        if theme:
            ctx.add_init_script(f"localStorage.setItem('conch.theme', '{theme}')")
        contexts.append(ctx)
        pg = ctx.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.errors = errors
        return pg

    yield make
    for ctx in contexts:
        ctx.close()


def sign_in(page: Any, key: str, remember: bool = False) -> None:
    prompt = page.get_by_test_id("key-prompt")
    expect(prompt).to_be_visible()
    page.get_by_test_id("key-input").fill(key)
    if remember:
        page.get_by_test_id("key-remember").check()
    page.get_by_test_id("sign-in").click()
    expect(prompt).to_be_hidden()


def nav(page: Any) -> list[str]:
    return [t.strip() for t in page.locator("header nav a").all_inner_texts()]


def server_chats(servers: Servers, key: str, q: str | None = None) -> list[dict[str, Any]]:
    r = httpx.get(servers.agent + "/api/v1/chats", params={"q": q} if q else {}, headers=bearer(key), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["chats"]  # type: ignore[no-any-return]


def test_sign_in_is_required_and_a_scoped_key_sees_only_its_pages(keyed: Servers, keys: Keys, page: Any, shots: Path) -> None:
    assert httpx.get(keyed.agent + "/api/v1/usage").status_code == 401
    page.goto(keyed.agent + "/#/chat")
    expect(page.get_by_test_id("key-prompt")).to_be_visible()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.screenshot(path=str(shots / "keys-sign-in.png"))
    sign_in(page, keys.alice, remember=True)
    # Only what an inference key may use: no playground (execute), no agents, no admin.
    expect(page.get_by_test_id("signed-in-as")).to_have_text("alice · acme")
    expect(page.locator("header nav a")).to_have_count(4)
    assert nav(page) == ["Chat", "Models", "Marketplace", "Status"]
    expect(page.get_by_test_id("approvals-link")).to_have_count(0)
    # The inference server (another origin) got the key too: its models are offered.
    expect(page.get_by_test_id("model-picker")).to_have_value(MODEL)
    # Kept in this browser, as asked (and only there: not in the page's address).
    assert page.evaluate("localStorage.getItem('conch.apiKey')") == keys.alice
    page.screenshot(path=str(shots / "keys-signed-in-scoped.png"))
    # Models: listed, but no pull, convert or delete without `models:write`.
    page.goto(keyed.agent + "/#/models")
    expect(page.locator(f"tr[data-model='{MODEL}']")).to_be_visible()
    expect(page.get_by_test_id("pull")).to_have_count(0)
    expect(page.get_by_role("button", name=f"Delete {MODEL}")).to_have_count(0)
    for route in ("playground", "agents", "admin"):
        page.goto(f"{keyed.agent}/#/{route}")
        expect(page.get_by_test_id("not-allowed")).to_be_visible()
        expect(page.get_by_test_id("not-allowed")).to_contain_text("scope")
    page.screenshot(path=str(shots / "keys-not-allowed.png"))
    # A new tab of this browser is still signed in.
    page.reload()
    expect(page.get_by_test_id("signed-in-as")).to_be_visible()
    expect(page.get_by_test_id("key-prompt")).to_be_hidden()
    # Sign out: the key is forgotten and the studio asks again.
    page.get_by_test_id("sign-out").click()
    expect(page.get_by_test_id("key-prompt")).to_be_visible()
    assert page.evaluate("localStorage.getItem('conch.apiKey') || sessionStorage.getItem('conch.apiKey')") is None
    # Another key, another set of pages: bob may run programs.
    sign_in(page, keys.bob)
    expect(page.get_by_test_id("signed-in-as")).to_have_text("bob · globex")
    expect(page.locator("header nav a", has_text="Playground")).to_be_visible()
    assert "Admin" not in nav(page)


def test_chats_are_kept_on_the_server_per_tenant(keyed: Servers, keys: Keys, page: Any, context: Any, shots: Path) -> None:
    # The browser holds a chat from before keys: it is imported on the first sign-in.
    page.goto(keyed.agent + "/#/chat")
    page.evaluate(_SEED)
    sign_in(page, keys.alice)
    listed = page.get_by_test_id("chat-list").locator("a.chat-link")
    expect(listed.filter(has_text="Penguins of the south")).to_be_visible()
    mine = server_chats(keyed, keys.alice)
    imported = [c for c in mine if c["client_id"] == "browser-chat-1"]
    assert len(imported) == 1 and imported[0]["tenant"] == "acme" and imported[0]["message_count"] == 2
    assert page.evaluate(_COUNT_LOCAL) == 0  # imported once: the browser's copy is gone
    # Its old link still opens it, under the server's id.
    page.goto(keyed.agent + "/#/chat/browser-chat-1")
    expect(page.get_by_test_id("chat-title")).to_have_text("Penguins of the south")
    expect(page).to_have_url(re.compile(rf"#/chat/{imported[0]['id']}$"))
    expect(page.get_by_test_id("msg-assistant")).to_contain_text("Antarctic sea ice")

    # A new chat, answered by the model (streamed from the inference server with the key),
    # is saved on the server.
    page.get_by_test_id("new-chat").click()
    expect(page.get_by_test_id("send")).to_be_enabled()
    page.get_by_label("Max tokens").fill("8")
    page.get_by_test_id("chat-input").fill("Name one colour of the rainbow.")
    page.get_by_test_id("chat-input").press("Enter")
    expect(page).to_have_url(re.compile(r"#/chat/chat_[0-9a-f]+$"))
    expect(page.get_by_test_id("msg-assistant").last).to_have_attribute("data-status", "done", timeout=120_000)
    new_id = page.url.rsplit("/", 1)[1]
    deadline = time.monotonic() + 10
    while True:
        chat = httpx.get(f"{keyed.agent}/api/v1/chats/{new_id}", headers=bearer(keys.alice), timeout=30).json()
        if chat["messages"] and chat["messages"][-1].get("status") == "done":
            break
        assert time.monotonic() < deadline, chat
        time.sleep(0.2)
    assert chat["messages"][0]["content"] == "Name one colour of the rainbow."
    assert chat["tenant"] == "acme"
    page.screenshot(path=str(shots / "keys-chats-on-server.png"))

    # Search: the server's full-text search, in the list.
    page.get_by_test_id("chat-search").fill("emperor penguins")
    results = page.get_by_test_id("search-results").locator("a.chat-link")
    expect(results).to_have_count(1)
    expect(results.first).to_contain_text("Penguins of the south")
    expect(results.first.locator(".snippet")).to_contain_text("penguins", ignore_case=True)
    page.screenshot(path=str(shots / "keys-chat-search.png"))
    page.get_by_test_id("chat-search").fill("xylophone")
    expect(page.get_by_test_id("search-count")).to_have_text("0 chats match")
    page.get_by_test_id("chat-search").fill("")

    # Another browser with a key of the same tenant sees both chats, messages and all.
    other = context()
    other.goto(keyed.agent + "/#/chat")
    sign_in(other, keys.alice2)
    other_list = other.get_by_test_id("chat-list").locator("a.chat-link")
    expect(other_list).to_have_count(2)
    other_list.filter(has_text="Penguins of the south").click()
    expect(other.get_by_test_id("msg-user")).to_contain_text("Where do emperor penguins breed?")
    other.screenshot(path=str(shots / "keys-chats-other-browser.png"))

    # Another tenant's key sees none of them, nor finds them, nor opens them.
    stranger = context()
    stranger.goto(keyed.agent + "/#/chat")
    sign_in(stranger, keys.bob)
    expect(stranger.get_by_text("No chats yet. They are kept on the server")).to_be_visible()
    stranger.get_by_test_id("chat-search").fill("penguins")
    expect(stranger.get_by_test_id("search-count")).to_have_text("0 chats match")
    stranger.goto(f"{keyed.agent}/#/chat/{new_id}")
    expect(stranger.get_by_test_id("not-found")).to_be_visible()
    stranger.screenshot(path=str(shots / "keys-chats-other-tenant.png"))
    assert server_chats(keyed, keys.bob) == []

    # Renamed and deleted through the studio: so on the server.
    page.goto(f"{keyed.agent}/#/chat/{new_id}")
    page.get_by_test_id("rename").click()
    page.get_by_test_id("rename-input").fill("Rainbow colours")
    page.get_by_test_id("rename-input").press("Enter")
    expect(page.get_by_test_id("chat-title")).to_have_text("Rainbow colours")
    deadline = time.monotonic() + 10
    while httpx.get(f"{keyed.agent}/api/v1/chats/{new_id}", headers=bearer(keys.alice), timeout=30).json()["title"] != "Rainbow colours":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    page.get_by_test_id("delete-chat").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete", exact=True).click()
    expect(page).to_have_url(re.compile(r"#/chat$"))
    deadline = time.monotonic() + 10
    while httpx.get(f"{keyed.agent}/api/v1/chats/{new_id}", headers=bearer(keys.alice), timeout=30).status_code != 404:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert not other.errors and not stranger.errors


def test_the_admin_page_makes_rotates_and_revokes_keys(keyed: Servers, keys: Keys, page: Any, shots: Path) -> None:
    page.goto(keyed.agent + "/#/status")
    sign_in(page, ADMIN_KEY)
    page.locator("header nav a", has_text="Admin").click()
    expect(page).to_have_url(re.compile(r"#/admin$"))
    expect(page.get_by_test_id("keys-table")).to_contain_text("alice")

    # Create: the secret is shown once, and works.
    form = page.get_by_test_id("key-create")
    form.get_by_test_id("key-name").fill("ci-bot")
    form.get_by_test_id("key-tenant").fill("acme")
    form.locator("[data-scope=execute]").check()
    form.locator("[data-limit=requests_per_minute]").fill("60")
    form.get_by_test_id("key-create-submit").click()
    secret_text = page.get_by_test_id("key-secret-text")
    expect(secret_text).to_have_text(re.compile(r"^ck-"))
    secret = secret_text.inner_text().strip()
    page.screenshot(path=str(shots / "keys-admin-created.png"))
    me = httpx.get(keyed.agent + "/api/v1/usage", headers=bearer(secret), timeout=30).json()
    assert me["key"]["name"] == "ci-bot" and me["key"]["tenant"] == "acme"
    assert me["scopes"] == ["execute", "inference"]
    row = page.get_by_test_id("key-row").filter(has_text="ci-bot")
    expect(row).to_contain_text("requests_per_minute 60")
    key_id = row.get_attribute("data-key")
    page.get_by_role("button", name="Done").click()
    expect(page.get_by_test_id("key-secret")).to_have_count(0)

    # A bad limit is refused, naming the field; the key is unchanged.
    row.get_by_role("button", name="Change ci-bot").click()
    edit = page.get_by_test_id("key-edit")
    edit.locator("[data-limit=tokens_per_day]").fill("-5")
    edit.get_by_test_id("key-save").click()
    expect(edit.locator(".field-error")).to_contain_text("tokens_per_day")
    # Change: scopes and limits.
    edit.locator("[data-limit=tokens_per_day]").fill("1000")
    edit.locator("[data-scope=execute]").uncheck()
    edit.get_by_test_id("key-save").click()
    expect(page.get_by_test_id("key-edit")).to_have_count(0)
    expect(row).to_contain_text("tokens_per_day 1000")
    got = httpx.get(f"{keyed.agent}/api/v1/keys/{key_id}", headers=ADMIN, timeout=30).json()
    assert got["scopes"] == ["inference"] and got["limits"]["tokens_per_day"] == 1000
    assert got["limits"]["requests_per_minute"] == 60

    # Rotate: a new secret, the old one refused.
    row.get_by_role("button", name="Rotate ci-bot").click()
    page.get_by_role("dialog").get_by_role("button", name="Rotate").click()
    expect(secret_text).to_have_text(re.compile(r"^ck-"))
    rotated = secret_text.inner_text().strip()
    assert rotated != secret
    assert httpx.get(keyed.agent + "/api/v1/usage", headers=bearer(rotated), timeout=30).status_code == 200
    deadline = time.monotonic() + 2
    while httpx.get(keyed.agent + "/api/v1/usage", headers=bearer(secret), timeout=30).status_code != 401:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    page.screenshot(path=str(shots / "keys-admin-rotated.png"))
    page.get_by_role("button", name="Done").click()

    # Revoke.
    row.get_by_role("button", name="Revoke ci-bot").click()
    page.get_by_role("dialog").get_by_role("button", name="Revoke").click()
    expect(row.locator(".badge")).to_have_text("revoked")
    deadline = time.monotonic() + 2
    while httpx.get(keyed.agent + "/api/v1/usage", headers=bearer(rotated), timeout=30).status_code != 401:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    page.screenshot(path=str(shots / "keys-admin-keys.png"))

    # Usage of a key: each limit, used and remaining.
    httpx.get(keyed.agent + "/api/v1/chats", headers=bearer(keys.alice), timeout=30)
    page.get_by_role("tab", name="Usage").click()
    page.get_by_test_id("usage-key").select_option(keys.alice_id)
    usage_row = page.get_by_test_id("usage-table").locator("[data-limit=requests_per_minute]")
    expect(usage_row).to_contain_text("1,000")
    used = int(usage_row.locator("td").nth(1).inner_text().replace(",", ""))
    assert used >= 1
    page.screenshot(path=str(shots / "keys-admin-usage.png"))

    # The audit log: what was just done, newest first.
    page.get_by_role("tab", name="Audit log").click()
    table = page.get_by_test_id("audit-table")
    expect(table.locator("tbody tr").first).to_have_attribute("data-action", "key.revoked")
    for action in ("key.created", "key.changed", "key.rotated", "key.revoked"):
        expect(table.locator(f"tr[data-action='{action}']").filter(has_text=f"key:{key_id}").first).to_be_visible()
    page.get_by_test_id("audit-action").select_option("key.rotated")
    expect(table.locator("tbody tr")).to_have_count(1)
    page.screenshot(path=str(shots / "keys-admin-audit.png"))


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_new_pages_have_no_serious_accessibility_violations(keyed: Servers, keys: Keys, context: Any, theme: str, shots: Path) -> None:
    if not AXE.exists():
        pytest.skip(f"axe-core is not installed: no {AXE} (run `cd ui && npm ci`)")
    axe = AXE.read_text(encoding="utf-8")
    found: dict[str, list[str]] = {}
    pg = context(theme)
    pg.goto(keyed.agent + "/#/status")
    expect(pg.get_by_test_id("key-prompt")).to_be_visible()
    found["sign-in"] = _serious(pg, axe)
    sign_in(pg, ADMIN_KEY)
    for route, ready in (("admin/keys", "keys-table"), ("admin/usage", "usage-key"), ("admin/audit", "audit-table")):
        pg.goto(f"{keyed.agent}/#/{route}")
        expect(pg.get_by_test_id(ready)).to_be_visible()
        pg.wait_for_timeout(300)
        found[route] = _serious(pg, axe)
    pg.goto(keyed.agent + "/#/chat")
    pg.get_by_test_id("chat-search").fill("penguins")
    expect(pg.get_by_test_id("search-count")).to_be_visible()
    found["chat search"] = _serious(pg, axe)
    scoped = context(theme)
    scoped.goto(keyed.agent + "/#/admin")
    sign_in(scoped, keys.alice)
    expect(scoped.get_by_test_id("not-allowed")).to_be_visible()
    found["not allowed"] = _serious(scoped, axe)
    scoped.screenshot(path=str(shots / f"keys-not-allowed-{theme}.png"))
    pg.goto(keyed.agent + "/#/admin/keys")
    expect(pg.get_by_test_id("keys-table")).to_be_visible()
    pg.screenshot(path=str(shots / f"keys-admin-{theme}.png"), full_page=True)
    bad = {k: v for k, v in found.items() if v}
    assert not bad, bad
    assert not pg.errors and not scoped.errors


def test_an_open_loopback_server_asks_for_no_key(servers: Servers, page: Any, shots: Path) -> None:
    """No admin key on loopback: no sign-in, every page as before, no admin page, no sign-out,
    and chats stay in the browser."""
    assert httpx.get(servers.agent + "/api/v1/usage").json()["open"] is True
    page.goto(servers.agent + "/#/chat")
    expect(page.get_by_test_id("model-picker")).to_have_value(MODEL)
    expect(page.get_by_text("They are kept in this browser")).to_be_visible()
    expect(page.get_by_test_id("key-prompt")).to_be_hidden()
    expect(page.get_by_test_id("sign-out")).to_have_count(0)
    expect(page.get_by_test_id("signed-in-as")).to_have_count(0)
    assert nav(page) == ["Playground", "Sessions", "Chat", "Models", "Agents", "Marketplace", "Status"]
    page.goto(servers.agent + "/#/admin")
    expect(page.get_by_test_id("not-allowed")).to_be_visible()
    page.screenshot(path=str(shots / "keys-open-server.png"))
