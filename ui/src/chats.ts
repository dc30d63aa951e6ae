import { ApiError, getJSON, isAbort, postJSON, send as request, streamEvents } from "./api";
import { whoami } from "./auth";
import { agentBase, inferenceBase } from "./config";

// Where chats are kept: on the agent server (`/api/v1/chats`, the signed-in key's tenant's)
// when it asks for a key, else in this browser (IndexedDB, database "conch-studio", store
// "chats"), as on an open single-user server or the inference server alone. On the first
// load signed in, the browser's chats are imported into the server's (then removed here, so
// they are imported once and a chat deleted on the server does not come back). Answers are
// generated here, outside the page's components, so a chat keeps streaming (and saving)
// while another page is shown.

export type Settings = { model: string; system: string; temperature: number; maxTokens: number; topP: number };
export type MsgStatus = "streaming" | "done" | "stopped" | "failed" | "interrupted";
export type Msg = {
  id: string;
  role: "user" | "assistant";
  content: string;
  at: number;
  status?: MsgStatus; // assistant messages
  error?: string;
  stats?: string;
  model?: string;
};
export type Chat = {
  id: string;
  title: string;
  renamed?: boolean;
  created: number;
  updated: number;
  settings: Settings;
  messages: Msg[];
  // Kept on the server: the id it had in this browser before it was imported, its version,
  // and whether only its summary has been read (`partial`: no messages yet).
  clientId?: string | null;
  version?: number;
  partial?: boolean;
  count?: number;
};

export const DEFAULTS: Settings = { model: "", system: "You are a helpful assistant.", temperature: 0.7, maxTokens: 256, topP: 1 };
const LAST = "conch.chat.settings"; // the settings a new chat starts with: the last ones used

export function lastSettings(): Settings {
  try {
    return { ...DEFAULTS, ...JSON.parse(localStorage.getItem(LAST) ?? "{}") };
  } catch {
    return { ...DEFAULTS };
  }
}

export function newId(prefix = "c"): string {
  return `${prefix}${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
}

// -- IndexedDB ----------------------------------------------------------------------------
let opened: Promise<IDBDatabase> | null = null;

function db(): Promise<IDBDatabase> {
  opened ??= new Promise((resolve, reject) => {
    const req = indexedDB.open("conch-studio", 1);
    req.onupgradeneeded = () => req.result.createObjectStore("chats", { keyPath: "id" });
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
  return opened;
}

async function store<T>(mode: IDBTransactionMode, op: (s: IDBObjectStore) => IDBRequest<T>): Promise<T> {
  const d = await db();
  return new Promise((resolve, reject) => {
    const tx = d.transaction("chats", mode);
    const req = op(tx.objectStore("chats"));
    tx.oncomplete = () => resolve(req.result);
    tx.onerror = tx.onabort = () => reject(tx.error ?? req.error);
  });
}

// -- the server ------------------------------------------------------------------------------
const API = `${agentBase ?? ""}/api/v1/chats`;
let onServer: boolean | null = null; // null: not decided yet
let deciding: Promise<boolean> | null = null;

/** Whether chats are kept on the server: decided once, by the signed-in key (api/v1/usage). */
function serverMode(): Promise<boolean> {
  deciding ??= whoami().then((w) => (onServer = agentBase != null && !!w && !w.open));
  return deciding;
}

export function keptOnServer(): boolean {
  return onServer === true;
}

type Summary = {
  id: string;
  title: string;
  renamed?: boolean;
  settings?: Partial<Settings>;
  messages?: Msg[];
  message_count?: number;
  client_id?: string | null;
  version?: number;
  created_at: string;
  updated_at: string;
  snippet?: string;
};

function fromServer(s: Summary): Chat {
  return {
    id: s.id,
    title: s.title,
    renamed: !!s.renamed,
    created: Date.parse(s.created_at),
    updated: Date.parse(s.updated_at),
    settings: { ...DEFAULTS, ...(s.settings ?? {}) },
    messages: s.messages ?? [],
    clientId: s.client_id ?? null,
    version: s.version,
    partial: !s.messages,
    count: s.message_count,
  };
}

function toServer(c: Chat) {
  return { title: c.title, renamed: !!c.renamed, settings: c.settings, messages: c.messages };
}

async function patchJSON<T>(url: string, body: unknown): Promise<T> {
  return (await request(url, { method: "PATCH", body: JSON.stringify(body) })).json();
}

/** The browser's chats, uploaded into the key's tenant's (once: then removed here). */
async function importLocal(): Promise<void> {
  let local: Chat[];
  try {
    local = await store<Chat[]>("readonly", (s) => s.getAll());
  } catch {
    return; // no IndexedDB here (a private window): nothing to import
  }
  if (!local.length) return;
  for (let i = 0; i < local.length; i += 500) await postJSON(`${API}/import`, { chats: local.slice(i, i + 500).map(settle) });
  const d = await db();
  await new Promise<void>((resolve, reject) => {
    const tx = d.transaction("chats", "readwrite");
    for (const c of local) tx.objectStore("chats").delete(c.id);
    tx.oncomplete = () => resolve();
    tx.onerror = tx.onabort = () => reject(tx.error);
  });
}

let listing: Promise<void> | null = null;

/** The server's list read (again): new and changed chats in, chats deleted elsewhere out;
 * a chat being written here keeps its copy. */
function readList(): Promise<void> {
  listing ??= (async () => {
    try {
      const body = await getJSON<{ total: number; chats: Summary[] }>(`${API}?limit=500`);
      const seen = new Set<string>();
      for (const s of body.chats) {
        seen.add(s.id);
        const have = cache.get(s.id);
        if (gone.has(s.id) || (have && (busy(s.id) || (have.version ?? 0) >= (s.version ?? 0)))) continue;
        cache.set(s.id, fromServer(s));
      }
      if (body.total <= body.chats.length) for (const id of [...cache.keys()]) if (!seen.has(id) && !busy(id)) cache.delete(id);
      loadedAll = true;
    } finally {
      listing = null;
    }
  })();
  return listing;
}

/** Read the list from the server again (a page shown: chats made in another browser). */
export function reloadList(): void {
  void serverMode().then((on) => {
    if (on && loadedAll) readList().then(emit, () => undefined);
  });
}

function busy(id: string): boolean {
  return running.has(id) || timers.has(id) || pushing.has(id);
}

// One write per chat at a time; a change made meanwhile is sent when it ends.
const pushing = new Map<string, Promise<void>>();
const pushAgain = new Set<string>();

function push(id: string): void {
  if (pushing.has(id)) return void pushAgain.add(id);
  const p = (async () => {
    do {
      pushAgain.delete(id);
      const c = cache.get(id);
      if (!c || gone.has(id)) return;
      const saved = await patchJSON<Summary>(`${API}/${encodeURIComponent(id)}`, toServer(c));
      const now = cache.get(id);
      if (now) cache.set(id, { ...now, version: saved.version });
    } while (pushAgain.has(id));
  })();
  pushing.set(id, p);
  p.then(
    () => (writeError = null),
    (e) => ((writeError = e), emit()),
  ).finally(() => pushing.delete(id));
}

/** Chats matching every word of `q`: the server's full-text search (best first, with a
 * snippet of the match), or, kept in this browser, the titles and messages that hold them. */
export async function searchChats(q: string, signal?: AbortSignal): Promise<(Chat & { snippet?: string })[]> {
  if (await serverMode()) {
    const body = await getJSON<{ chats: Summary[] }>(`${API}?limit=100&q=${encodeURIComponent(q)}`, signal);
    return body.chats.map((s) => ({ ...(cache.get(s.id) ?? fromServer(s)), snippet: s.snippet }));
  }
  const words = q.toLowerCase().split(/\s+/).filter(Boolean);
  const out: (Chat & { snippet?: string })[] = [];
  for (const c of await allChats()) {
    const texts = [c.title, ...c.messages.map((m) => m.content)];
    const all = texts.join("\n").toLowerCase();
    if (!words.every((w) => all.includes(w))) continue;
    const hit = texts.find((t) => t.toLowerCase().includes(words[0])) ?? "";
    const at = Math.max(0, hit.toLowerCase().indexOf(words[0]) - 30);
    out.push({ ...c, snippet: `${at ? "…" : ""}${hit.slice(at, at + 100)}` });
  }
  return out;
}

// -- the chats in memory, and who is watching them ------------------------------------------
const cache = new Map<string, Chat>();
const running = new Map<string, AbortController>();
const listeners = new Set<() => void>();
let loadedAll = false;

function emit() {
  listeners.forEach((fn) => fn());
}

export function subscribe(fn: () => void): () => void {
  listeners.add(fn);
  return () => void listeners.delete(fn);
}

/** A message left "streaming" by a page that was closed or reloaded: kept, marked as cut off. */
function settle(c: Chat): Chat {
  if (running.has(c.id) || !c.messages.some((m) => m.status === "streaming")) return c;
  return {
    ...c,
    messages: c.messages.map((m) =>
      m.status === "streaming" ? { ...m, status: "interrupted", error: "cut off: the page was closed or reloaded while this answer was being written" } : m,
    ),
  };
}

export async function allChats(): Promise<Chat[]> {
  if (!loadedAll && (await serverMode())) {
    await importLocal();
    await readList();
  }
  if (!loadedAll) {
    for (const c of await store<Chat[]>("readonly", (s) => s.getAll())) if (!cache.has(c.id) && !gone.has(c.id)) cache.set(c.id, settle(c));
    loadedAll = true;
  }
  return [...cache.values()].sort((a, b) => b.updated - a.updated);
}

export async function getChat(id: string): Promise<Chat | null> {
  if (await serverMode()) {
    await allChats();
    // An imported chat answers to the id it had in this browser too (its old links).
    const hit = cache.get(id) ?? [...cache.values()].find((c) => c.clientId === id);
    if (hit && !hit.partial) return hit;
    if (gone.has(id)) return null;
    try {
      const full = settle(fromServer(await getJSON<Summary>(`${API}/${encodeURIComponent(hit?.id ?? id)}`)));
      const now = cache.get(full.id);
      if (now && !now.partial) return now; // written here meanwhile
      cache.set(full.id, full);
      return full;
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) return null;
      throw e;
    }
  }
  const hit = cache.get(id);
  if (hit) return hit;
  if (gone.has(id)) return null;
  const c = await store<Chat | undefined>("readonly", (s) => s.get(id));
  if (!c || gone.has(id)) return null;
  const settled = settle(c);
  cache.set(id, settled);
  return settled;
}

// Writes: at once for a change made by the user, at most every 400 ms while an answer streams.
const timers = new Map<string, ReturnType<typeof setTimeout>>();
let writeError: unknown = null;

function write(id: string) {
  clearTimeout(timers.get(id));
  timers.delete(id);
  const c = cache.get(id);
  if (c && onServer) push(id);
  else if (c)
    store("readwrite", (s) => s.put(c)).then(
      () => (writeError = null),
      (e) => ((writeError = e), emit()),
    );
}

export function lastWriteError(): unknown {
  return writeError;
}

export function putChat(c: Chat, soon = false): void {
  cache.set(c.id, c);
  emit();
  if (!soon) write(c.id);
  else if (!timers.has(c.id)) timers.set(c.id, setTimeout(() => write(c.id), 400));
}

function update(id: string, fn: (c: Chat) => Chat, soon = false): Chat | null {
  const c = cache.get(id);
  if (!c) return null;
  const next = fn(c);
  putChat(next, soon);
  return next;
}

export function renameChat(id: string, title: string): void {
  update(id, (c) => ({ ...c, title: title.trim() || c.title, renamed: true }));
}

export function setSettings(id: string, patch: Partial<Settings>): void {
  update(id, (c) => ({ ...c, settings: { ...c.settings, ...patch } }));
  localStorage.setItem(LAST, JSON.stringify({ ...(cache.get(id)?.settings ?? {}), ...patch }));
}

const gone = new Set<string>(); // deleted here: a read that was under way must not bring it back

export async function deleteChat(id: string): Promise<void> {
  gone.add(id);
  running.get(id)?.abort();
  clearTimeout(timers.get(id));
  timers.delete(id);
  cache.delete(id);
  emit();
  if (onServer) {
    await pushing.get(id)?.catch(() => undefined);
    try {
      await request(`${API}/${encodeURIComponent(id)}`, { method: "DELETE" });
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 404)) throw e;
    }
  } else await store("readwrite", (s) => s.delete(id));
}

export function titleFrom(text: string): string {
  const line = text.trim().split("\n")[0];
  return line.length > 60 ? `${line.slice(0, 57)}…` : line || "New chat";
}

/** A chat made on its first message (an empty "New chat" is never stored). */
export async function createChat(settings: Settings, text: string): Promise<Chat> {
  const now = Date.now();
  let c: Chat = {
    id: newId(),
    title: titleFrom(text),
    created: now,
    updated: now,
    settings,
    messages: [{ id: newId("m"), role: "user", content: text, at: now }],
  };
  localStorage.setItem(LAST, JSON.stringify(settings));
  if (await serverMode()) {
    c = { ...fromServer(await postJSON<Summary>(API, toServer(c))), created: now, updated: now };
    cache.set(c.id, c);
    emit();
  } else putChat(c);
  return c;
}

// -- answers --------------------------------------------------------------------------------
export function isRunning(id: string): boolean {
  return running.has(id);
}

export function stop(id: string): void {
  running.get(id)?.abort();
}

/** Append a user message and answer it. */
export function send(id: string, text: string): void {
  update(id, (c) => ({ ...c, updated: Date.now(), messages: [...c.messages, { id: newId("m"), role: "user", content: text, at: Date.now() }] }));
  void answer(id);
}

/** The user message at `index` edited to `edited` and answered again: later messages go. */
export function redo(id: string, index: number, edited: string): void {
  update(id, (c) => {
    const keep = c.messages.slice(0, index + 1);
    keep[index] = { ...keep[index], content: edited, at: Date.now() };
    return { ...c, updated: Date.now(), messages: keep };
  });
  void answer(id);
}

/** Answer again in place of the assistant message at `index` (Retry, Regenerate), from the
 * messages before it; the messages after it are kept as they are. */
export function retry(id: string, index: number): void {
  const c = cache.get(id);
  if (c?.messages[index]?.role === "assistant") void answer(id, index);
}

/** What the model is sent: empty failed answers left out, and turns of the same role merged
 * (a question whose answer failed, then another question), as chat templates alternate. */
function history(msgs: Msg[]): { role: string; content: string }[] {
  const out: { role: string; content: string }[] = [];
  for (const m of msgs) {
    if (m.role === "assistant" && !m.content.trim()) continue;
    const prev = out[out.length - 1];
    if (prev && prev.role === m.role) prev.content += `\n\n${m.content}`;
    else out.push({ role: m.role, content: m.content });
  }
  return out;
}

/** Answer the chat's last message (streamed into a new assistant message), or, given `at`,
 * the messages before `at` into a new message in place of the one there. */
export async function answer(id: string, at?: number): Promise<void> {
  const chat = cache.get(id);
  if (!chat || running.has(id)) return;
  const { settings } = chat;
  const msgId = newId("m");
  const sent = history(at == null ? chat.messages : chat.messages.slice(0, at));
  const fresh: Msg = { id: msgId, role: "assistant", content: "", at: Date.now(), status: "streaming", model: settings.model };
  update(id, (c) => ({
    ...c,
    messages: at == null ? [...c.messages, fresh] : c.messages.map((m, i) => (i === at ? fresh : m)),
  }));
  const patch = (p: Partial<Msg>, soon = false) =>
    update(id, (c) => ({ ...c, updated: Date.now(), messages: c.messages.map((m) => (m.id === msgId ? { ...m, ...p } : m)) }), soon);
  const ctl = new AbortController();
  running.set(id, ctl);
  emit();
  const t0 = performance.now();
  let first: number | null = null;
  let chunks = 0;
  let text = "";
  let finished = false;
  let usage: { completion_tokens: number } | null = null;
  const rate = () => {
    const n = usage?.completion_tokens ?? chunks;
    const secs = first == null ? 0 : (performance.now() - first) / 1000;
    return `${n} tokens · ${secs > 0 ? (n / secs).toFixed(1) : "—"} tokens/s · first token ${first == null ? "—" : Math.round(first - t0)} ms`;
  };
  try {
    await streamEvents(
      `${inferenceBase}/v1/chat/completions`,
      {
        method: "POST",
        signal: ctl.signal,
        body: JSON.stringify({
          model: settings.model,
          messages: [...(settings.system.trim() ? [{ role: "system", content: settings.system }] : []), ...sent],
          temperature: settings.temperature,
          top_p: settings.topP,
          max_tokens: settings.maxTokens,
          stream: true,
          stream_options: { include_usage: true },
        }),
      },
      (ev) => {
        if (ev.data === "[DONE]") return void (finished = true);
        const chunk = JSON.parse(ev.data);
        if (chunk.error) throw new ApiError(chunk.error.status ?? 500, chunk.error.message, chunk.error.code ?? chunk.error.type);
        if (chunk.usage) usage = chunk.usage;
        if (chunk.choices?.[0]?.finish_reason) finished = true;
        const delta = chunk.choices?.[0]?.delta?.content;
        if (delta) {
          if (first == null) first = performance.now();
          chunks++;
          text += delta;
          patch({ content: text, stats: rate() }, true);
        }
      },
    );
    if (finished) patch({ status: "done", stats: rate() });
    else patch({ status: "failed", stats: rate(), error: "cut off: the server closed the stream before the answer was finished" });
  } catch (e) {
    if (isAbort(e)) patch({ status: "stopped", stats: `${rate()} · stopped` });
    else {
      const err = e as ApiError;
      const lost = !(err instanceof ApiError) || err.status === 0;
      const why = lost && text ? `cut off: the connection to the inference server was lost (${err.message})` : err.message;
      patch({ status: "failed", stats: text ? rate() : undefined, error: err.status ? `${err.status} · ${why}` : why });
    }
  } finally {
    running.delete(id);
    emit();
  }
}

// -- export ---------------------------------------------------------------------------------
export function toMarkdown(c: Chat): string {
  const s = c.settings;
  const lines = [
    `# ${c.title}`,
    "",
    `- model: ${s.model}`,
    `- temperature: ${s.temperature}, top_p: ${s.topP}, max tokens: ${s.maxTokens}`,
    `- created: ${new Date(c.created).toISOString()}`,
    "",
  ];
  if (s.system.trim()) lines.push("## system", "", s.system, "");
  for (const m of c.messages) {
    const mark = m.status && m.status !== "done" ? ` (${m.status}${m.error ? `: ${m.error}` : ""})` : "";
    lines.push(`## ${m.role}${mark}`, "", m.content, "");
  }
  return lines.join("\n");
}

export function download(name: string, type: string, text: string): void {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

export function fileName(c: Chat, ext: string): string {
  const slug = c.title.toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "").slice(0, 40) || "chat";
  return `${slug}.${ext}`;
}
