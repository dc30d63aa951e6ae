import { useEffect, useRef, useState } from "preact/hooks";
import { getJSON, isAbort, listOf, streamEvents } from "./api";

// Shared by the Agents page and the header's approvals badge: the orchestration API's shapes.

export const O = "/api/v1/orchestration";
export const FINISHED = new Set(["succeeded", "failed", "cancelled"]);

export type Usage = { prompt_tokens?: number; completion_tokens?: number; total_tokens?: number };
export type Call = { call_id?: string; tool?: string; args?: unknown; observation?: unknown; error?: any };
export type TStep = {
  index: number;
  action: string;
  args?: unknown;
  observation?: unknown;
  error?: any;
  elapsed_ms?: number;
  usage?: Usage | null;
  calls?: Call[];
};
export type Pending = { call_id: string; tool: string; args: Record<string, unknown>; effect?: string; reason?: string };
export type Task = {
  id: string;
  goal: string;
  tools: string[];
  max_steps: number;
  agent?: string;
  model?: string;
  status: string;
  steps: TStep[];
  result?: unknown;
  error?: TaskError | null;
  created_at?: string;
  started_at?: string | null;
  finished_at?: string | null;
  duration_ms?: number | null;
  usage?: Usage | null;
  pending?: Pending[] | null;
  approval_deadline?: string | null;
  approvals?: Policy | null;
  approval_timeout_s?: number | null;
  thread_id?: string | null;
  forked_from?: string | null;
  fork_checkpoint?: number | null;
  protocol?: string | null;
};
/** A task's `error`: `{kind, message, hint?}`, and for `StuckError` the call repeated, how
 * often, and the error it got each time. */
export type TaskError = {
  kind?: string;
  message?: string;
  hint?: string | null;
  reason?: string;
  call?: { tool?: string; args?: unknown };
  count?: number;
  error?: { kind?: string; message?: string };
};
export type Rule = "allow" | "ask" | "deny";
/** An approval policy (docs/orchestration.md, "Approval policies"). */
export type Policy = { default?: Rule; effects?: Record<string, Rule>; tools?: Record<string, Rule> };
export const EFFECTS = ["pure", "read", "write", "network", "process", "model"];
export type Thread = { id: string; tasks: Task[] };
/** A checkpoint entry (`GET /tasks/:id/checkpoint`): `ask` and `decision` are read here. */
export type Entry = { seq: number; kind: string; data: any; created_at?: string };
/** What a person (or the approval timeout) decided about one call. */
export type Decision = {
  call_id: string;
  ask?: { tool?: string; args?: Record<string, unknown>; effect?: string; reason?: string };
  decision?: { decision: "approve" | "reject"; by?: string; key?: { id: string; name?: string }; args?: unknown; edited?: boolean; message?: string | null };
  at?: string;
};

/** The asks and decisions of a task's checkpoint, by call id. */
export function decisionsOf(entries: Entry[]): Map<string, Decision> {
  const out = new Map<string, Decision>();
  for (const e of entries) {
    if (e.kind !== "ask" && e.kind !== "decision") continue;
    const id = String(e.data?.call_id ?? "");
    const d = out.get(id) ?? { call_id: id };
    if (e.kind === "ask") d.ask = e.data;
    else {
      d.decision = e.data;
      d.at = e.created_at;
    }
    out.set(id, d);
  }
  return out;
}
export type StepDef = {
  id: string;
  run?: string;
  task?: Record<string, unknown> & { goal?: string };
  depends_on?: string[];
  retries?: number;
  timeout_s?: number | null;
  backoff_s?: number;
};
export type WStep = {
  id: string;
  status: string;
  result?: unknown;
  error?: any;
  attempts?: number;
  started_at?: string | null;
  finished_at?: string | null;
  task_id?: string;
  definition?: StepDef;
};
export type Workflow = {
  id: string;
  name: string;
  status: string;
  inputs?: Record<string, unknown>;
  steps: WStep[];
  error?: any;
  created_at?: string;
  finished_at?: string | null;
};

export function tokens(u: Usage | null | undefined): number | null {
  if (!u) return null;
  if (typeof u.total_tokens === "number") return u.total_tokens;
  const n = (u.prompt_tokens ?? 0) + (u.completion_tokens ?? 0);
  return n || null;
}

/** Follows an SSE event stream of a task or workflow; each event triggers `onEvent`. The
 * stream ends at complete/error; a dropped connection resumes with Last-Event-ID, and so does
 * a stream started again for the same url (made inactive, then active: a server back after a
 * restart keeps its events' ids). */
export function useEvents(url: string | null, active: boolean, onEvent: (name: string, data: any) => void) {
  const saved = useRef(onEvent);
  saved.current = onEvent;
  const seen = useRef<{ url: string | null; last?: string }>({ url: null });
  useEffect(() => {
    if (!url || !active) return;
    const ctl = new AbortController();
    if (seen.current.url !== url) seen.current = { url };
    const at = seen.current;
    (async () => {
      for (let attempt = 0; attempt < 5 && !ctl.signal.aborted; attempt++) {
        let finished = false;
        try {
          await streamEvents(url, { signal: ctl.signal, headers: at.last ? { "Last-Event-ID": at.last } : {} }, (ev) => {
            if (ev.id) at.last = ev.id;
            let data: any = null;
            try {
              data = JSON.parse(ev.data);
            } catch {
              data = ev.data;
            }
            saved.current(ev.event ?? "message", data);
            if (ev.event === "complete" || ev.event === "error") finished = true;
          });
        } catch (e) {
          if (isAbort(e)) return;
        }
        if (finished) return;
        await new Promise((r) => setTimeout(r, 500 * (attempt + 1)));
      }
    })();
    return () => ctl.abort();
  }, [url, active]);
}

/** The asks and decisions of task `id`'s checkpoint (who approved, edited or rejected each
 * call), read again when `version` changes. */
export function useDecisions(id: string, version: unknown): Map<string, Decision> {
  const [found, setFound] = useState<Map<string, Decision>>(new Map());
  useEffect(() => {
    const ctl = new AbortController();
    getJSON<Entry[]>(`${O}/tasks/${encodeURIComponent(id)}/checkpoint`, ctl.signal).then(
      (entries) => setFound(decisionsOf(listOf<Entry>(entries, "entries"))),
      () => undefined, // no checkpoint to read (an older server, or not allowed): nothing shown
    );
    return () => ctl.abort();
  }, [id, version]);
  return found;
}

/** A value as text: strings as they are, others as JSON. */
export function show(v: unknown, pretty = false): string {
  if (v == null) return "";
  return typeof v === "string" ? v : JSON.stringify(v, null, pretty ? 2 : undefined);
}
