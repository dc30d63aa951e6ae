import { useRef, useState } from "preact/hooks";
import { getJSON, getText, postJSON } from "../api";
import { ErrorBox, Failure, Sparkline, StatusBadge, useInterval, useLoad } from "../components/common";
import { agentBase, inferenceBase } from "../config";
import { plural } from "../router";

type Samples = Map<string, number>; // metric name (labels dropped) -> summed value

/** Prometheus text format, summed over labels per metric name (all the charts need). */
export function parseMetrics(text: string): Samples {
  const out: Samples = new Map();
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const v = Number(m[3]);
    if (Number.isFinite(v)) out.set(m[1], (out.get(m[1]) ?? 0) + v);
  }
  return out;
}

const WINDOW = 60;
type Series = { requests: number[]; tps: number[]; queue: number[]; agentRequests: number[]; activeRuns: number[] };

function push(a: number[], v: number): number[] {
  const out = [...a, v];
  return out.length > WINDOW ? out.slice(out.length - WINDOW) : out;
}

export function Status() {
  const agentHealth = useLoad<any>((s) => (agentBase === null ? Promise.resolve(null) : getJSON(`${agentBase}/health`, s)));
  const health = useLoad<any>((s) => getJSON(`${inferenceBase}/v1/health`, s));
  const status = useLoad<any>((s) => getJSON(`${inferenceBase}/v1/status`, s));
  const providers = useLoad<any[]>((s) => getJSON(`${inferenceBase}/v1/providers`, s));
  const [series, setSeries] = useState<Series>({ requests: [], tps: [], queue: [], agentRequests: [], activeRuns: [] });
  const prev = useRef<{ t: number; inf?: Samples; agent?: Samples } | null>(null);
  const [metricsError, setMetricsError] = useState<unknown>(null);

  const sample = async () => {
    const t = performance.now();
    const [inf, agent] = await Promise.all([
      getText(`${inferenceBase}/metrics`).then(parseMetrics).catch((e) => (setMetricsError(e), undefined)),
      agentBase === null ? Promise.resolve(undefined) : getText(`${agentBase}/metrics`).then(parseMetrics).catch(() => undefined),
    ]);
    const p = prev.current;
    prev.current = { t, inf, agent };
    if (!p) return;
    const dt = (t - p.t) / 1000;
    const rate = (a: Samples | undefined, b: Samples | undefined, name: string) => (a && b ? Math.max(0, ((a.get(name) ?? 0) - (b.get(name) ?? 0)) / dt) : 0);
    setSeries((s) => ({
      requests: push(s.requests, rate(inf, p.inf, "conch_inference_requests_total")),
      tps: push(s.tps, rate(inf, p.inf, "conch_inference_completion_tokens_total")),
      queue: push(s.queue, inf?.get("conch_inference_queue_depth") ?? 0),
      agentRequests: push(s.agentRequests, rate(agent, p.agent, "conch_http_requests_total")),
      activeRuns: push(s.activeRuns, agent?.get("conch_active_runs") ?? 0),
    }));
  };
  useInterval(sample, 2000);
  useInterval(() => (status.reload(), agentHealth.reload(), health.reload()), 10000);

  return (
    <div class="stack">
      <div class="cards">
        {agentBase !== null && (
          <section class="card pane" aria-label="Agent server" data-testid="agent-health">
            <h2>Agent server</h2>
            {agentHealth.error ? (
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
          {health.error ? (
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
                </>
              )}
            </>
          )}
        </section>
      </div>
      <section class="pane" aria-label="Live metrics">
        <h2>Live</h2>
        {metricsError ? <ErrorBox error={metricsError} /> : null}
        <div class="charts">
          <Sparkline values={series.requests} label="inference requests" unit="/s" />
          <Sparkline values={series.tps} label="tokens" unit="tokens/s" />
          <Sparkline values={series.queue} label="queue depth" />
          {agentBase !== null && <Sparkline values={series.agentRequests} label="agent requests" unit="/s" />}
          {agentBase !== null && <Sparkline values={series.activeRuns} label="active runs" />}
        </div>
      </section>
      <section class="pane" aria-label="Providers">
        <h2>Providers</h2>
        {providers.error ? (
          <Failure what="Providers" error={providers.error} />
        ) : (
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
        )}
      </section>
    </div>
  );
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
