import { ApiError, del, getJSON, postJSON, send } from "./api";

// The agent server's sessions (docs/agent-server.md, "Sessions"): the resource, its files,
// and the playground's own session, kept in this browser.

export type Session = {
  id: string;
  status: string;
  created_at: string;
  last_used_at: string;
  expires_at: string;
  ttl_s: number;
  workspace_bytes: number;
  runs: number;
  allow_network?: boolean;
  allow_process?: boolean;
};
export type Binding = {
  name: string;
  type: string;
  kind?: string;
  mutable?: boolean;
  bytes?: number;
  preview?: string | null;
  length?: number | null;
  no_preview?: string;
};
export type FileEntry = { name: string; type: string; size: number; modified: string };
export type SessionInfo = Session & {
  bindings: Binding[];
  files: FileEntry[];
  state_bytes: number;
  disk_quota_bytes?: number;
  upload_max_bytes?: number;
};
export type Unsaved = { name: string; reason: string };

const BASE = "/api/v1/sessions";
const enc = encodeURIComponent;
/** A workspace path as URL segments: each name encoded, the slashes kept. */
const pathUrl = (id: string, path: string) => `${BASE}/${enc(id)}/files/${path.split("/").filter(Boolean).map(enc).join("/")}`;

export const createSession = () => postJSON<Session>(BASE, {});
export const listSessions = (signal?: AbortSignal, poll = false) => getJSON<Session[]>(`${BASE}?limit=200`, signal, poll);
export const describeSession = (id: string, signal?: AbortSignal, poll = false) =>
  getJSON<SessionInfo>(`${BASE}/${enc(id)}?preview=true`, signal, poll);
export const pauseSession = (id: string) => postJSON<Session>(`${BASE}/${enc(id)}/pause`);
export const deleteSession = (id: string) => del(`${BASE}/${enc(id)}`);
export const listFiles = (id: string, dir: string, signal?: AbortSignal) =>
  getJSON<FileEntry[]>(`${BASE}/${enc(id)}/files?dir=${enc(dir || ".")}`, signal);
export const deleteFile = (id: string, path: string, recursive = false) =>
  del(pathUrl(id, path) + (recursive ? "?recursive=true" : ""));

export async function uploadFile(id: string, path: string, file: Blob): Promise<FileEntry> {
  const res = await send(pathUrl(id, path), {
    method: "PUT",
    body: file,
    headers: { "Content-Type": file.type || "application/octet-stream" },
  });
  return res.json();
}

/** Saves a workspace file through the browser's download: read with the key (a plain link
 * could not send it), handed over as a blob. */
export async function downloadFile(id: string, path: string): Promise<void> {
  const blob = await (await send(pathUrl(id, path))).blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = path.split("/").pop() || "file";
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/** A session that is not there any more (deleted, or expired after its TTL). */
export function isGone(e: unknown): boolean {
  return e instanceof ApiError && e.status === 404;
}

// -- the playground's session: kept in this browser (as the editor's text is) ---------------
const ID = "conch.playground.session";
const STATELESS = "conch.playground.stateless";

export const playgroundSession = {
  id: (): string | null => localStorage.getItem(ID),
  set(id: string | null) {
    if (id) localStorage.setItem(ID, id);
    else localStorage.removeItem(ID);
    dispatchEvent(new CustomEvent("conch-session"));
  },
  stateless: (): boolean => localStorage.getItem(STATELESS) === "1",
  setStateless(on: boolean) {
    if (on) localStorage.setItem(STATELESS, "1");
    else localStorage.removeItem(STATELESS);
    dispatchEvent(new CustomEvent("conch-session"));
  },
};

/** "1.2 KiB", "512 MiB": powers of 1024, as the quota settings (`session_disk_mb`) are. */
export function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v >= 100 ? Math.round(v) : v.toFixed(1).replace(/\.0$/, "")} ${units[i]}`;
}

/** "12 s ago", "3 min ago", "2 h ago", or the date. */
export function ago(iso: string, now = Date.now()): string {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return iso;
  const s = Math.max(0, Math.round((now - t) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(t).toLocaleString();
}

export const shortId = (id: string) => (id.length > 14 ? `${id.slice(0, 9)}…${id.slice(-4)}` : id);
