import type { ComponentChildren } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, isAbort } from "../api";

/** Loads once (and again when `deps` change), with an AbortController per load. `reload()`
 * loads again; `poll()` too, on a timer: `load` is told (its second argument), so that the
 * request can carry the polling header (api.ts, POLL). */
export function useLoad<T>(load: (signal: AbortSignal, poll: boolean) => Promise<T>, deps: unknown[] = []) {
  const [state, setState] = useState<{ data?: T; error?: unknown; loading: boolean }>({ loading: true });
  const [tick, setTick] = useState(0);
  const polling = useRef(false);
  useEffect(() => {
    const ctl = new AbortController();
    setState((s) => ({ ...s, loading: true }));
    const poll = polling.current;
    polling.current = false;
    load(ctl.signal, poll).then(
      (data) => setState({ data, loading: false }),
      (error) => !isAbort(error) && setState({ error, loading: false }),
    );
    return () => ctl.abort();
  }, [...deps, tick]);
  return {
    ...state,
    reload: () => setTick((t) => t + 1),
    poll: () => {
      polling.current = true;
      setTick((t) => t + 1);
    },
  };
}

/** Brings `ref`'s element into view when it appears (or `key` changes) and it is not in view:
 * an object opened from a list below it (a phone shows one column) or beside it, scrolled
 * away. Its `scroll-margin-top` keeps it clear of the sticky header. */
export function useIntoView(ref: { current: HTMLElement | null }, key: unknown) {
  useEffect(() => {
    const el = ref.current;
    if (!el) return;
    const top = el.getBoundingClientRect().top;
    const header = parseFloat(getComputedStyle(document.documentElement).getPropertyValue("--top-h")) || 0;
    if (top < header || top > innerHeight - 80) el.scrollIntoView({ block: "start" });
  }, [key]);
}

/** Runs `fn` every `ms` while the page is visible. */
export function useInterval(fn: () => void, ms: number) {
  const saved = useRef(fn);
  saved.current = fn;
  useEffect(() => {
    const id = setInterval(() => document.visibilityState === "visible" && saved.current(), ms);
    return () => clearInterval(id);
  }, [ms]);
}

/** A table's column headers: a name, or `{ name, num }` (a right-aligned number column),
 * `{ name, hidden }` (named for screen readers only, as a column of buttons). */
export type Column = string | { name: string; num?: boolean; hidden?: boolean };

export function Head({ cols }: { cols: Column[] }) {
  return (
    <thead>
      <tr>
        {cols.map((c) => {
          const col = typeof c === "string" ? { name: c } : c;
          return (
            <th key={col.name} scope="col" class={col.num ? "num" : undefined}>
              {col.hidden ? <span class="sr-only">{col.name}</span> : col.name}
            </th>
          );
        })}
      </tr>
    </thead>
  );
}

export function NotAvailable({ what, error }: { what: string; error?: unknown }) {
  const e = error as ApiError | undefined;
  return (
    <div class="notice" role="status" data-testid="not-available">
      <strong>{what} is not available on this server.</strong>
      <p>
        {e?.status === 0
          ? e.message
          : `The server answered ${e?.status ?? 404} for these routes: this conch build does not include them yet.`}
      </p>
    </div>
  );
}

export function ErrorBox({ error }: { error: unknown }) {
  if (error == null) return null;
  const e = error as ApiError;
  return (
    <div class="error-box" role="alert">
      {e.status ? <span class="badge bad">{e.status}</span> : null} {e.kind ? `${e.kind}: ` : ""}
      {e.message ?? String(error)}
    </div>
  );
}

/** A read that found no server (a restart, an outage), on a page that keeps showing what it
 * read last: said plainly, with the promise that the page picks up by itself. */
export function Unreachable({ error, what }: { error: unknown; what: string }) {
  return (
    <div class="error-box" role="alert" data-testid="unreachable">
      <strong>{(error as ApiError).message}</strong>: {what} as last read; this page asks again and picks up by itself when the server answers.
    </div>
  );
}

/** A failed read the page can show over its last answer: the server did not answer at all. */
export function unreachable(error: unknown): error is ApiError {
  return error instanceof ApiError && error.status === 0;
}

/** Shows NotAvailable for a 404-ish or unreachable server, an error box otherwise. */
export function Failure({ what, error }: { what: string; error: unknown }) {
  const e = error as ApiError;
  if (e instanceof ApiError && (e.notAvailable || e.status === 0)) return <NotAvailable what={what} error={e} />;
  return <ErrorBox error={error} />;
}

/** A progress bar: a fraction, or indeterminate (animated) while it is not known; a failed
 * job's bar stops where it was, red, and says so (it never keeps animating). */
export function Progress({ value, label, failed }: { value: number | null; label?: string; failed?: boolean }) {
  const pct = value == null ? null : Math.max(0, Math.min(100, Math.round(value * 100)));
  if (failed)
    return (
      <div class="progress-wrap">
        <div class="progress" role="progressbar" aria-valuemin={0} aria-valuemax={100} aria-valuenow={pct ?? 0} aria-label={label ?? "progress"} aria-valuetext="failed">
          <div class="bar failed" style={{ width: `${Math.max(pct ?? 0, 100)}%` }} />
        </div>
        <span class="progress-text" data-testid="progress-text">
          failed
        </span>
      </div>
    );
  return (
    <div class="progress-wrap">
      <div
        class="progress"
        role="progressbar"
        aria-valuemin={0}
        aria-valuemax={100}
        aria-valuenow={pct ?? undefined}
        aria-label={label ?? "progress"}
      >
        <div class={`bar ${pct == null ? "indeterminate" : ""}`} style={{ width: pct == null ? "30%" : `${pct}%` }} />
      </div>
      <span class="progress-text" data-testid="progress-text">
        {pct == null ? "…" : `${pct} %`}
      </span>
    </div>
  );
}

export function Confirm(props: {
  open: boolean;
  title: string;
  children?: ComponentChildren;
  confirm: string;
  onClose: (ok: boolean) => void;
}) {
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    const d = ref.current;
    if (!d) return;
    if (props.open && !d.open) d.showModal();
    if (!props.open && d.open) d.close();
  }, [props.open]);
  return (
    <dialog ref={ref} class="dialog" onCancel={() => props.onClose(false)}>
      <h3>{props.title}</h3>
      <div>{props.children}</div>
      <div class="row end">
        <button type="button" onClick={() => props.onClose(false)}>
          Cancel
        </button>
        <button type="button" class="danger" onClick={() => props.onClose(true)}>
          {props.confirm}
        </button>
      </div>
    </dialog>
  );
}

export function bytes(n: number | null | undefined): string {
  if (n == null) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  let v = n;
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i++;
  }
  return `${v.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

/** A status as a coloured badge: done (green), failed (red), running (amber), waiting for a
 * person (blue), skipped or pending (grey, dashed): each state its own look, never by colour
 * alone (the word is always there). */
export function StatusBadge({ status }: { status: string | null | undefined }) {
  const s = status ?? "unknown";
  return <span class={`badge ${tone(s)}`} data-tone={tone(s)}>{s}</span>;
}

export function tone(s: string): string {
  if (["ready", "succeeded", "healthy", "ok", "available", "connected", "idle", "installed"].includes(s)) return "good";
  if (["failed", "unavailable", "error", "cancelled"].includes(s)) return "bad";
  if (s === "skipped") return "skipped";
  if (s === "waiting") return "waiting";
  if (s === "pending") return "queued";
  return "busy";
}

export type RunError = { message?: string; kind?: string; line?: number | null; column?: number | null; hint?: string | null };

/** An error with the source line and a caret under the column, as the CLI renders it. */
export function ErrorView({ error, source }: { error: RunError; source?: string | null }) {
  const line = error.line ?? null;
  const col = error.column ?? null;
  const text = line != null && source != null ? source.split("\n")[line - 1] : undefined;
  const gutter = line != null ? `${line}` : "";
  return (
    <div class="run-error" role="alert" data-testid="run-error">
      <div>
        <strong>{error.kind || "Error"}</strong>: {error.message}
        {line != null && (
          <span class="muted small" data-testid="error-position">
            {" "}
            (line {line}
            {col != null ? `, column ${col}` : ""})
          </span>
        )}
      </div>
      {text !== undefined && col != null && (
        <pre class="caret" data-testid="caret">
          {`  ${gutter} | ${text}\n  ${" ".repeat(gutter.length)} | ${" ".repeat(Math.max(0, col - 1))}^`}
        </pre>
      )}
      {error.hint && <div class="hint">hint: {error.hint}</div>}
    </div>
  );
}

/** "850 ms", "12.4 s", "3 min 5 s". */
export function duration(ms: number | null | undefined): string {
  if (ms == null || !isFinite(ms)) return "—";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
  const m = Math.floor(ms / 60_000);
  return `${m} min ${Math.round((ms - m * 60_000) / 1000)} s`;
}

/** The time between two ISO times (to now when `to` is missing and `running`). */
export function between(from?: string | null, to?: string | null, running = false): number | null {
  if (!from) return null;
  const end = to ? Date.parse(to) : running ? Date.now() : NaN;
  const d = end - Date.parse(from);
  return isFinite(d) ? Math.max(0, d) : null;
}

/** A small SVG line chart of the last values. */
export function Sparkline({ values, label, unit }: { values: number[]; label: string; unit?: string }) {
  const w = 240;
  const h = 60;
  const max = Math.max(1e-9, ...values);
  const pts = values.map((v, i) => `${(i / Math.max(1, values.length - 1)) * w},${h - (v / max) * (h - 4) - 2}`);
  const last = values.length ? values[values.length - 1] : 0;
  return (
    <figure class="chart" aria-label={`${label}: ${last.toFixed(2)} ${unit ?? ""}`}>
      <figcaption>
        {label} <strong>{last.toFixed(last >= 100 ? 0 : 2)}</strong> {unit}
      </figcaption>
      <svg viewBox={`0 0 ${w} ${h}`} preserveAspectRatio="none" role="img" aria-hidden="true">
        <polyline points={pts.join(" ")} fill="none" stroke="currentColor" stroke-width="2" vector-effect="non-scaling-stroke" />
      </svg>
    </figure>
  );
}
