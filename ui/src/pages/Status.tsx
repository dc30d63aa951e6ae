import { useEffect, useRef, useState } from "preact/hooks";
import { getJSON, postJSON } from "../api";
import { bytes, ErrorBox, Failure, StatusBadge, useInterval, useLoad } from "../components/common";
import { agentBase, inferenceBase } from "../config";
import { link, plural } from "../router";

/** One sample of a server's status history (conch.web.common.history): `t` in unix seconds,
 * a counter's figure as its rate per second over the `dt` before it (or, for tokens while
 * sequences are active but no step finished in `dt`, over the longer span `spans` names), a
 * gauge as read; null where the figure cannot be read (no GPU, no /proc). */
type Sample = { t: number; dt: number; spans?: Record<string, number> } & Record<string, any>;
type HistoryBody = { now: number; period_s: number; window_s: number; samples: Sample[] };
/** What this page holds of a server's history: its samples, and the server's clock against
 * this browser's (ms), so that "now" on the time axis is the server's now. */
type History = { samples: Sample[]; period: number; window: number; skew: number };
const NO_HISTORY: History = { samples: [], period: 2, window: 900, skew: 0 };

const PERIOD_S = 2;
const RANGES = [2, 5, 15]; // minutes shown, the last the server keeps
const MB = 1e6;

/** A server's history: read whole on arrival (charts are full at once), then only the
 * samples after the last one held, every 2 s; `seen` hears whether the server answered.
 * Every read carries the polling header, so it is not counted as traffic. */
function useHistory(url: string | null, seen: (ok: boolean) => void): History {
  const [h, setH] = useState<History>(NO_HISTORY);
  const last = useRef<number | null>(null);
  const busy = useRef(false);
  const read = async () => {
    if (url === null || busy.current) return;
    busy.current = true;
    try {
      const since = last.current;
      const body = await getJSON<HistoryBody>(since == null ? url : `${url}?since=${since}`, undefined, true);
      seen(true);
      const fresh = body.samples ?? [];
      if (fresh.length) last.current = fresh[fresh.length - 1].t;
      setH((cur) => {
        const from = body.now - body.window_s;
        const samples = [...cur.samples, ...fresh].filter((x) => x.t >= from);
        return { samples, period: body.period_s, window: body.window_s, skew: body.now * 1000 - Date.now() };
      });
    } catch {
      seen(false);
    } finally {
      busy.current = false;
    }
  };
  useEffect(() => void read(), [url]);
  useInterval(read, PERIOD_S * 1000);
  return h;
}

/** A figure of a history as chart points. */
function series(h: History, name: string, scale = 1): Point[] {
  return h.samples.map((x) => ({ t: x.t, v: x[name] == null ? null : (x[name] as number) / scale, span: x.spans?.[name] }));
}

/** A server's reachability as this page sees it: down since when, and back when. */
type Reach = { down: number | null; back: number | null };

function useReach(): [Reach, (ok: boolean) => boolean] {
  const [r, setR] = useState<Reach>({ down: null, back: null });
  const cur = useRef(r);
  // Returns true when it just came back (the page reloads what it shows then).
  const seen = (ok: boolean): boolean => {
    const was = cur.current;
    let next = was;
    if (!ok && was.down == null) next = { down: Date.now(), back: null };
    if (ok && was.down != null) next = { down: null, back: Date.now() };
    if (next !== was) {
      cur.current = next;
      setR(next);
    }
    return ok && was.down != null;
  };
  return [r, seen];
}

function Outage({ what, reach }: { what: string; reach: Reach }) {
  if (reach.down != null)
    return (
      <div class="error-box" role="alert" data-testid="outage">
        <strong>{what} is unreachable</strong> since {new Date(reach.down).toLocaleTimeString()}: asking again every {PERIOD_S} s; this page picks up by itself when it answers.
      </div>
    );
  if (reach.back != null && Date.now() - reach.back < 30_000)
    return (
      <div class="notice" role="status" data-testid="reconnected">
        {what} answers again (since {new Date(reach.back).toLocaleTimeString()}).
      </div>
    );
  return null;
}

/** The models the inference server has in memory (`/api/ps`, read with each sample): the last
 * list it gave and when, kept through an outage to be shown greyed as "last known". */
type Loaded = { models: any[]; at: number } | null;

export function Status() {
  // Every read of this page is monitoring: marked as polling, left out of the request rates.
  const agentHealth = useLoad<any>((s) => (agentBase === null ? Promise.resolve(null) : getJSON(`${agentBase}/health`, s, true)));
  const health = useLoad<any>((s) => getJSON(`${inferenceBase}/v1/health`, s, true));
  const status = useLoad<any>((s) => getJSON(`${inferenceBase}/v1/status`, s, true));
  const providers = useLoad<any[]>((s) => getJSON(`${inferenceBase}/v1/providers`, s, true));
  const [loaded, setLoaded] = useState<Loaded>(null);
  const [loadedError, setLoadedError] = useState(false);
  const [infReach, infSeen] = useReach();
  const [agentReach, agentSeen] = useReach();
  const [range, setRange] = useState(15);

  const readLoaded = () =>
    getJSON(`${inferenceBase}/api/ps`, undefined, true).then(
      (b) => (setLoaded({ models: b?.models ?? [], at: Date.now() }), setLoadedError(false)),
      () => setLoadedError(true),
    );
  useEffect(() => void readLoaded(), []);
  const inf = useHistory(`${inferenceBase}/v1/status/history`, (ok) => {
    // Back after an outage: what the page shows is read again, with no reload of the page.
    if (infSeen(ok)) (health.reload(), status.reload(), providers.reload());
    if (ok) void readLoaded();
  });
  const agent = useHistory(agentBase === null ? null : `${agentBase}/api/v1/status/history`, (ok) => {
    if (agentSeen(ok)) agentHealth.reload();
  });
  useInterval(() => (status.poll(), agentHealth.poll(), health.poll()), 10000);
  const gpuTotal = inf.samples.length ? inf.samples[inf.samples.length - 1].gpu_memory_total_bytes : null;
  const stale = infReach.down != null;
  const span = range * 60;
  const at = (h: History) => (Date.now() + h.skew) / 1000;
  const c = (h: History) => ({ span, end: at(h), period: h.period });

  return (
    <div class="stack">
      <Outage what="The inference server" reach={infReach} />
      {agentBase !== null && <Outage what="The agent server" reach={agentReach} />}
      <div class="cards">
        {agentBase !== null && (
          <section class="card pane" aria-label="Agent server" data-testid="agent-health">
            <h2>Agent server</h2>
            {agentReach.down != null ? (
              <span class="badge bad">unreachable</span>
            ) : agentHealth.error ? (
              <Failure what="The agent server" error={agentHealth.error} />
            ) : agentHealth.data ? (
              <>
                <StatusBadge status={agentHealth.data.status} />
                <div class="small">version {agentHealth.data.version}</div>
                <div class="small">up {uptime(agentHealth.data.uptime_seconds)}</div>
              </>
            ) : (
              "…"
            )}
          </section>
        )}
        <section class="card pane" aria-label="Inference server" data-testid="inference-health">
          <h2>Inference server</h2>
          {infReach.down != null ? (
            <span class="badge bad">unreachable</span>
          ) : health.error ? (
            <Failure what="The inference server" error={health.error} />
          ) : (
            <>
              <StatusBadge status={health.data?.status} /> {status.data && <StatusBadge status={status.data.status} />}
              {status.data && (
                <>
                  <div class="small">version {status.data.version}</div>
                  <div class="small">up {uptime(status.data.uptime_seconds)}</div>
                  <div class="small">
                    {plural(status.data.models_loaded, "model")} loaded · {plural(status.data.requests_served, "request")} served
                  </div>
                  {status.data.device && (
                    <div class="small" data-testid="device">
                      runs on {status.data.device.device}
                      {status.data.device.memory_total_bytes ? ` · GPU memory ${bytes(status.data.device.memory_used_bytes)} of ${bytes(status.data.device.memory_total_bytes)}` : ""}
                    </div>
                  )}
                </>
              )}
            </>
          )}
        </section>
        <section class={`card pane${stale ? " stale" : ""}`} aria-label="Loaded models" data-testid="loaded-models" data-stale={stale ? "true" : undefined}>
          <h2>Loaded models</h2>
          {stale && loaded && (
            <p class="small" data-testid="loaded-stale">
              Last known at {new Date(loaded.at).toLocaleTimeString()}: the inference server is unreachable, so this may no longer be true.
            </p>
          )}
          {loaded == null ? (
            <span class="muted small">{loadedError ? "not known" : "…"}</span>
          ) : loaded.models.length === 0 ? (
            <span class="muted small">none: a model loads on its first request</span>
          ) : (
            <ul class="plain-list small">
              {loaded.models.map((m: any) => (
                <li key={m.name}>
                  <a href={link("models", m.model ?? m.name)}>
                    <code>{m.name}</code>
                  </a>{" "}
                  {m.size ? bytes(m.size) : ""}
                  {m.expires_at && !m.expires_at.startsWith("9999") ? ` · unloads at ${new Date(m.expires_at).toLocaleTimeString()}` : ""}
                </li>
              ))}
            </ul>
          )}
        </section>
      </div>
      <section class="pane" aria-label="Live metrics">
        <div class="row between">
          <h2>Live</h2>
          <div class="tabs" role="group" aria-label="Time shown">
            {RANGES.map((m) => (
              <button key={m} type="button" class="small" aria-pressed={range === m} onClick={() => setRange(m)} data-range={m}>
                {m} min
              </button>
            ))}
          </div>
        </div>
        <p class="muted small" data-testid="charts-note">
          Sampled by each server every {PERIOD_S} s and kept for 15 minutes (<code>/v1/status/history</code>, <code>/api/v1/status/history</code>), so the charts are full on arrival. Request rates leave out monitoring requests (<code>/metrics</code>, <code>/health</code>, status and history reads) and this page's own polling (its requests say <code>X-Conch-Poll</code>), so an idle server reads 0. Tokens are counted by the engines as they are made: prompt tokens at each step while a prompt is read, generated tokens as each is sampled.
        </p>
        <div class="charts">
          <Chart points={series(inf, "requests_per_s")} {...c(inf)} label="Inference requests" unit="req/s" testid="chart-requests" />
          <Chart points={series(inf, "generated_tokens_per_s")} {...c(inf)} label="Tokens generated" unit="tokens/s" testid="chart-tps" />
          <Chart points={series(inf, "prefill_tokens_per_s")} {...c(inf)} label="Prompt tokens read" unit="tokens/s" testid="chart-prefill" />
          <Chart points={series(inf, "active_sequences")} {...c(inf)} label="Active sequences" count="sequence" testid="chart-sequences" />
          <Chart points={series(inf, "queue_depth")} {...c(inf)} label="Queue depth" count="request" testid="chart-queue" />
          {gpuTotal ? <Chart points={series(inf, "gpu_memory_used_bytes")} {...c(inf)} label="GPU memory used" unit="bytes" max={gpuTotal} format={bytes} testid="chart-gpu" /> : null}
          {agentBase !== null && <Chart points={series(agent, "requests_per_s")} {...c(agent)} label="Agent server requests" unit="req/s" testid="chart-agent-requests" />}
          {agentBase !== null && <Chart points={series(agent, "active_tasks")} {...c(agent)} label="Active agent tasks" count="task" testid="chart-tasks" />}
          {agentBase !== null && <Chart points={series(agent, "sandbox_runs")} {...c(agent)} label="Sandbox runs" count="run" testid="chart-runs" />}
          {inf.samples.some((x) => x.resident_memory_bytes != null) && (
            <Chart points={series(inf, "resident_memory_bytes", MB)} {...c(inf)} label="Inference server memory" unit="MB" integer testid="chart-memory-inference" />
          )}
          {agentBase !== null && agent.samples.some((x) => x.resident_memory_bytes != null) && (
            <Chart points={series(agent, "resident_memory_bytes", MB)} {...c(agent)} label="Agent server memory" unit="MB" integer testid="chart-memory-agent" />
          )}
        </div>
      </section>
      <section class="pane" aria-label="Providers">
        <h2>Providers</h2>
        {providers.error ? (
          <Failure what="Providers" error={providers.error} />
        ) : (
          <div class="scroll-x">
            <table class="data" data-testid="providers">
              <thead>
                <tr>
                  <th>Provider</th>
                  <th>Status</th>
                  <th>In /v1/status</th>
                  <th>Address</th>
                  <th>Check</th>
                </tr>
              </thead>
              <tbody>
                {(providers.data ?? []).map((p) => (
                  <Provider key={p.id} p={p} state={status.data?.providers?.[p.id]} />
                ))}
              </tbody>
            </table>
          </div>
        )}
      </section>
    </div>
  );
}

function fmt(v: number, integer?: boolean): string {
  if (integer) return Math.round(v).toLocaleString();
  return v >= 100 ? Math.round(v).toLocaleString() : v.toFixed(v >= 10 ? 1 : 2);
}

/** An axis label: no more digits than the value needs (1, 0.5, 2.5, 250, 1,000). */
function tick(v: number): string {
  return v >= 100 ? Math.round(v).toLocaleString() : String(Number(v.toPrecision(2)));
}

/** A chart's point; `span`: the seconds its rate is averaged over, when longer than a sample's. */
type Point = { t: number; v: number | null; span?: number };

/** A line chart with its axes: values on the left (0 to a rounded maximum, in the unit),
 * time along the bottom (minutes ago to now, by the server's clock: a sample sits where it
 * was taken). A chart of a count (`count`: what is counted, singular) has whole numbers only,
 * on its axis too, and the axis is titled "count": the thing counted is in the caption
 * ("Queue depth: 1 request"), as a count has no unit. Where samples are missing (the server
 * was down or restarted) the line breaks: the run before the gap is drawn as a path, the
 * current one as the polyline. */
function Chart(props: { points: Point[]; span: number; end: number; period: number; label: string; unit?: string; count?: string; integer?: boolean; max?: number; format?: (v: number) => string; testid?: string }) {
  const { label, count, span, end } = props;
  const shown = props.points.filter((p) => p.t >= end - span);
  const values = shown.flatMap((p) => (p.v == null ? [] : [p.v]));
  const integer = props.integer || count != null;
  const unit = count != null ? "" : props.unit ?? "";
  const W = 300;
  const H = 110;
  const L = 44; // left margin for the value labels
  const B = 18; // bottom margin for the time labels
  const peak = Math.max(...values, 0);
  const top = props.max ?? (count != null ? countMax(peak) : niceMax(peak, integer));
  const show = props.format ?? ((v: number) => fmt(v, integer));
  const axis = props.format ?? (integer ? (v: number) => fmt(v, true) : tick);
  const x = (t: number) => L + ((W - L - 4) * Math.max(0, Math.min(1, 1 - (end - t) / span)));
  const y = (v: number) => 4 + (H - B - 8) * (1 - Math.min(v, top) / top);
  // Runs of samples without a gap (a missing sample, or one that could not be read).
  const runs: string[][] = [];
  let run: string[] = [];
  let prev: number | null = null;
  for (const p of shown) {
    if (p.v == null || (prev != null && p.t - prev > props.period * 2.5)) {
      if (run.length) runs.push(run);
      run = [];
    }
    if (p.v != null) run.push(`${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`);
    prev = p.t;
  }
  if (run.length) runs.push(run);
  const current = runs.pop() ?? [];
  const lastPoint = shown.length ? shown[shown.length - 1] : null;
  const last = lastPoint?.v ?? null;
  const minutes = span / 60;
  const half = minutes / 2;
  const words = (v: number | null) => (v == null ? "not known" : count != null ? plural(Math.round(v), count) : `${show(v)}${props.format ? "" : ` ${unit}`}`);
  return (
    <figure class="chart" data-testid={props.testid}>
      <figcaption>
        {label}: <strong data-testid="chart-value">{last == null ? "—" : show(last)}</strong> {count != null ? (last != null && Math.round(last) === 1 ? count : `${count}s`) : props.format ? "" : unit}
        {lastPoint?.span ? (
          <span class="muted" data-testid="chart-span" title="No step finished in the last sample's 2 s while sequences were active: the rate since the last token.">
            {" "}
            (over the last {Math.round(lastPoint.span)} s)
          </span>
        ) : null}
      </figcaption>
      <svg viewBox={`0 0 ${W} ${H}`} role="img" aria-label={`${label}: now ${words(last)}; peak ${words(peak)} over the last ${minutes} minutes`}>
        <g class="axis">
          <line x1={L} y1={4} x2={L} y2={H - B} />
          <line x1={L} y1={H - B} x2={W - 4} y2={H - B} />
          <line class="grid" x1={L} y1={y(top / 2)} x2={W - 4} y2={y(top / 2)} />
          <text x={L - 4} y={8} text-anchor="end">
            {axis(top)}
          </text>
          <text x={L - 4} y={y(top / 2) + 3} text-anchor="end">
            {axis(top / 2)}
          </text>
          <text x={L - 4} y={H - B} text-anchor="end">
            0
          </text>
          <text x={2} y={(H - B) / 2} class="unit" transform={`rotate(-90 8 ${(H - B) / 2})`} text-anchor="middle">
            {count != null ? "count" : unit}
          </text>
          <text x={L} y={H - 4}>
            −{minutes} min
          </text>
          <text x={(L + W) / 2} y={H - 4} text-anchor="middle">
            −{half} min
          </text>
          <text x={W - 4} y={H - 4} text-anchor="end">
            now
          </text>
        </g>
        {runs.map((r, i) => (
          <path key={i} class="line-before" d={`M${r.join(" L")}`} fill="none" stroke="currentColor" stroke-width="2" />
        ))}
        {current.length > 0 && <polyline points={current.join(" ")} fill="none" stroke="currentColor" stroke-width="2" />}
      </svg>
    </figure>
  );
}

/** 1, 2, 5 × 10^n at or above `v` (at least 1, or 1 unit for counts). */
function niceMax(v: number, integer?: boolean): number {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return integer ? Math.max(1, Math.ceil(m * p)) : m * p;
  return 10 * p;
}

/** The top of a count's axis: 2, 4 or 10 × 10^n at or above `v`, so that its half (the
 * middle line) is a whole number too: 0–1–2 when idle, then 4, 10, 20, 40, 100… */
function countMax(v: number): number {
  const p = 10 ** Math.max(0, Math.floor(Math.log10(Math.max(v, 1))));
  for (const m of [1, 2, 4, 10]) if (m * p >= v && (m * p) % 2 === 0) return m * p;
  return 20 * p;
}

function Provider({ p, state }: { p: { id: string; status: string; url?: string }; state?: string }) {
  const [result, setResult] = useState<any>(null);
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const validate = async () => {
    setBusy(true);
    setError(null);
    try {
      setResult(await postJSON(`${inferenceBase}/v1/providers/${encodeURIComponent(p.id)}/validate`));
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  };
  return (
    <tr data-provider={p.id}>
      <td>
        <code>{p.id}</code>
      </td>
      <td>
        <StatusBadge status={p.status} />
      </td>
      <td>{state ?? "—"}</td>
      <td>{p.url ?? "—"}</td>
      <td>
        <button type="button" class="small" onClick={validate} disabled={busy}>
          Validate
        </button>{" "}
        {result && (
          <span class="small" data-testid="validation">
            {result.valid ? "valid" : "invalid"} · {result.latency_ms} ms · {result.models_available} models
          </span>
        )}
        <ErrorBox error={error} />
      </td>
    </tr>
  );
}

function uptime(s: number | undefined): string {
  if (s == null) return "—";
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  return h ? `${h} h ${m} min` : m ? `${m} min ${s % 60} s` : `${s} s`;
}
