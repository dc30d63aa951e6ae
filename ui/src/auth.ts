import { useEffect, useState } from "preact/hooks";
import { ApiError, apiKey, forgetKey, getJSON } from "./api";
import { agentBase } from "./config";

// Who the studio runs as: the signed-in key's scopes, read from the agent server's
// `GET /api/v1/usage` (any key may read its own), so that the studio shows only what the key
// may do. An open server (loopback, no admin key) needs no sign-in: everything is shown, as
// before keys existed. The inference server alone has no such route: every page is shown,
// and a refusal says which scope is missing.

export type Who = {
  key: { id: string; name: string; tenant: string | null };
  scopes: string[];
  admin: boolean;
  /** The server needs no key. */
  open: boolean;
};

let who: Promise<Who | null> | null = null;
let known: Who | null | undefined; // undefined: not read yet
const listeners = new Set<() => void>();

/** The signed-in key (null: not known here — the inference server alone, or an older agent
 * server); asks for the key first when the server wants one. */
export function whoami(): Promise<Who | null> {
  who ??= (agentBase == null ? Promise.resolve(null) : getJSON<Who>(`${agentBase}/api/v1/usage`))
    .then(
      (w) => (w && Array.isArray(w.scopes) ? w : null),
      (e) => {
        // Not signed in (cancelled, or a wrong key): asked again on the next read.
        if (e instanceof ApiError && e.status === 401) who = null;
        return null;
      },
    )
    .then((w) => {
      known = w;
      listeners.forEach((fn) => fn());
      return w;
    });
  return who;
}

/** May the key do `scope`? Yes while nothing is known (the server will say). */
export function can(scope: string | null | undefined, w: Who | null | undefined = known): boolean {
  if (!scope || !w) return true;
  return w.admin || w.scopes.includes(scope);
}

/** Signed in with a key the server needs (not an open server). */
export function signedIn(w: Who | null | undefined = known): boolean {
  return !!w && !w.open && !!apiKey();
}

/** The signed-in key, re-rendering when it becomes known. */
export function useWho(): Who | null | undefined {
  const [w, setW] = useState(known);
  useEffect(() => {
    const on = () => setW(known);
    listeners.add(on);
    void whoami().then(on);
    return () => void listeners.delete(on);
  }, []);
  return w;
}

/** Forget the key and start again: the next request asks for one. The page is loaded
 * again, so that nothing of the previous key's (chats, lists) stays on screen. */
export function signOut(): void {
  forgetKey();
  location.hash = "#/";
  location.reload();
}
