import { useRef, useState } from "preact/hooks";
import { getJSON, getText, postJSON } from "../api";
import { bytes, ErrorBox, Failure, StatusBadge, useInterval, useLoad } from "../components/common";
import { agentBase, inferenceBase } from "../config";
import { link, plural } from "../router";

type Samples = Map<string, number>; // metric name (labels dropped) -> summed value

// The studio's own monitoring requests (this page's polling, the header's approvals badge):
// left out of the request rates, so an idle server reads 0 requests/s.
export const MONITORING = new Set(["/metrics", "/health", "/v1/health", "/v1/status", "/api/ps", "/api/v1/orchestration/metrics"]);

/** Prometheus text format, summed over labels per metric name (all the charts need); a
 * sample whose `route` label is one of `skipRoutes` (or whose method is OPTIONS, a CORS
 * preflight) is left out. */
export function parseMetrics(text: string, skipRoutes: Set<string> = new Set()): Samples {
  const out: Samples = new Map();
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    if (m[2]) {
      const route = /route="([^"]*)"/.exec(m[2])?.[1];
      if ((route && skipRoutes.has(route)) || /method="OPTIONS"/.test(m[2])) continue;
    }
    const v = Number(m[3]);
    if (Number.isFinite(v)) out.set(m[1], (out.get(m[1]) ?? 0) + v);
  }
  return out;
}

const PERIOD_S = 2;
const WINDOW = 60; // samples: two minutes
type Series = { requests: number[]; tps: number[]; queue: number[]; active: number[]; gpu: number[]; agentRequests: number[]; activeRuns: number[]; infMem: number[]; agentMem: number[] };
const EMPTY: Series = { requests: [], tps: [], queue: [], active: [], gpu: [], agentRequests: [], activeRuns: [], infMem: [], agentMem: [] };
// Each server's resident memory (prometheus_client's process collector, read from /proc: absent
// on a platform without it, and then so is its chart), in MB (10^6 bytes).
const RSS = "process_resident_memory_bytes";
const MB = 1e6;

function push(a: number[], v: number): number[] {
  const out = [...a, v];
  return out.length > WINDOW ? out.slice(out.length - WINDOW) : out;
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

export function Status() {
  const agentHealth = useLoad<any>((s) => (agentBase === null ? Promise.resolve(null) : getJSON(`${agentBase}/health`, s)));
  const health = useLoad<any>((s) => getJSON(`${inferenceBase}/v1/health`, s));
  const status = useLoad<any>((s) => getJSON(`${inferenceBase}/v1/status`, s));
  const providers = useLoad<any[]>((s) => getJSON(`${inferenceBase}/v1/providers`, s));
  const loaded = useLoad<any[]>((s) => getJSON(`${inferenceBase}/api/ps`, s).then((b) => b?.models ?? []));
  const [series, setSeries] = useState<Series>(EMPTY);
  const prev = useRef<{ t: number; inf?: Samples; agent?: Samples } | null>(null);
  const [infReach, infSeen] = useReach();
  const [agentReach, agentSeen] = useReach();

  const sample = async () => {
    const t = performance.now();
    const [inf, agent] = await Promise.all([
      getText(`${inferenceBase}/metrics`).then((x) => parseMetrics(x, MONITORING)).catch(() => undefined),
      agentBase === null ? Promise.resolve(undefined) : getText(`${agentBase}/metrics`).then((x) => parseMetrics(x, MONITORING)).catch(() => undefined),
    ]);
    if (infSeen(inf !== undefined)) (health.reload(), status.reload(), providers.reload(), loaded.reload());
    if (agentBase !== null && agentSeen(agent !== undefined)) agentHealth.reload();
    const p = prev.current;
    prev.current = { t, inf, agent };
    if (!p) return;
    const dt = (t - p.t) / 1000;
    const rate = (a: Samples | undefined, b: Samples | undefined, name: string) => (a && b && a.has(name) ? Math.max(0, ((a.get(name) ?? 0) - (b.get(name) ?? 0)) / dt) : 0);
    // Tokens sampled by the engines move with every token (the completion counter only when a
    // request ends), so a long answer shows its rate while it is written.
    const live = inf?.has("conch_inference_generated_tokens_total") ? "conch_inference_generated_tokens_total" : "conch_inference_completion_tokens_total";
    setSeries((s) => ({
      requests: push(s.requests, rate(inf, p.inf, "conch_inference_requests_total")),
      tps: push(s.tps, rate(inf, p.inf, live)),
      queue: push(s.queue, inf?.get("conch_inference_queue_depth") ?? 0),
      active: push(s.active, inf?.get("conch_inference_active_sequences") ?? 0),
      gpu: push(s.gpu, inf?.get("conch_inference_gpu_memory_used_bytes") ?? 0),
      agentRequests: push(s.agentRequests, rate(agent, p.agent, "conch_http_requests_total")),
      activeRuns: push(s.activeRuns, agent?.get("conch_active_runs") ?? 0),
      infMem: inf?.has(RSS) ? push(s.infMem, (inf.get(RSS) ?? 0) / MB) : s.infMem,
      agentMem: agent?.has(RSS) ? push(s.agentMem, (agent.get(RSS) ?? 0) / MB) : s.agentMem,
    }));
  };
  useInterval(sample, PERIOD_S * 1000);
  useInterval(() => (status.reload(), agentHealth.reload(), health.reload(), loaded.reload()), 10000);
  const gpuTotal = status.data?.device?.memory_total_bytes ?? null;

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
        <section class="card pane" aria-label="Loaded models" data-testid="loaded-models">
          <h2>Loaded models</h2>
          {loaded.error ? (
            <span class="muted small">not known</span>
          ) : (loaded.data ?? []).length === 0 ? (
            <span class="muted small">none: a model loads on its first request</span>
          ) : (
            <ul class="plain-list small">
              {(loaded.data ?? []).map((m: any) => (
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
        <h2>Live</h2>
        <p class="muted small" data-testid="charts-note">
          Sampled from each server's <code>/metrics</code> every {PERIOD_S} s over the last {(WINDOW * PERIOD_S) / 60} minutes. Request rates leave out monitoring requests (<code>/metrics</code>, <code>/health</code>, <code>/v1/status</code>, <code>/api/ps</code>: this page's own polling and the header's), so an idle server reads 0.
        </p>
        <div class="charts">
          <Chart values={series.requests} label="Inference requests" unit="req/s" />
          <Chart values={series.tps} label="Tokens generated" unit="tokens/s" testid="chart-tps" />
          <Chart values={series.active} label="Sequences generating" count="sequence" testid="chart-sequences" />
          <Chart values={series.queue} label="Queue depth" count="request" testid="chart-queue" />
          {gpuTotal ? <Chart values={series.gpu} label="GPU memory used" unit="bytes" max={gpuTotal} format={bytes} /> : null}
          {agentBase !== null && <Chart values={series.agentRequests} label="Agent server requests" unit="req/s" />}
          {agentBase !== null && <Chart values={series.activeRuns} label="Active runs" count="run" testid="chart-runs" />}
          {series.infMem.length > 0 && <Chart values={series.infMem} label="Inference server memory" unit="MB" integer testid="chart-memory-inference" />}
          {agentBase !== null && series.agentMem.length > 0 && <Chart values={series.agentMem} label="Agent server memory" unit="MB" integer testid="chart-memory-agent" />}
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

/** A line chart with its axes: values on the left (0 to a rounded maximum, in the unit),
 * time along the bottom (minutes ago to now). A chart of a count (`count`: what is counted,
 * singular) has whole numbers only, on its axis too, and the axis is titled "count": the
 * thing counted is in the caption ("Queue depth: 1 request"), as a count has no unit. */
function Chart(props: { values: number[]; label: string; unit?: string; count?: string; integer?: boolean; max?: number; format?: (v: number) => string; testid?: string }) {
  const { values, label, count } = props;
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
  const x = (i: number) => L + ((W - L - 4) * (WINDOW - values.length + i)) / (WINDOW - 1);
  const y = (v: number) => 4 + (H - B - 8) * (1 - Math.min(v, top) / top);
  const pts = values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`);
  const last = values.length ? values[values.length - 1] : 0;
  const minutes = (WINDOW * PERIOD_S) / 60;
  const now = count != null ? plural(Math.round(last), count) : `${show(last)}${props.format ? "" : ` ${unit}`}`;
  const most = count != null ? plural(Math.round(peak), count) : `${show(peak)}${props.format ? "" : ` ${unit}`}`;
  return (
    <figure class="chart" data-testid={props.testid}>
      <figcaption>
        {label}: <strong data-testid="chart-value">{show(last)}</strong> {count != null ? (Math.round(last) === 1 ? count : `${count}s`) : props.format ? "" : unit}
      </figcaption>
      <svg viewBox={`0 0 ${W} ${H}`} role="img" aria-label={`${label}: now ${now}; peak ${most} over the last ${minutes} minutes`}>
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
            −{minutes / 2} min
          </text>
          <text x={W - 4} y={H - 4} text-anchor="end">
            now
          </text>
        </g>
        {pts.length > 0 && <polyline points={pts.join(" ")} fill="none" stroke="currentColor" stroke-width="2" />}
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
