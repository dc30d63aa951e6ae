import { createParser, type EventSourceMessage } from "eventsource-parser";

const KEY = "conch.apiKey";

/** An answer the UI has to show: status, a message taken from either server's error shape. */
export class ApiError extends Error {
  status: number;
  kind: string;
  field: string | null;
  constructor(status: number, message: string, kind = "", field: string | null = null) {
    super(message);
    this.status = status;
    this.kind = kind;
    this.field = field;
  }
  get notAvailable(): boolean {
    return this.status === 404 || this.status === 405 || this.status === 501;
  }
}

// -- the key: asked for on a 401 (the sign-in form), sent as a bearer to both servers ------
// Kept for this tab's session (sessionStorage), or, when the person asks to stay signed in,
// in this browser (localStorage) until they sign out.

type KeyWaiter = { resolve: (key: string) => void; reject: (e: Error) => void };
let waiters: KeyWaiter[] = [];
const keyListeners = new Set<(asking: boolean) => void>();

export function apiKey(): string | null {
  return sessionStorage.getItem(KEY) ?? localStorage.getItem(KEY);
}

export function onKeyPrompt(fn: (asking: boolean) => void): () => void {
  keyListeners.add(fn);
  if (waiters.length) fn(true); // a request asked before the prompt was on screen
  return () => keyListeners.delete(fn);
}

function askForKey(): Promise<string> {
  return new Promise((resolve, reject) => {
    waiters.push({ resolve, reject });
    if (waiters.length === 1) keyListeners.forEach((fn) => fn(true));
  });
}

/** The key the person typed (`null`: they cancelled); `remember` keeps it in this browser
 * beyond the tab's session. Every request waiting for it goes again with it. */
export function provideKey(key: string | null, remember = false): void {
  const ws = waiters;
  waiters = [];
  keyListeners.forEach((fn) => fn(false));
  if (key) {
    forgetKey();
    (remember ? localStorage : sessionStorage).setItem(KEY, key);
    ws.forEach((w) => w.resolve(key));
  } else {
    ws.forEach((w) => w.reject(new ApiError(401, "an API key is needed to use this server")));
  }
}

export function forgetKey(): void {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
}

// -- requests -------------------------------------------------------------------------------

function headers(body: boolean): HeadersInit {
  const h: Record<string, string> = {};
  const key = apiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  if (body) h["Content-Type"] = "application/json";
  return h;
}

async function errorOf(res: Response): Promise<ApiError> {
  let message = `${res.status} ${res.statusText}`;
  let kind = "";
  let field: string | null = null;
  try {
    const body = await res.json();
    const err = body?.error ?? body;
    if (typeof err === "string") message = err;
    else if (err && typeof err === "object") {
      message = String(err.message ?? err.detail ?? message);
      kind = String(err.kind ?? err.type ?? err.code ?? "");
      field = err.field ?? err.param ?? err.where ?? null;
    }
    if (typeof body?.detail === "string") message = body.detail;
  } catch {
    /* not JSON: keep the status line */
  }
  return new ApiError(res.status, message, kind, field);
}

/** fetch with the session's key; a 401 asks for the key and tries once more. */
export async function send(url: string, init: RequestInit = {}, retried = false): Promise<Response> {
  let res: Response;
  const sent = apiKey();
  try {
    res = await fetch(url, { ...init, headers: { ...headers(init.body != null), ...(init.headers ?? {}) } });
  } catch (e) {
    if ((e as Error).name === "AbortError") throw e;
    throw new ApiError(0, `cannot reach ${url.startsWith("http") ? new URL(url).origin : "the server"}`, "NetworkError");
  }
  if (res.status === 401) {
    // Sent before the person signed in (its answer came after): it goes again with the key
    // rather than asking for one a second time.
    const now = apiKey();
    if (now && now !== sent) return send(url, init, retried);
    // A refused key is dropped, so that the next request asks again instead of reusing it.
    if (retried) forgetKey();
    else {
      await askForKey();
      return send(url, init, true);
    }
  }
  if (!res.ok) throw await errorOf(res);
  return res;
}

/** The header that marks a request as this studio's polling (a status sample, a badge, an
 * inbox read again): the servers leave such requests out of their request rates
 * (conch.web.common.history, docs/studio.md). Only requests made on a timer carry it. */
export const POLL = { "X-Conch-Poll": "studio" };

export async function getJSON<T = any>(url: string, signal?: AbortSignal, poll = false): Promise<T> {
  return (await send(url, { signal, headers: poll ? POLL : undefined })).json();
}

export async function postJSON<T = any>(url: string, body?: unknown, signal?: AbortSignal): Promise<T> {
  const res = await send(url, { method: "POST", body: body === undefined ? undefined : JSON.stringify(body), signal });
  const text = await res.text();
  return (text ? JSON.parse(text) : null) as T;
}

export async function del<T = any>(url: string): Promise<T> {
  return (await send(url, { method: "DELETE" })).json();
}

export async function getText(url: string, signal?: AbortSignal): Promise<string> {
  return (await send(url, { signal })).text();
}

/** Server-Sent Events over fetch (EventSource cannot send a bearer key nor POST a body). */
export async function streamEvents(
  url: string,
  init: RequestInit,
  onEvent: (ev: EventSourceMessage) => void,
): Promise<void> {
  const res = await send(url, { ...init, headers: { Accept: "text/event-stream", ...(init.headers ?? {}) } });
  if (!res.body) return;
  const parser = createParser({ onEvent });
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      parser.feed(value);
    }
  } finally {
    reader.releaseLock();
  }
}

export function isAbort(e: unknown): boolean {
  return (e as Error)?.name === "AbortError";
}

/** The list in an answer that may be a bare array or wrapped ({tasks: [...]}, {data: [...]}). */
export function listOf<T = any>(body: any, ...keys: string[]): T[] {
  if (Array.isArray(body)) return body;
  for (const k of [...keys, "data", "items", "results"]) if (Array.isArray(body?.[k])) return body[k];
  return [];
}

// -- prefetch: a request started before the page that needs it is loaded --------------------
const early = new Map<string, Promise<unknown>>();

export function prefetchJSON(url: string): void {
  const p = getJSON(url);
  p.catch(() => undefined); // the page that takes it handles the error
  early.set(url, p);
}

/** The prefetched answer for `url` when there is one (taken once), else a new request. */
export function getJSONOnce<T = any>(url: string, signal?: AbortSignal): Promise<T> {
  const p = early.get(url);
  if (p) {
    early.delete(url);
    return p as Promise<T>;
  }
  return getJSON<T>(url, signal);
}
