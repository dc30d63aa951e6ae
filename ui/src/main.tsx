import type { ComponentType } from "preact";
import { render } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { getJSON, listOf, onKeyPrompt, prefetchJSON, provideKey } from "./api";
import { can, signedIn, signOut, useWho, type Who } from "./auth";
import { NotFound } from "./components/NotFound";
import { agentBase, config } from "./config";
import type { Task } from "./orch";
import { parseHash, plural, useRoute } from "./router";
import "./style.css";

// `sub`: the page has routes of its own under `#/<id>/…` (objects, tabs); the others have none.
// `scope`: what a key needs to use the page (docs/security.md); a key without it does not see it.
// `needs`: the server page whose presence shows this one (the sessions list goes with the playground).
type Page = { id: string; title: string; sub?: boolean; needs?: string; scope?: string; load: () => Promise<ComponentType> };

// The scope each page needs (a page another part adds may name its own `scope`).
const SCOPES: Record<string, string> = { playground: "execute", sessions: "sessions", chat: "inference", models: "inference", agents: "orchestration" };

// Each page is its own chunk, loaded when first shown: the first paint only pays for one.
const PAGES: Page[] = [
  { id: "playground", title: "Playground", load: () => import("./pages/Playground").then((m) => m.Playground) },
  // Sessions are the agent server's, shown wherever the playground is (`needs`): the server's
  // list of pages is unchanged.
  { id: "sessions", sub: true, needs: "playground", title: "Sessions", load: () => import("./pages/Sessions").then((m) => m.Sessions) },
  { id: "chat", sub: true, title: "Chat", load: () => import("./pages/Chat").then((m) => m.Chat) },
  { id: "models", sub: true, title: "Models", load: () => import("./pages/Models").then((m) => m.Models) },
  { id: "agents", sub: true, title: "Agents", load: () => import("./pages/Agents").then((m) => m.Agents) },
  { id: "marketplace", sub: true, title: "Marketplace", load: () => import("./pages/Marketplace").then((m) => m.Marketplace) },
  { id: "status", title: "Status", load: () => import("./pages/Status").then((m) => m.Status) },
].filter((p) => config.pages.includes(p.needs ?? p.id));
for (const p of PAGES) p.scope ??= SCOPES[p.id];
// Keys, usage and the audit log: the agent server's, shown to an admin key only.
if (agentBase != null)
  PAGES.push({ id: "admin", sub: true, title: "Admin", scope: "admin", load: () => import("./pages/Admin").then((m) => m.Admin) });

/** The pages `who` may see: all while it is not known; the admin page only to an admin
 * signed in with a key (an open server keeps the studio as it was before keys). */
function visible(who: Who | null | undefined): Page[] {
  return PAGES.filter((p) => (p.id === "admin" ? !!who?.admin && signedIn(who) : can(p.scope, who)));
}

const loaded = new Map<string, ComponentType>();

function PageView({ page }: { page: Page }) {
  const [View, setView] = useState<ComponentType | null>(() => loaded.get(page.id) ?? null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    if (loaded.has(page.id)) return setView(() => loaded.get(page.id)!);
    page.load().then(
      (c) => (loaded.set(page.id, c), setView(() => c)),
      (e) => setError(String(e)),
    );
  }, [page.id]);
  if (error) return <div class="error-box">could not load this page: {error}</div>;
  return View ? <View /> : <div class="muted">loading…</div>;
}

/** The page a route shows: the first page for `#/` (or no hash), null for an unknown one. */
function pageOf(id: string, pages: Page[] = PAGES): Page | null {
  if (!id) return pages[0] ?? null;
  const page = pages.find((p) => p.id === id) ?? null;
  return page && (page.sub || parseHash().parts.length === 0) ? page : null;
}

/** A page of this server the signed-in key may not use: says which scope it needs. */
function NotAllowed({ page }: { page: Page }) {
  return (
    <section class="pane not-found" role="region" aria-labelledby="na-title" data-testid="not-allowed">
      <h1 id="na-title">{page.title}: not allowed for this key</h1>
      <p>
        This page needs a key with the <code>{page.scope}</code> scope. Ask an admin for one, or sign out and sign in with another key.
      </p>
    </section>
  );
}

type Theme = "auto" | "light" | "dark";

function useTheme(): [Theme, () => void] {
  const [theme, setTheme] = useState<Theme>((localStorage.getItem("conch.theme") as Theme) ?? "auto");
  useEffect(() => {
    if (theme === "auto") delete document.documentElement.dataset.theme;
    else document.documentElement.dataset.theme = theme;
    localStorage.setItem("conch.theme", theme);
  }, [theme]);
  const next = () => setTheme((t) => (t === "auto" ? "light" : t === "light" ? "dark" : "auto"));
  return [theme, next];
}

/** The sign-in form: asked for when a server answers 401 (a key is needed). */
function KeyPrompt() {
  const [asking, setAsking] = useState(false);
  const [value, setValue] = useState("");
  const [remember, setRemember] = useState(false);
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => onKeyPrompt(setAsking), []);
  useEffect(() => {
    const d = ref.current;
    if (!d) return;
    if (asking && !d.open) d.showModal();
    if (!asking && d.open) d.close();
  }, [asking]);
  return (
    <dialog ref={ref} class="dialog" aria-labelledby="key-title" onCancel={(e) => (e.preventDefault(), provideKey(null))} data-testid="key-prompt">
      <form
        method="dialog"
        onSubmit={(e) => {
          e.preventDefault();
          provideKey(value.trim() || null, remember);
          setValue("");
        }}
      >
        <h3 id="key-title">Sign in</h3>
        <p class="small">This server asks for an API key (ck-…). The studio sends it with every request to the agent and inference servers.</p>
        <label>
          API key
          <input type="password" autocomplete="off" value={value} onInput={(e) => setValue((e.currentTarget as HTMLInputElement).value)} autofocus data-testid="key-input" />
        </label>
        <label class="check">
          <input type="checkbox" checked={remember} onChange={(e) => setRemember((e.currentTarget as HTMLInputElement).checked)} data-testid="key-remember" />
          Keep me signed in on this browser (otherwise until this tab closes)
        </label>
        <div class="row end">
          <button type="button" onClick={() => provideKey(null)}>
            Cancel
          </button>
          <button type="submit" class="primary" data-testid="sign-in">
            Sign in
          </button>
        </div>
      </form>
    </dialog>
  );
}

/** Who is signed in, and the way out. */
function SignedIn({ who }: { who: Who }) {
  const label = `Signed in as ${who.key.name}${who.key.tenant ? ` (tenant ${who.key.tenant})` : ""}`;
  return (
    <>
      <span class="muted small who" title={`${label}; scopes: ${who.scopes.join(", ") || "none"}`} data-testid="signed-in-as">
        {who.key.name}
        {who.key.tenant ? ` · ${who.key.tenant}` : ""}
      </span>
      <button type="button" class="small" onClick={signOut} data-testid="sign-out">
        Sign out
      </button>
    </>
  );
}

/** What waits for a person: calls to decide, in how many tasks. */
export type Waiting = { calls: number; tasks: number };

/** A link to the approvals inbox with the number of calls waiting for a decision (a task
 * waiting on 3 calls counts 3). The orchestration metrics are polled every 5 s and the
 * waiting tasks read only while some wait, as the metrics count tasks, not calls (both marked
 * as polling: left out of the request rates); the inbox, when it reloads, tells the badge at once. */
function ApprovalsLink() {
  const [waiting, setWaiting] = useState<Waiting | null>(null);
  useEffect(() => {
    let stop = false;
    const poll = async () => {
      if (document.visibilityState !== "visible") return;
      try {
        const m = await getJSON<{ waiting_tasks?: number }>("/api/v1/orchestration/metrics", undefined, true);
        const tasks = typeof m?.waiting_tasks === "number" ? m.waiting_tasks : null;
        if (!tasks) return void (!stop && setWaiting(tasks == null ? null : { calls: 0, tasks: 0 }));
        const body = await getJSON("/api/v1/orchestration/tasks?status=waiting&limit=200", undefined, true);
        const list = listOf<Task>(body, "tasks").filter((t) => t.status === "waiting");
        if (!stop) setWaiting({ calls: list.reduce((n, t) => n + (t.pending?.length ?? 0), 0), tasks: list.length });
      } catch {
        // down or not there: keep the last count
      }
    };
    void poll();
    const id = setInterval(poll, 5000);
    const on = (e: Event) => setWaiting((e as CustomEvent<Waiting>).detail);
    addEventListener("conch-approvals", on);
    return () => {
      stop = true;
      clearInterval(id);
      removeEventListener("conch-approvals", on);
    };
  }, []);
  const calls = waiting?.calls ?? 0;
  const label = calls
    ? `Approvals: ${plural(calls, "call")} waiting for a decision, in ${plural(waiting!.tasks, "task")}`
    : "Approvals: no call waiting for a decision";
  return (
    <a class="approvals-link" href="#/agents/approvals" aria-label={label} title={label} data-testid="approvals-link">
      Approvals
      {/* The space keeps "Approvals 3" two words, as the name says them (WCAG 2.5.3). */}
      {calls ? " " : null}
      {calls ? (
        <span class="nav-badge" data-testid="approvals-count">
          {calls}
        </span>
      ) : null}
    </a>
  );
}

/** The header's height as `--top-h` on the root: a page that fills the screen below it (a
 * chat on a phone) and what is scrolled into view under it (`scroll-margin-top`) read it. The
 * header wraps onto two lines on a phone, so it is measured, not assumed. */
function useHeaderHeight(ref: { current: HTMLElement | null }) {
  useEffect(() => {
    const el = ref.current;
    if (!el) return;
    const set = () => document.documentElement.style.setProperty("--top-h", `${Math.ceil(el.getBoundingClientRect().height)}px`);
    set();
    if (typeof ResizeObserver === "undefined") return;
    const ro = new ResizeObserver(set);
    ro.observe(el);
    return () => ro.disconnect();
  }, []);
}

function App() {
  const route = useRoute();
  const [theme, nextTheme] = useTheme();
  const who = useWho();
  const pages = visible(who);
  const header = useRef<HTMLElement>(null);
  useHeaderHeight(header);
  const current = pageOf(route.page, pages);
  // A page this server has that the signed-in key may not use.
  const barred = current ? null : pageOf(route.page);
  const page = current?.id ?? (barred ? "not-allowed" : "not-found");
  useEffect(() => {
    document.title = `${current ? current.title : barred ? barred.title : "Not found"} · conch studio`;
    // A new page starts at the top (a sub-route of the same page keeps its scroll).
    scrollTo(0, 0);
  }, [page]);
  return (
    <>
      <a class="skip" href="#main">
        Skip to content
      </a>
      <header class="top" ref={header}>
        <span class="brand">
          conch <span class="muted">studio</span>
        </span>
        <nav aria-label="Pages">
          {pages.map((p) => (
            <a key={p.id} href={`#/${p.id}`} aria-current={p.id === page ? "page" : undefined}>
              {p.title}
            </a>
          ))}
        </nav>
        <div class="top-actions">
          {config.pages.includes("agents") && can("orchestration", who) && <ApprovalsLink />}
          {who && signedIn(who) && <SignedIn who={who} />}
          <button type="button" class="small" onClick={nextTheme} aria-label={`Theme: ${theme}`} title="Theme: auto, light, dark">
            {theme === "auto" ? "◐ auto" : theme === "light" ? "☀ light" : "☾ dark"}
          </button>
          <span class="muted small">v{config.version}</span>
        </div>
      </header>
      <main id="main" tabIndex={-1} data-page={page}>
        {current ? (
          <PageView key={page} page={current} />
        ) : barred ? (
          who === undefined ? <div class="muted">loading…</div> : <NotAllowed page={barred} />
        ) : (
          <NotFound pages={pages} />
        )}
      </main>
      <KeyPrompt />
    </>
  );
}

// The playground's first request goes out while its code loads.
if (pageOf(parseHash().page)?.id === "playground") prefetchJSON("/api/v1/builtins");
render(<App />, document.getElementById("app")!);
(window as any).__conchStudioReady = performance.now();
