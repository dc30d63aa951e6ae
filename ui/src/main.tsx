import { render } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { apiKey, forgetKey, onKeyPrompt, provideKey } from "./api";
import { config } from "./config";
import { Agents } from "./pages/Agents";
import { Chat } from "./pages/Chat";
import { Marketplace } from "./pages/Marketplace";
import { Models } from "./pages/Models";
import { Playground } from "./pages/Playground";
import { Status } from "./pages/Status";
import "./style.css";

const PAGES = [
  { id: "playground", title: "Playground", view: Playground },
  { id: "chat", title: "Chat", view: Chat },
  { id: "models", title: "Models", view: Models },
  { id: "agents", title: "Agents", view: Agents },
  { id: "marketplace", title: "Marketplace", view: Marketplace },
  { id: "status", title: "Status", view: Status },
].filter((p) => config.pages.includes(p.id));

function currentPage(): string {
  const id = location.hash.replace(/^#\/?/, "");
  return PAGES.some((p) => p.id === id) ? id : PAGES[0]?.id ?? "status";
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

function App() {
  const [page, setPage] = useState(currentPage());
  const [theme, nextTheme] = useTheme();
  const [, force] = useState(0);
  useEffect(() => {
    const on = () => setPage(currentPage());
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  const View = PAGES.find((p) => p.id === page)?.view ?? (() => null);
  return (
    <>
      <a class="skip" href="#main">
        Skip to content
      </a>
      <header class="top">
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
        <View key={page} />
      </main>
      <KeyPrompt />
    </>
  );
}

render(<App />, document.getElementById("app")!);
(window as any).__conchStudioReady = performance.now();
