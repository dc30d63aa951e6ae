import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { ApiError, getJSON, listOf, postJSON } from "../api";
import { between, duration, ErrorBox, ErrorView, Failure, StatusBadge, Unreachable, unreachable, useInterval, useIntoView, useLoad } from "../components/common";
import { NotFound } from "../components/NotFound";
import { RunList } from "../components/RunList";
import { TaskTimeline } from "../components/TaskTimeline";
import { FINISHED, O, show, type StepDef, type Task, type Workflow, type WStep, useEvents } from "../orch";
import { link, navigate } from "../router";

const EXAMPLE = {
  name: "numbers",
  inputs: { n: 5 },
  steps: [
    { id: "range", run: "range(1, inputs.n + 1)" },
    { id: "squares", depends_on: ["range"], run: "steps.range.result | map(fn(x) => x * x)" },
    { id: "total", depends_on: ["range"], run: "steps.range.result | sum" },
    { id: "report", depends_on: ["squares", "total"], run: '"sum ${steps.total.result}, squares ${steps.squares.result}"' },
  ],
};
const EXAMPLE_JSON = JSON.stringify(EXAMPLE, null, 2);
const EXAMPLE_TOML = `name = "numbers"

[inputs]
n = 5

[[steps]]
id = "range"
run = "range(1, inputs.n + 1)"

[[steps]]
id = "squares"
depends_on = ["range"]
run = "steps.range.result | map(fn(x) => x * x)"

[[steps]]
id = "total"
depends_on = ["range"]
run = "steps.range.result | sum"

[[steps]]
id = "report"
depends_on = ["squares", "total"]
run = '"sum \${steps.total.result}, squares \${steps.squares.result}"'
`;

/** A definition's format: JSON when it starts with `{`, else TOML (as `conch workflows run`
 * takes either). */
export function formatOf(text: string): "json" | "toml" {
  return text.trimStart().startsWith("{") ? "json" : "toml";
}

/** A parse error with where it is, shown with a caret under the definition's text. */
class DefinitionError extends Error {
  kind: string;
  line: number | null;
  column: number | null;
  constructor(kind: string, message: string, line: number | null, column: number | null) {
    super(message);
    this.kind = kind;
    this.line = line;
    this.column = column;
  }
}

function lineCol(text: string, pos: number): [number, number] {
  const before = text.slice(0, pos).split("\n");
  return [before.length, before[before.length - 1].length + 1];
}

/** The definition as data; TOML is parsed in the browser by smol-toml (loaded when first needed). */
export async function parseDefinition(text: string): Promise<unknown> {
  if (formatOf(text) === "json") {
    try {
      return JSON.parse(text);
    } catch (e) {
      const msg = (e as Error).message;
      const m = /line (\d+) column (\d+)/.exec(msg);
      const p = /position (\d+)/.exec(msg);
      const [line, col] = m ? [Number(m[1]), Number(m[2])] : p ? lineCol(text, Number(p[1])) : [null, null];
      throw new DefinitionError("JSON", `the definition is not valid JSON: ${msg.replace(/\s*\(line \d+ column \d+\)/, "")}`, line, col);
    }
  }
  const { parse, TomlError } = await import("smol-toml");
  try {
    return parse(text);
  } catch (e) {
    if (e instanceof TomlError) throw new DefinitionError("TOML", `the definition is not valid TOML: ${e.message.split("\n")[0]}`, e.line, e.column);
    throw e;
  }
}

/** The definition a workflow was submitted with, rebuilt from its record (each step carries
 * its own), or null for a record without them. */
export function definitionOf(wf: Workflow): { name: string; inputs: Record<string, unknown>; steps: StepDef[] } | null {
  if (!wf.steps.every((s) => s.definition)) return null;
  return { name: wf.name, inputs: wf.inputs ?? {}, steps: wf.steps.map((s) => s.definition!) };
}

export function Workflows({ selected, step }: { selected: string | null; step: string | null }) {
  const list = useLoad<Workflow[]>(async (s) => listOf(await getJSON(`${O}/workflows`, s), "workflows"));
  const [def, setDef] = useState(EXAMPLE_JSON);
  const [error, setError] = useState<unknown>(null);
  const format = formatOf(def);
  const create = async (e: Event) => {
    e.preventDefault();
    setError(null);
    let body: unknown;
    try {
      body = await parseDefinition(def);
    } catch (err) {
      setError(err);
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
    <div class={`two wide-right split${selected ? " has-selection" : ""}`}>
      <div class="stack split-list">
        <form class="pane form" onSubmit={create} aria-label="New workflow">
          <h2>New workflow</h2>
          <label>
            Definition (TOML or JSON)
            <textarea rows={14} class="mono" value={def} onInput={(e) => setDef((e.currentTarget as HTMLTextAreaElement).value)} name="definition" spellcheck={false} />
          </label>
          <div class="row between">
            <span class="muted small" data-testid="definition-format">
              read as {format.toUpperCase()}
            </span>
            <span class="row">
              <button type="button" class="small" onClick={() => setDef(EXAMPLE_TOML)}>
                TOML example
              </button>
              <button type="button" class="small" onClick={() => setDef(EXAMPLE_JSON)}>
                JSON example
              </button>
            </span>
          </div>
          {error instanceof DefinitionError ? <ErrorView error={error} source={def} /> : <ErrorBox error={error} />}
          <button type="submit" class="primary" data-testid="create-workflow">
            Run workflow
          </button>
        </form>
        <RunList title="Workflows" kind="workflow" list={list} empty="No workflows yet: run one above." selected={selected}
          href={(w) => link("agents", "workflows", w.id)} label={(w) => <>{w.name} <span class="muted small">{w.id}</span></>} />
      </div>
      {selected ? (
        <WorkflowDetail key={selected} id={selected} step={step} onChange={list.reload} onEdit={(text) => (setDef(text), setError(null))} />
      ) : (
        <div class="pane muted">Select or run a workflow.</div>
      )}
    </div>
  );
}

const stepHref = (wf: string, step: string | null) => link("agents", "workflows", wf) + (step ? `?step=${encodeURIComponent(step)}` : "");

function WorkflowDetail({ id, step, onChange, onEdit }: { id: string; step: string | null; onChange: () => void; onEdit: (text: string) => void }) {
  const [wf, setWf] = useState<Workflow | null>(null);
  // An action's failure (cancel, run again) and the last read's, apart: the next read that
  // answers clears its own (the server is back after a restart), not an action's message.
  const [error, setError] = useState<unknown>(null);
  const [readError, setReadError] = useState<unknown>(null);
  const [, tick] = useState(0);
  const box = useRef<HTMLElement>(null);
  useIntoView(box, wf != null);
  const url = `${O}/workflows/${encodeURIComponent(id)}`;
  const refresh = (poll = false) =>
    getJSON<Workflow>(url, undefined, poll).then(
      (w) => (setWf(w), setReadError(null)),
      setReadError,
    );
  useEffect(() => {
    setWf(null);
    refresh();
  }, [id]);
  const live = wf != null && !FINISHED.has(wf.status);
  const down = unreachable(readError);
  // The event stream gives up after a few tries; it starts again once a read answers.
  useEvents(`${url}/events`, live && !down, (name, data) => {
    // A step event carries the step's record; merging it keeps the DAG live without a refetch.
    if (name === "step" && data?.id) {
      setWf((w) => (w ? { ...w, status: w.status === "pending" ? "running" : w.status, steps: w.steps.map((s) => (s.id === data.id ? { ...s, ...data } : s)) } : w));
    }
    if (name === "complete" || name === "error") {
      refresh();
      onChange();
    }
  });
  // Also poll while running: a server may send coarser events than one per step change (and
  // running steps' durations move).
  useInterval(() => live && (refresh(true), tick((n) => n + 1)), 2000);
  const deps = useMemo(() => {
    const out: Record<string, string[]> = {};
    for (const s of wf?.steps ?? []) out[s.id] = s.definition?.depends_on ?? [];
    return out;
  }, [wf]);
  const definition = wf ? definitionOf(wf) : null;
  const cancel = async () => {
    try {
      setWf(await postJSON<Workflow>(`${url}/cancel`));
      onChange();
    } catch (e) {
      setError(e);
    }
  };
  const rerun = async () => {
    if (!definition) return;
    setError(null);
    try {
      const again = await postJSON<Workflow>(`${O}/workflows`, definition);
      navigate(link("agents", "workflows", again.id));
      onChange();
    } catch (e) {
      setError(e);
    }
  };
  if (readError && !wf)
    return readError instanceof ApiError && readError.status === 404 ? (
      <NotFound what="Workflow" back={{ href: link("agents", "workflows"), label: "All workflows" }} />
    ) : (
      <Failure what="This workflow" error={readError} />
    );
  if (!wf) return <div class="pane muted">loading…</div>;
  const chosen = step ? wf.steps.find((s) => s.id === step) ?? null : null;
  return (
    <section class="pane open-object" aria-label="Workflow" data-testid="workflow-detail" ref={box}>
      <a class="phone-only back-link" href={link("agents", "workflows")} data-testid="back-to-list">
        ← All workflows
      </a>
      <div class="row between">
        <h2>{wf.name}</h2>
        <div class="row">
          <StatusBadge status={wf.status} />
          {live && (
            <button type="button" class="danger small" onClick={cancel}>
              Cancel
            </button>
          )}
          {definition && (
            <>
              <button type="button" class="small" onClick={rerun} data-testid="rerun" title="Submit this workflow's definition again">
                Run again
              </button>
              <button type="button" class="small" onClick={() => onEdit(JSON.stringify(definition, null, 2))} data-testid="edit-copy" title="Put this definition in the form, to change it and run it">
                Edit a copy
              </button>
            </>
          )}
        </div>
      </div>
      <div class="muted small">
        {wf.id} · {wf.steps.length} steps · {duration(between(wf.created_at, wf.finished_at, live))}
        {wf.created_at ? ` · started ${new Date(wf.created_at).toLocaleString()}` : ""}
      </div>
      {down ? <Unreachable error={readError} what="the workflow below is" /> : <ErrorBox error={readError} />}
      <ErrorBox error={error} />
      {wf.error && <ErrorView error={wf.error} />}
      <Dag steps={wf.steps} deps={deps} selected={chosen?.id ?? null} onSelect={(s) => navigate(stepHref(wf.id, s === chosen?.id ? null : s))} />
      {step && !chosen && <div class="notice">This workflow has no step “{step}”.</div>}
      {chosen && <StepDetail wf={wf} step={chosen} live={live} />}
      <div class="scroll-x">
        <table class="data">
          <thead>
            <tr>
              <th>Step</th>
              <th>Status</th>
              <th>Attempts</th>
              <th>Duration</th>
              <th>Result / error</th>
            </tr>
          </thead>
          <tbody>
            {wf.steps.map((s) => (
              <tr key={s.id} data-step={s.id}>
                <td>
                  <a href={stepHref(wf.id, s.id)} aria-current={chosen?.id === s.id ? "true" : undefined}>
                    <code>{s.id}</code>
                  </a>
                </td>
                <td>
                  <StatusBadge status={s.status} />
                </td>
                <td class="num">{s.attempts ?? 0}</td>
                <td class="num">{s.started_at ? duration(between(s.started_at, s.finished_at, s.status === "running" || s.status === "waiting")) : "—"}</td>
                <td class="clip">{s.error ? `${s.error.kind ?? ""} ${s.error.message ?? JSON.stringify(s.error)}` : show(s.result)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </section>
  );
}

/** One step: its definition, times, attempts, output or error (with a caret under its code),
 * and for an agent-task step its task's timeline and a link to it. */
function StepDetail({ wf, step, live }: { wf: Workflow; step: WStep; live: boolean }) {
  const d = step.definition;
  const running = step.status === "running" || step.status === "waiting";
  const maxAttempts = d ? (d.retries ?? 0) + 1 : null;
  const [task, setTask] = useState<Task | null>(null);
  const box = useRef<HTMLElement>(null);
  useIntoView(box, step.id);
  useEffect(() => {
    setTask(null);
    if (!step.task_id) return;
    getJSON<Task>(`${O}/tasks/${encodeURIComponent(step.task_id)}`).then(setTask, () => undefined);
  }, [step.task_id, step.status, step.attempts]);
  return (
    <section class="step-detail open-object" aria-label={`Step ${step.id}`} data-testid="step-detail" ref={box}>
      <div class="row between">
        <h3>
          Step <code>{step.id}</code> <StatusBadge status={step.status} />
        </h3>
        <a href={stepHref(wf.id, null)} class="small" aria-label="Close the step's detail">
          Close
        </a>
      </div>
      <dl class="facts">
        <dt>Kind</dt>
        <dd>{d?.task ? "agent task" : d?.run != null ? "conch code" : "—"}</dd>
        <dt>Depends on</dt>
        <dd>
          {d?.depends_on?.length
            ? d.depends_on.map((p, i) => (
                <>
                  {i ? ", " : ""}
                  <a href={stepHref(wf.id, p)}>
                    <code>{p}</code>
                  </a>
                </>
              ))
            : "nothing (a root)"}
        </dd>
        <dt>Duration</dt>
        <dd data-testid="step-duration">
          {step.started_at ? duration(between(step.started_at, step.finished_at, running && live)) : "not started"}
          {running && live ? " (so far)" : ""}
        </dd>
        <dt>Started</dt>
        <dd>{step.started_at ? new Date(step.started_at).toLocaleTimeString() : "—"}</dd>
        <dt>Finished</dt>
        <dd>{step.finished_at ? new Date(step.finished_at).toLocaleTimeString() : "—"}</dd>
        <dt>Attempts</dt>
        <dd data-testid="step-attempts">
          {step.attempts ?? 0}
          {maxAttempts != null ? ` of ${maxAttempts}` : ""}
          {d?.timeout_s ? ` · timeout ${d.timeout_s} s each` : ""}
        </dd>
        {step.task_id && (
          <>
            <dt>Task</dt>
            <dd>
              <a href={`${link("agents", "tasks", step.task_id)}?workflow=${encodeURIComponent(wf.id)}`} data-testid="step-task-link">
                {step.task_id}
              </a>
              {task ? <> · <StatusBadge status={task.status} /></> : null}
            </dd>
          </>
        )}
      </dl>
      {d?.run != null && (
        <>
          <h4>Code</h4>
          <pre data-testid="step-code">{d.run}</pre>
        </>
      )}
      {d?.task && (
        <>
          <h4>Goal</h4>
          <pre>{String(d.task.goal ?? "")}</pre>
        </>
      )}
      {step.error && <ErrorView error={step.error} source={d?.run ?? null} />}
      {step.result != null && (
        <>
          <h4>Output</h4>
          <pre data-testid="step-output">{show(step.result, true)}</pre>
        </>
      )}
      {task && task.steps.length > 0 && (
        <>
          <h4>Its task's steps</h4>
          <TaskTimeline steps={task.steps} usage={task.usage} />
        </>
      )}
    </section>
  );
}

const LEGEND = ["pending", "running", "waiting", "succeeded", "failed", "skipped", "cancelled"];

/** The DAG laid out in layers by longest path from a root; its edges come from each step's
 * definition in the record (so a reopened workflow draws them too). Nodes are buttons. */
function Dag({ steps, deps, selected, onSelect }: { steps: WStep[]; deps: Record<string, string[]>; selected: string | null; onSelect: (id: string) => void }) {
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
  const present = new Set(steps.map((s) => s.status));
  return (
    <div>
      <div class="dag-wrap">
        <svg class="dag" width={width} height={height} viewBox={`0 0 ${width} ${height}`} role="group" aria-label="Workflow steps and their dependencies" data-testid="dag">
          {steps.flatMap((s) =>
            (deps[s.id] ?? []).filter((p) => pos[p]).map((p) => {
              const a = pos[p];
              const b = pos[s.id];
              return (
                <path
                  key={`${p}-${s.id}`}
                  class={`edge${status[p] === "succeeded" ? " done" : ""}`}
                  data-edge={`${p}->${s.id}`}
                  d={`M${a.x + W},${a.y + H / 2} C${a.x + W + GX / 2},${a.y + H / 2} ${b.x - GX / 2},${b.y + H / 2} ${b.x},${b.y + H / 2}`}
                />
              );
            }),
          )}
          {steps.map((s) => {
            const dur = s.started_at ? between(s.started_at, s.finished_at, s.status === "running" || s.status === "waiting") : null;
            return (
              <g
                key={s.id}
                class={`node st-${status[s.id]}${selected === s.id ? " selected" : ""}`}
                transform={`translate(${pos[s.id].x},${pos[s.id].y})`}
                data-node={s.id}
                data-status={s.status}
                role="button"
                // Lower case: SVG attributes are case-sensitive (tabIndex would be ignored).
                tabindex={0}
                aria-pressed={selected === s.id}
                aria-label={`${s.id}: ${s.status}${dur != null ? `, ${duration(dur)}` : ""}${s.attempts && s.attempts > 1 ? `, try ${s.attempts}` : ""}`}
                onClick={() => onSelect(s.id)}
                onKeyDown={(e) => (e.key === "Enter" || e.key === " ") && (e.preventDefault(), onSelect(s.id))}
              >
                <title>{`${s.id}: ${s.status}`}</title>
                <rect width={W} height={H} rx={8} />
                {/* The whole id is drawn (a long one squeezed into the box, not cut short), and
                    the drawn words are the aria-label's words in the same order (WCAG 2.5.3). The
                    space ends the first line's words: axe joins the two texts without one. */}
                <text x={10} y={18} {...(s.id.length > 18 ? { textLength: W - 20, lengthAdjust: "spacingAndGlyphs" } : {})}>
                  {s.id}{" "}
                </text>
                <text x={10} y={35} class="sub">
                  {s.status}
                  {dur != null ? ` · ${duration(dur)}` : ""}
                  {s.attempts && s.attempts > 1 ? ` · try ${s.attempts}` : ""}
                </text>
              </g>
            );
          })}
        </svg>
      </div>
      <div class="dag-legend small muted" aria-hidden="true">
        {LEGEND.filter((s) => present.has(s)).map((s) => (
          <StatusBadge key={s} status={s} />
        ))}
        <span>click a step for its detail</span>
      </div>
    </div>
  );
}
