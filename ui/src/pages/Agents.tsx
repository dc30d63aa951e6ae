import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { ApiError, getJSON, isAbort, listOf, postJSON, streamEvents } from "../api";
import { ErrorBox, Failure, StatusBadge, useInterval, useLoad } from "../components/common";
import { NotFound } from "../components/NotFound";
import { Tabs } from "../components/Tabs";
import { link, navigate, useRoute } from "../router";

const O = "/api/v1/orchestration";
const FINISHED = new Set(["succeeded", "failed", "cancelled"]);

type Step = { index: number; action: string; args?: unknown; observation?: unknown; elapsed_ms?: number; usage?: unknown };
type Task = {
  id: string;
  goal: string;
  tools: string[];
  max_steps: number;
  agent?: string;
  status: string;
  steps: Step[];
  result?: unknown;
  error?: { kind?: string; message?: string } | null;
  created_at?: string;
  duration_ms?: number | null;
};
type WStep = { id: string; status: string; result?: unknown; error?: any; attempts?: number; started_at?: string | null; finished_at?: string | null };
type Workflow = { id: string; name: string; status: string; steps: WStep[]; created_at?: string; finished_at?: string | null };

/** Follows an SSE event stream of a task or workflow; each event triggers `onEvent`. The
 * stream ends at complete/error; a dropped connection resumes with Last-Event-ID. */
function useEvents(url: string | null, active: boolean, onEvent: (name: string, data: any) => void) {
  const saved = useRef(onEvent);
  saved.current = onEvent;
  useEffect(() => {
    if (!url || !active) return;
    const ctl = new AbortController();
    let last: string | undefined;
    (async () => {
      for (let attempt = 0; attempt < 5 && !ctl.signal.aborted; attempt++) {
        let finished = false;
        try {
          await streamEvents(url, { signal: ctl.signal, headers: last ? { "Last-Event-ID": last } : {} }, (ev) => {
            if (ev.id) last = ev.id;
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

const TABS = [
  { id: "tasks", label: "Tasks", href: link("agents", "tasks") },
  { id: "workflows", label: "Workflows", href: link("agents", "workflows") },
  { id: "agents", label: "Agents & metrics", href: link("agents", "agents") },
];

/** `#/agents[/tasks[/:id] | /workflows[/:id] | /agents]`. */
export function Agents() {
  const route = useRoute();
  const [tab = "tasks", id, ...rest] = route.parts;
  const agents = useLoad<any[]>(async (s) => listOf(await getJSON(`${O}/agents`, s), "agents"));
  const known = TABS.some((t) => t.id === tab) && rest.length === 0 && (tab !== "agents" || id == null);
  if (!known) return <NotFound what="Page" back={{ href: "#/agents", label: "Agents" }} />;
  if (agents.error) return <Failure what="Orchestration (agents, tasks, workflows)" error={agents.error} />;
  return (
    <div class="stack">
      <Tabs label="Orchestration" idPrefix="agents" tabs={TABS} selected={tab}>
        {tab === "tasks" && <Tasks agents={agents.data ?? []} selected={id ?? null} />}
        {tab === "workflows" && <Workflows selected={id ?? null} />}
        {tab === "agents" && <AgentsAndMetrics agents={agents.data ?? []} reload={agents.reload} />}
      </Tabs>
    </div>
  );
}

/** A 404 for one object once the page's routes answered: that object is not there. */
function missing(e: unknown): boolean {
  return e instanceof ApiError && e.status === 404;
}

function Tasks({ agents, selected }: { agents: any[]; selected: string | null }) {
  const list = useLoad<Task[]>(async (s) => listOf(await getJSON(`${O}/tasks`, s), "tasks"));
  const [goal, setGoal] = useState("How many files are in the workspace?");
  const [tools, setTools] = useState("ls, len");
  const [maxSteps, setMaxSteps] = useState(6);
  const [agent, setAgent] = useState("");
  const [model, setModel] = useState("");
  const [error, setError] = useState<unknown>(null);
  const create = async (e: Event) => {
    e.preventDefault();
    setError(null);
    try {
      const body: Record<string, unknown> = {
        goal,
        tools: tools.split(",").map((t) => t.trim()).filter(Boolean),
        max_steps: maxSteps,
      };
      if (agent) body.agent = agent;
      if (model.trim()) body.model = model.trim();
      const task = await postJSON<Task>(`${O}/tasks`, body);
      navigate(link("agents", "tasks", task.id));
      list.reload();
    } catch (err) {
      setError(err);
    }
  };
  return (
    <div class="two wide-right">
      <div class="stack">
        <form class="pane form" onSubmit={create} aria-label="New task">
          <h2>New task</h2>
          <label>
            Goal
            <textarea rows={3} required value={goal} onInput={(e) => setGoal((e.currentTarget as HTMLTextAreaElement).value)} name="goal" />
          </label>
          <label>
            Tools (builtin names, comma-separated)
            <input value={tools} onInput={(e) => setTools((e.currentTarget as HTMLInputElement).value)} name="tools" />
          </label>
          <div class="row">
            <label>
              Max steps
              <input type="number" min={1} max={100} value={maxSteps} onInput={(e) => setMaxSteps(Number((e.currentTarget as HTMLInputElement).value) || 1)} />
            </label>
            <label>
              Agent
              {/* The server's default agent is the one named "default" when there is one. */}
              <select name="agent" value={agent || (agents.some((a) => a.id === "default") ? "default" : "")} onChange={(e) => setAgent((e.currentTarget as HTMLSelectElement).value)}>
                {!agents.some((a) => a.id === "default") && <option value="">(server default)</option>}
                {agents.map((a) => (
                  <option key={a.id} value={a.id}>
                    {a.id}
                  </option>
                ))}
              </select>
            </label>
          </div>
          <label>
            Model (optional, provider:model)
            <input value={model} onInput={(e) => setModel((e.currentTarget as HTMLInputElement).value)} placeholder="local:smollm2-135m-instruct" />
          </label>
          <ErrorBox error={error} />
          <button type="submit" class="primary" data-testid="create-task">
            Create task
          </button>
        </form>
        <section class="pane" aria-label="Tasks">
          <div class="row between">
            <h2>Tasks</h2>
            <button type="button" class="small" onClick={list.reload}>
              Refresh
            </button>
          </div>
          {list.error ? <Failure what="Tasks" error={list.error} /> : null}
          {list.data && list.data.length === 0 && (
            <p class="muted" data-testid="empty-tasks">
              No tasks yet: create one above.
            </p>
          )}
          <ul class="item-list" data-testid="task-list">
            {(list.data ?? []).map((t) => (
              <li key={t.id}>
                <a class="item-link" href={link("agents", "tasks", t.id)} aria-current={selected === t.id ? "page" : undefined} data-task={t.id}>
                  <StatusBadge status={t.status} /> {t.goal}
                </a>
              </li>
            ))}
          </ul>
        </section>
      </div>
      {selected ? <TaskDetail key={selected} id={selected} onChange={list.reload} /> : <div class="pane muted">Select or create a task.</div>}
    </div>
  );
}

function TaskDetail({ id, onChange }: { id: string; onChange: () => void }) {
  const [task, setTask] = useState<Task | null>(null);
  const [error, setError] = useState<unknown>(null);
  const refresh = () => getJSON<Task>(`${O}/tasks/${encodeURIComponent(id)}`).then(setTask, setError);
  useEffect(() => {
    setTask(null);
    refresh();
  }, [id]);
  const live = task != null && !FINISHED.has(task.status);
  useEvents(`${O}/tasks/${encodeURIComponent(id)}/events`, live, (name, data) => {
    setTask((t) => {
      if (!t) return t;
      if (name === "step" && data && typeof data.index === "number") {
        const steps = t.steps.filter((s) => s.index !== data.index).concat([data]).sort((a, b) => a.index - b.index);
        return { ...t, status: "running", steps };
      }
      if (name === "start") return { ...t, status: "running" };
      return t;
    });
    if (name === "complete" || name === "error") {
      refresh();
      onChange();
    }
  });
  const cancel = async () => {
    try {
      setTask(await postJSON<Task>(`${O}/tasks/${encodeURIComponent(id)}/cancel`));
      onChange();
    } catch (e) {
      setError(e);
    }
  };
  if (error && !task)
    return missing(error) ? <NotFound what="Task" back={{ href: link("agents", "tasks"), label: "All tasks" }} /> : <Failure what="This task" error={error} />;
  if (!task) return <div class="pane muted">loading…</div>;
  return (
    <section class="pane" aria-label="Task" data-testid="task-detail">
      <div class="row between">
        <h2>Task</h2>
        <div class="row">
          <StatusBadge status={task.status} />
          {live && (
            <button type="button" class="danger small" onClick={cancel}>
              Cancel
            </button>
          )}
        </div>
      </div>
      <p>{task.goal}</p>
      <div class="muted small">
        {task.id} · tools {task.tools?.join(", ")} · max {task.max_steps} steps{task.duration_ms != null ? ` · ${task.duration_ms} ms` : ""}
      </div>
      <ErrorBox error={error} />
      <ol class="timeline" data-testid="timeline">
        {task.steps.map((s) => (
          <li key={s.index} value={s.index + 1} data-testid="timeline-step">
            <div>
              <strong>{s.action}</strong>{" "}
              {s.elapsed_ms != null && <span class="muted small">{s.elapsed_ms} ms</span>}
            </div>
            {s.args != null && <pre class="small">{JSON.stringify(s.args)}</pre>}
            {s.observation != null && (
              <pre class="small observation">{typeof s.observation === "string" ? s.observation : JSON.stringify(s.observation)}</pre>
            )}
          </li>
        ))}
        {live && <li class="muted">waiting for the next step…</li>}
      </ol>
      {task.result != null && (
        <div>
          <h3>Result</h3>
          <pre>{typeof task.result === "string" ? task.result : JSON.stringify(task.result, null, 2)}</pre>
        </div>
      )}
      {task.error && (
        <div class="error-box">
          {task.error.kind}: {task.error.message}
        </div>
      )}
    </section>
  );
}

const EXAMPLE_WORKFLOW = JSON.stringify(
  {
    name: "numbers",
    inputs: { n: 5 },
    steps: [
      { id: "range", run: "range(1, inputs.n + 1)" },
      { id: "squares", depends_on: ["range"], run: "steps.range.result | map(fn(x) => x * x)" },
      { id: "total", depends_on: ["range"], run: "steps.range.result | sum" },
      { id: "report", depends_on: ["squares", "total"], run: '"sum ${steps.total.result}, squares ${steps.squares.result}"' },
    ],
  },
  null,
  2,
);

function Workflows({ selected }: { selected: string | null }) {
  const list = useLoad<Workflow[]>(async (s) => listOf(await getJSON(`${O}/workflows`, s), "workflows"));
  const [def, setDef] = useState(EXAMPLE_WORKFLOW);
  const [error, setError] = useState<unknown>(null);
  const create = async (e: Event) => {
    e.preventDefault();
    setError(null);
    let body: unknown;
    try {
      body = JSON.parse(def);
    } catch (err) {
      setError(new Error(`the definition is not JSON: ${(err as Error).message}`));
      return;
    }
    try {
      const wf = await postJSON<Workflow>(`${O}/workflows`, body);
      navigate(link("agents", "workflows", wf.id));
      list.reload();
    } catch (err) {
      setError(err);
    }
  };
  return (
    <div class="two wide-right">
      <div class="stack">
        <form class="pane form" onSubmit={create} aria-label="New workflow">
          <h2>New workflow</h2>
          <label>
            Definition (JSON)
            <textarea rows={12} class="mono" value={def} onInput={(e) => setDef((e.currentTarget as HTMLTextAreaElement).value)} name="definition" spellcheck={false} />
          </label>
          <ErrorBox error={error} />
          <button type="submit" class="primary" data-testid="create-workflow">
            Run workflow
          </button>
        </form>
        <section class="pane" aria-label="Workflows">
          <div class="row between">
            <h2>Workflows</h2>
            <button type="button" class="small" onClick={list.reload}>
              Refresh
            </button>
          </div>
          {list.error ? <Failure what="Workflows" error={list.error} /> : null}
          {list.data && list.data.length === 0 && (
            <p class="muted" data-testid="empty-workflows">
              No workflows yet: run one above.
            </p>
          )}
          <ul class="item-list" data-testid="workflow-list">
            {(list.data ?? []).map((w) => (
              <li key={w.id}>
                <a class="item-link" href={link("agents", "workflows", w.id)} aria-current={selected === w.id ? "page" : undefined} data-workflow={w.id}>
                  <StatusBadge status={w.status} /> {w.name} <span class="muted small">{w.id}</span>
                </a>
              </li>
            ))}
          </ul>
        </section>
      </div>
      {selected ? <WorkflowDetail key={selected} id={selected} definition={def} onChange={list.reload} /> : <div class="pane muted">Select or run a workflow.</div>}
    </div>
  );
}

function WorkflowDetail({ id, definition, onChange }: { id: string; definition: string; onChange: () => void }) {
  const [wf, setWf] = useState<Workflow | null>(null);
  const [error, setError] = useState<unknown>(null);
  const url = `${O}/workflows/${encodeURIComponent(id)}`;
  const refresh = () => getJSON<Workflow>(url).then(setWf, setError);
  useEffect(() => {
    setWf(null);
    refresh();
  }, [id]);
  const live = wf != null && !FINISHED.has(wf.status);
  useEvents(`${url}/events`, live, (name, data) => {
    // A step event carries the step's record; merging it keeps the DAG live without a refetch.
    if (name === "step" && data?.id) {
      setWf((w) => (w ? { ...w, status: w.status === "pending" ? "running" : w.status, steps: w.steps.map((s) => (s.id === data.id ? { ...s, ...data } : s)) } : w));
    }
    if (name === "complete" || name === "error") {
      refresh();
      onChange();
    }
  });
  // Also poll while running: a server may send coarser events than one per step change.
  useInterval(() => live && refresh(), 2000);
  const deps = useMemo(() => dependsOn(definition, wf), [definition, wf?.id]);
  const cancel = async () => {
    try {
      setWf(await postJSON<Workflow>(`${url}/cancel`));
      onChange();
    } catch (e) {
      setError(e);
    }
  };
  if (error && !wf)
    return missing(error) ? <NotFound what="Workflow" back={{ href: link("agents", "workflows"), label: "All workflows" }} /> : <Failure what="This workflow" error={error} />;
  if (!wf) return <div class="pane muted">loading…</div>;
  return (
    <section class="pane" aria-label="Workflow" data-testid="workflow-detail">
      <div class="row between">
        <h2>{wf.name}</h2>
        <div class="row">
          <StatusBadge status={wf.status} />
          {live && (
            <button type="button" class="danger small" onClick={cancel}>
              Cancel
            </button>
          )}
        </div>
      </div>
      <ErrorBox error={error} />
      <Dag steps={wf.steps} deps={deps} />
      <table class="data">
        <thead>
          <tr>
            <th>Step</th>
            <th>Status</th>
            <th>Attempts</th>
            <th>Result / error</th>
          </tr>
        </thead>
        <tbody>
          {wf.steps.map((s) => (
            <tr key={s.id} data-step={s.id}>
              <td>
                <code>{s.id}</code>
              </td>
              <td>
                <StatusBadge status={s.status} />
              </td>
              <td class="num">{s.attempts ?? 0}</td>
              <td class="clip">{s.error ? `${s.error.kind ?? ""} ${s.error.message ?? JSON.stringify(s.error)}` : s.result == null ? "" : typeof s.result === "string" ? s.result : JSON.stringify(s.result)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}

/** Edges of the DAG: from the workflow record when it carries depends_on, else from the
 * definition that created it (when it is the one in the form). */
function dependsOn(definition: string, wf: Workflow | null): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const s of wf?.steps ?? []) if (Array.isArray((s as any).depends_on)) out[s.id] = (s as any).depends_on;
  if (Object.keys(out).length) return out;
  try {
    const def = JSON.parse(definition);
    const ids = new Set((wf?.steps ?? []).map((s) => s.id));
    for (const s of def.steps ?? []) if (ids.has(s.id)) out[s.id] = s.depends_on ?? [];
  } catch {
    /* no edges known */
  }
  return out;
}

/** The DAG laid out in layers by longest path from a root. */
function Dag({ steps, deps }: { steps: WStep[]; deps: Record<string, string[]> }) {
  const level: Record<string, number> = {};
  const depth = (id: string, seen: Set<string> = new Set()): number => {
    if (level[id] != null) return level[id];
    if (seen.has(id)) return 0;
    seen.add(id);
    const d = (deps[id] ?? []).reduce((m, p) => Math.max(m, depth(p, seen) + 1), 0);
    return (level[id] = d);
  };
  steps.forEach((s) => depth(s.id));
  const layers: string[][] = [];
  steps.forEach((s) => (layers[level[s.id]] ??= []).push(s.id));
  const W = 150;
  const H = 44;
  const GX = 60;
  const GY = 16;
  const pos: Record<string, { x: number; y: number }> = {};
  layers.forEach((ids, i) => ids.forEach((id, j) => (pos[id] = { x: i * (W + GX) + 8, y: j * (H + GY) + 8 })));
  const width = layers.length * (W + GX);
  const height = Math.max(1, ...layers.map((l) => l.length)) * (H + GY) + 8;
  const status = Object.fromEntries(steps.map((s) => [s.id, s.status]));
  return (
    <div class="dag-wrap">
      <svg class="dag" width={width} height={height} viewBox={`0 0 ${width} ${height}`} role="img" aria-label="Workflow steps and their dependencies" data-testid="dag">
        {steps.flatMap((s) =>
          (deps[s.id] ?? []).filter((p) => pos[p]).map((p) => {
            const a = pos[p];
            const b = pos[s.id];
            return <path key={`${p}-${s.id}`} class="edge" d={`M${a.x + W},${a.y + H / 2} C${a.x + W + GX / 2},${a.y + H / 2} ${b.x - GX / 2},${b.y + H / 2} ${b.x},${b.y + H / 2}`} />;
          }),
        )}
        {steps.map((s) => (
          <g key={s.id} class={`node st-${status[s.id]}`} transform={`translate(${pos[s.id].x},${pos[s.id].y})`} data-node={s.id} data-status={s.status}>
            <rect width={W} height={H} rx={8} />
            <text x={10} y={18}>
              {s.id.length > 18 ? `${s.id.slice(0, 17)}…` : s.id}
            </text>
            <text x={10} y={35} class="sub">
              {s.status}
              {s.attempts && s.attempts > 1 ? ` · try ${s.attempts}` : ""}
            </text>
          </g>
        ))}
      </svg>
    </div>
  );
}

function AgentsAndMetrics({ agents, reload }: { agents: any[]; reload: () => void }) {
  const metrics = useLoad<Record<string, number>>((s) => getJSON(`${O}/metrics`, s));
  useInterval(metrics.reload, 3000);
  return (
    <div class="stack">
      <section class="pane" aria-label="Metrics">
        <h2>Metrics</h2>
        {metrics.error ? (
          <Failure what="Orchestration metrics" error={metrics.error} />
        ) : (
          <div class="cards" data-testid="metrics">
            {Object.entries(metrics.data ?? {}).map(([k, v]) => (
              <div class="card" key={k}>
                <div class="muted small">{k.replace(/_/g, " ")}</div>
                <div class="big">{typeof v === "number" ? v.toLocaleString() : String(v)}</div>
              </div>
            ))}
          </div>
        )}
      </section>
      <section class="pane" aria-label="Agents">
        <div class="row between">
          <h2>Agents</h2>
          <button type="button" class="small" onClick={reload}>
            Refresh
          </button>
        </div>
        <table class="data">
          <thead>
            <tr>
              <th>Id</th>
              <th>Status</th>
              <th>Model</th>
              <th>Capabilities</th>
              <th>Description</th>
            </tr>
          </thead>
          <tbody>
            {agents.map((a) => (
              <tr key={a.id}>
                <td>
                  <code>{a.id}</code>
                </td>
                <td>
                  <StatusBadge status={a.status} />
                </td>
                <td>{a.model}</td>
                <td class="clip">{(a.capabilities ?? []).join(", ")}</td>
                <td>{a.description}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </section>
    </div>
  );
}
