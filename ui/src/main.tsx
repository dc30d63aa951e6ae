import type { ComponentType } from "preact";
import { render } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { apiKey, forgetKey, getJSON, listOf, onKeyPrompt, prefetchJSON, provideKey } from "./api";
import { NotFound } from "./components/NotFound";
import { config } from "./config";
import type { Task } from "./orch";
import { parseHash, plural, useRoute } from "./router";
import "./style.css";

// `sub`: the page has routes of its own under `#/<id>/…` (objects, tabs); the others have none.
type Page = { id: string; title: string; sub?: boolean; needs?: string; load: () => Promise<ComponentType> };

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
function pageOf(id: string): Page | null {
  if (!id) return PAGES[0] ?? null;
  const page = PAGES.find((p) => p.id === id) ?? null;
  return page && (page.sub || parseHash().parts.length === 0) ? page : null;
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

function KeyPrompt() {
  const [asking, setAsking] = useState(false);
  const [value, setValue] = useState("");
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
          provideKey(value.trim() || null);
          setValue("");
        }}
      >
        <h3 id="key-title">API key needed</h3>
        <p class="small">This server asks for a key. It is kept for this browser tab's session only.</p>
        <label>
          API key
          <input type="password" autocomplete="off" value={value} onInput={(e) => setValue((e.currentTarget as HTMLInputElement).value)} autofocus data-testid="key-input" />
        </label>
        <div class="row end">
          <button type="button" onClick={() => provideKey(null)}>
            Cancel
          </button>
          <button type="submit" class="primary">
            Use key
          </button>
        </div>
      </form>
    </dialog>
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
  const [, force] = useState(0);
  const header = useRef<HTMLElement>(null);
  useHeaderHeight(header);
  const current = pageOf(route.page);
  const page = current?.id ?? "not-found";
  useEffect(() => {
    document.title = `${current ? current.title : "Not found"} · conch studio`;
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
          {PAGES.map((p) => (
            <a key={p.id} href={`#/${p.id}`} aria-current={p.id === page ? "page" : undefined}>
              {p.title}
            </a>
          ))}
        </nav>
        <div class="top-actions">
          {config.pages.includes("agents") && <ApprovalsLink />}
          {apiKey() && (
            <button type="button" class="small" onClick={() => (forgetKey(), force((n) => n + 1))} title="Forget the API key of this session">
              Forget key
            </button>
          )}
          <button type="button" class="small" onClick={nextTheme} aria-label={`Theme: ${theme}`} title="Theme: auto, light, dark">
            {theme === "auto" ? "◐ auto" : theme === "light" ? "☀ light" : "☾ dark"}
          </button>
          <span class="muted small">v{config.version}</span>
        </div>
      </header>
      <main id="main" tabIndex={-1} data-page={page}>
        {current ? <PageView key={page} page={current} /> : <NotFound pages={PAGES} />}
      </main>
      <KeyPrompt />
    </>
  );
}

// The playground's first request goes out while its code loads.
if (pageOf(parseHash().page)?.id === "playground") prefetchJSON("/api/v1/builtins");
render(<App />, document.getElementById("app")!);
(window as any).__conchStudioReady = performance.now();
