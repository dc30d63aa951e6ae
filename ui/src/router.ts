import { useEffect, useState } from "preact/hooks";

// Hash routes: `#/<page>/<segment>/…?key=value`. Every page and object has one (a chat, a
// task, a workflow, a model, a marketplace agent), so links work after a reload and Back goes
// back. Ids are URI-encoded inside one segment ("a/b" is `a%2Fb`).

export type Route = { page: string; parts: string[]; query: URLSearchParams };

export function parseHash(hash: string = location.hash): Route {
  const raw = hash.replace(/^#\/?/, "");
  const q = raw.indexOf("?");
  const path = q < 0 ? raw : raw.slice(0, q);
  const parts = path
    .split("/")
    .filter(Boolean)
    .map((s) => {
      try {
        return decodeURIComponent(s);
      } catch {
        return s;
      }
    });
  return { page: parts[0] ?? "", parts: parts.slice(1), query: new URLSearchParams(q < 0 ? "" : raw.slice(q + 1)) };
}

/** `href` for a route: `link("agents", "tasks", id)` → `#/agents/tasks/<id>`. */
export function link(...parts: string[]): string {
  return `#/${parts.map(encodeURIComponent).join("/")}`;
}

const listeners = new Set<() => void>();
addEventListener("hashchange", () => listeners.forEach((fn) => fn()));

/** Go to a route: a new history entry (Back returns here), or `replace` the current one (for
 * a chat that just got its id, or a tab moved to by the arrow keys). */
export function navigate(href: string, replace = false): void {
  if (href === location.hash) return;
  if (replace) {
    history.replaceState(history.state, "", href);
    listeners.forEach((fn) => fn());
  } else location.hash = href;
}

export function useRoute(): Route {
  const [route, setRoute] = useState(() => parseHash());
  useEffect(() => {
    const on = () => setRoute(parseHash());
    listeners.add(on);
    return () => void listeners.delete(on);
  }, []);
  return route;
}

/** "1 model", "2 models". */
export function plural(n: number, one: string, many = `${one}s`): string {
  return `${n.toLocaleString()} ${n === 1 ? one : many}`;
}
