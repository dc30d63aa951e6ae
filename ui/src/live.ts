import { useEffect, useRef, useState } from "preact/hooks";
import { O, type Usage, useEvents } from "./orch";

// A task's model turns as they are generated: the live-only events of its event stream with
// `?deltas=true` (docs/orchestration.md, "Watching a task think"). Deltas come at the model's
// pace (100 a second and more), so they are gathered here, outside Preact's state, and the
// views that show them are told at most once per animation frame: one render per frame,
// whatever the number of deltas in it.

export type LiveCall = { index: number; id?: string; name?: string; args: string };
export type LiveTurn = {
  step: number;
  turn: number;
  text: string;
  thinking: string;
  calls: LiveCall[];
  tokens: number;
  /** performance.now() when the turn began (here, by the server's elapsed times). */
  began: number;
  /** Set by model_end: how long the turn took, as the server timed it. */
  elapsedMs: number | null;
  usage?: Usage | null;
  streamed: boolean;
  error?: string;
};
export type Retry = { step: number; error: string; retryInMs: number; waitedMs: number; at: number };

const LIVE = new Set(["model_start", "delta", "model_end", "model_retry", "delta_gap"]);

export class LiveRun {
  turns: LiveTurn[] = [];
  retry: Retry | null = null;
  dropped = 0;
  deltas = 0;
  /** performance.now() minus the task's elapsed time, from the server's `task_elapsed_ms`. */
  taskBegan: number | null = null;
  /** The highest step index recorded (its `step` event came): its deltas are old news. */
  private known = -1;
  private listeners = new Set<() => void>();
  private frame = 0;

  /** Takes a live event; false for a stored one (the caller's). */
  take(name: string, d: any): boolean {
    if (!LIVE.has(name)) return false;
    const now = performance.now();
    if (name === "delta_gap") {
      this.dropped += Number(d?.dropped) || 0;
      return this.changed(), true;
    }
    if (typeof d?.step !== "number" || d.step <= this.known) return true;
    if (typeof d.task_elapsed_ms === "number") this.taskBegan = now - d.task_elapsed_ms;
    if (name === "model_retry") {
      this.retry = { step: d.step, error: String(d.error ?? ""), retryInMs: d.retry_in_ms ?? 0, waitedMs: d.waited_ms ?? 0, at: now };
      return this.changed(), true;
    }
    let t = this.turns.find((x) => x.step === d.step && x.turn === d.turn);
    if (name === "model_start") {
      this.retry = null;
      // A turn asked again (a subscriber joined just after it began) starts afresh.
      if (t) this.turns = this.turns.filter((x) => x !== t);
      const ago = d.started_at ? Math.max(0, Date.now() - Date.parse(d.started_at)) : 0;
      t = { step: d.step, turn: d.turn, text: "", thinking: "", calls: [], tokens: 0, began: now - (isFinite(ago) ? ago : 0), elapsedMs: null, streamed: d.streamed !== false };
      this.turns.push(t);
      return this.changed(), true;
    }
    if (!t) {
      // Joined mid-turn without its model_start: the turn is shown from here.
      t = { step: d.step, turn: d.turn, text: "", thinking: "", calls: [], tokens: 0, began: now - (d.elapsed_ms ?? 0), elapsedMs: null, streamed: true };
      this.turns.push(t);
    }
    if (name === "delta") {
      this.deltas++;
      t.tokens = d.tokens ?? t.tokens + 1;
      if (typeof d.elapsed_ms === "number") t.began = now - d.elapsed_ms;
      if (d.type === "text") t.text += d.text ?? "";
      else if (d.type === "thinking") t.thinking += d.text ?? "";
      else if (d.type === "tool_call") {
        const i = Number(d.index) || 0;
        let c = t.calls.find((x) => x.index === i);
        if (!c) t.calls.push((c = { index: i, args: "" }));
        if (d.id) c.id = d.id;
        if (d.name) c.name = d.name;
        c.args += d.arguments ?? "";
      }
    } else if (name === "model_end") {
      t.elapsedMs = d.elapsed_ms ?? now - t.began;
      t.tokens = d.tokens ?? t.tokens;
      t.usage = d.usage ?? null;
      if (d.error) t.error = String(d.error);
    }
    return this.changed(), true;
  }

  /** Step `index` is recorded: its turns leave the live view (the timeline has them). */
  recorded(index: number): void {
    if (index <= this.known) return;
    this.known = index;
    this.turns = this.turns.filter((t) => t.step > index);
    if (this.retry && this.retry.step <= index) this.retry = null;
    this.changed();
  }

  /** The run ended or paused: nothing is under way any more. */
  clear(): void {
    this.turns = this.turns.filter((t) => t.elapsedMs != null && t.step > this.known);
    this.retry = null;
    this.changed();
  }

  subscribe(fn: () => void): () => void {
    this.listeners.add(fn);
    return () => void this.listeners.delete(fn);
  }

  private changed(): void {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.listeners.forEach((fn) => fn());
    });
  }
}

/** Re-renders the caller once per animation frame in which `run` changed. */
export function useLive(run: LiveRun): void {
  const [, tick] = useState(0);
  useEffect(() => run.subscribe(() => tick((n) => n + 1)), [run]);
}

/** Re-renders every `ms` while `on`: elapsed times that count up between events. */
export function useTicker(on: boolean, ms = 200): void {
  const [, tick] = useState(0);
  useEffect(() => {
    if (!on) return;
    const id = setInterval(() => tick((n) => n + 1), ms);
    return () => clearInterval(id);
  }, [on, ms]);
}

/** Follows task `id`'s event stream with the model's deltas while `active`: live events go
 * to the returned LiveRun, stored ones to `onStored` (a `step` is also marked recorded). */
export function useTaskStream(id: string, active: boolean, onStored: (name: string, data: any) => void): LiveRun {
  const run = useRef<LiveRun | null>(null);
  if (!run.current) run.current = new LiveRun();
  const r = run.current;
  useEvents(`${O}/tasks/${encodeURIComponent(id)}/events?deltas=true`, active, (name, data) => {
    if (r.take(name, data)) return;
    if (name === "step" && typeof data?.index === "number") r.recorded(data.index);
    if (name === "interrupt" || name === "complete" || name === "error") r.clear();
    onStored(name, data);
  });
  return r;
}
