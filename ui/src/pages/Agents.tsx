import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, getJSON, listOf, postJSON } from "../api";
import { AgentSelect } from "../components/AgentSelect";
import { duration, ErrorBox, Failure, StatusBadge, useInterval, useIntoView, useLoad } from "../components/common";
import { NotFound } from "../components/NotFound";
import { RunList } from "../components/RunList";
import { Tabs } from "../components/Tabs";
import { PendingCall } from "../components/PendingCall";
import { TaskTimeline } from "../components/TaskTimeline";
import { LiveTurns } from "../components/LiveTurns";
import { TaskErrorView } from "../components/TaskError";
import { emptyPolicy, PolicyEditor } from "../components/PolicyEditor";
import { ForkButton, forkPoint, Threads } from "./Threads";
import { useTaskStream, useTicker } from "../live";
import { FINISHED, O, type Policy, type Task, useDecisions, type Workflow } from "../orch";
import { link, navigate, useRoute } from "../router";
import { Approvals } from "./Approvals";
import { Workflows } from "./Workflows";

const TABS = [
  { id: "tasks", label: "Tasks", href: link("agents", "tasks") },
  { id: "workflows", label: "Workflows", href: link("agents", "workflows") },
  { id: "approvals", label: "Approvals", href: link("agents", "approvals") },
  { id: "agents", label: "Agents & metrics", href: link("agents", "agents") },
];

/** `#/agents[/tasks[/:id] | /workflows[/:id] | /agents]`. */
export function Agents() {
  const route = useRoute();
  const [tab = "tasks", id, ...rest] = route.parts;
  const agents = useLoad<any[]>(async (s) => listOf(await getJSON(`${O}/agents`, s), "agents"));
  // Threads are tasks that share a conversation: they live under the Tasks tab, with a
  // link between the two lists (`#/agents/threads[/:id]`).
  const known = (TABS.some((t) => t.id === tab) || tab === "threads") && rest.length === 0 && ((tab !== "agents" && tab !== "approvals") || id == null);
  if (!known) return <NotFound what="Page" back={{ href: "#/agents", label: "Agents" }} />;
  if (agents.error) return <Failure what="Orchestration (agents, tasks, workflows)" error={agents.error} />;
  return (
    <div class="stack">
      <Tabs label="Orchestration" idPrefix="agents" tabs={TABS} selected={tab === "threads" ? "tasks" : tab}>
        {(tab === "tasks" || tab === "threads") && (
          <nav class="subnav" aria-label="Tasks or threads">
            <a href={link("agents", "tasks")} aria-current={tab === "tasks" ? "page" : undefined} data-testid="subnav-tasks">
              Tasks
            </a>
            <a href={link("agents", "threads")} aria-current={tab === "threads" ? "page" : undefined} data-testid="subnav-threads">
              Threads
            </a>
          </nav>
        )}
        {tab === "tasks" && <Tasks agents={agents.data ?? []} selected={id ?? null} from={route.query.get("workflow")} />}
        {tab === "threads" && <Threads agents={agents.data ?? []} selected={id ?? null} />}
        {tab === "workflows" && <Workflows selected={id ?? null} step={route.query.get("step")} />}
        {tab === "approvals" && <Approvals onCount={(n) => dispatchEvent(new CustomEvent("conch-approvals", { detail: n }))} />}
        {tab === "agents" && <AgentsAndMetrics agents={agents.data ?? []} reload={agents.reload} />}
      </Tabs>
    </div>
  );
}

/** A 404 for one object once the page's routes answered: that object is not there. */
function missing(e: unknown): boolean {
  return e instanceof ApiError && e.status === 404;
}

/** The Tasks tab: the form and the list, and the open task beside them (on a phone, in their
 * place: `split has-selection`, with a link back to the list). */
function Tasks({ agents, selected, from }: { agents: any[]; selected: string | null; from: string | null }) {
  const list = useLoad<Task[]>(async (s) => listOf(await getJSON(`${O}/tasks`, s), "tasks"));
  const [goal, setGoal] = useState("How many files are in the workspace?");
  const [tools, setTools] = useState("ls, len");
  const [maxSteps, setMaxSteps] = useState(6);
  const [agent, setAgent] = useState("");
  const [model, setModel] = useState("");
  const [policy, setPolicy] = useState<Policy>({});
  const [timeout, setTimeout_] = useState("");
  const [error, setError] = useState<unknown>(null);
  const toolList = tools.split(",").map((t) => t.trim()).filter(Boolean);
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
      const approvals = policyFor(policy, toolList);
      if (approvals) body.approvals = approvals;
      if (timeout.trim()) body.approval_timeout_s = Number(timeout);
      const task = await postJSON<Task>(`${O}/tasks`, body);
      navigate(link("agents", "tasks", task.id));
      list.reload();
    } catch (err) {
      setError(err);
    }
  };
  return (
    <div class={`two wide-right split${selected ? " has-selection" : ""}`}>
      <div class="stack split-list">
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
            <AgentSelect agents={agents} value={agent} onChange={setAgent} />
          </div>
          <label>
            Model (optional, provider:model)
            <input value={model} onInput={(e) => setModel((e.currentTarget as HTMLInputElement).value)} placeholder="local:smollm2-135m-instruct" name="model" />
          </label>
          <PolicyEditor value={policy} onChange={setPolicy} tools={toolList} idPrefix="task-policy" />
          <label>
            Approval timeout in seconds (optional: a call still waiting then is rejected)
            <input type="number" min={1} step="any" value={timeout} onInput={(e) => setTimeout_((e.currentTarget as HTMLInputElement).value)} name="approval_timeout_s" />
          </label>
          <ErrorBox error={error} />
          <button type="submit" class="primary" data-testid="create-task">
            Create task
          </button>
        </form>
        <RunList title="Tasks" kind="task" list={list} empty="No tasks yet: create one above." selected={selected}
          href={(t) => link("agents", "tasks", t.id)} label={(t) => t.goal} />
      </div>
      {selected ? <TaskDetail key={selected} id={selected} from={from} onChange={list.reload} /> : <div class="pane muted">Select or create a task.</div>}
    </div>
  );
}

/** The policy as the API takes it: rules for tools no longer listed are left out; null when
 * nothing is set (the agent's and the server's policies apply). */
export function policyFor(p: Policy, tools: string[]): Policy | null {
  const out: Policy = { ...p };
  if (out.tools) {
    out.tools = Object.fromEntries(Object.entries(out.tools).filter(([t]) => tools.includes(t)));
    if (!Object.keys(out.tools).length) delete out.tools;
  }
  return emptyPolicy(out) ? null : out;
}

/** A policy in a few words: "ls: ask · write: deny"; "—" when empty. */
function policyText(p: Policy | null | undefined): string {
  if (!p) return "—";
  const parts = [
    ...(p.default ? [`every call: ${p.default}`] : []),
    ...Object.entries(p.effects ?? {}).map(([k, v]) => `${k} (effect): ${v}`),
    ...Object.entries(p.tools ?? {}).map(([k, v]) => `${k}: ${v}`),
  ];
  return parts.length ? parts.join(" · ") : "—";
}

/** The whole task's time, counting up while it runs (a component of its own, so that its
 * ticking re-renders nothing else): the server's own elapsed time while it runs (the live
 * events' task_elapsed_ms), else from its start; its duration once it ended. */
function TaskElapsed({ task, live, running, began }: { task: Task; live: boolean; running: boolean; began: () => number | null }) {
  useTicker(running, 250);
  const start = task.started_at ? Date.parse(task.started_at) : NaN;
  const anchor = began();
  const total = task.duration_ms ?? (live ? (anchor != null ? performance.now() - anchor : isFinite(start) ? Math.max(0, Date.now() - start) : null) : null);
  if (total == null) return null;
  return (
    <span class="muted small" data-testid="task-elapsed" title="time since the task started">
      {live ? "running for " : "took "}
      {duration(total)}
    </span>
  );
}

/** The workflow step a task was started by: the workflow named in the task's address
 * (`?workflow=`, as a step's link to its task gives it), checked against that workflow's
 * steps; else looked for among the latest workflows (a task opened from the task list). */
function useStepOf(task: string, from: string | null): { wf: Workflow; step: string } | null {
  const [found, setFound] = useState<{ wf: Workflow; step: string } | null>(null);
  useEffect(() => {
    const ctl = new AbortController();
    const look = async () => {
      const wfs = from
        ? [await getJSON<Workflow>(`${O}/workflows/${encodeURIComponent(from)}`, ctl.signal)]
        : listOf<Workflow>(await getJSON(`${O}/workflows?limit=100`, ctl.signal), "workflows");
      for (const wf of wfs) {
        const st = (wf.steps ?? []).find((s) => s.task_id === task);
        if (st) return setFound({ wf, step: st.id });
      }
    };
    look().catch(() => undefined); // no workflow to link back to: nothing is shown
    return () => ctl.abort();
  }, [task, from]);
  return found;
}

function TaskDetail({ id, from, onChange }: { id: string; from: string | null; onChange: () => void }) {
  const [task, setTask] = useState<Task | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [decided, setDecided] = useState(0);
  const box = useRef<HTMLElement>(null);
  useIntoView(box, task != null);
  const origin = useStepOf(id, from);
  const refresh = () => getJSON<Task>(`${O}/tasks/${encodeURIComponent(id)}`).then(setTask, setError);
  useEffect(() => {
    setTask(null);
    refresh();
  }, [id]);
  const live = task != null && !FINISHED.has(task.status);
  const run = useTaskStream(id, live, (name, data) => {
    setTask((t) => {
      if (!t) return t;
      if (name === "step" && data && typeof data.index === "number") {
        const steps = t.steps.filter((s) => s.index !== data.index).concat([data]).sort((a, b) => a.index - b.index);
        return { ...t, status: t.status === "pending" ? "running" : t.status, steps };
      }
      // Replayed events must not undo what the record says (a waiting task stays waiting
      // until its resume event).
      if (name === "start") return { ...t, status: t.status === "pending" ? "running" : t.status, started_at: t.started_at ?? data?.started_at ?? new Date().toISOString() };
      return t;
    });
    // It stopped for a person, or goes on: the record has the pending calls (or none now).
    if (name === "interrupt" || name === "resume") {
      refresh();
      setDecided((n) => n + 1);
    }
    if (name === "complete" || name === "error") {
      refresh();
      setDecided((n) => n + 1);
      onChange();
    }
  });
  const decisions = useDecisions(id, decided);
  const running = live && task?.status !== "waiting";
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
    <section class="pane open-object" aria-label="Task" data-testid="task-detail" ref={box}>
      <a class="phone-only back-link" href={link("agents", "tasks")} data-testid="back-to-list">
        ← All tasks
      </a>
      <div class="row between">
        <h2>Task</h2>
        <div class="row">
          <TaskElapsed task={task} live={live} running={running} began={() => run.taskBegan} />
          <StatusBadge status={task.status} />
          {live && (
            <button type="button" class="danger small" onClick={cancel}>
              Cancel
            </button>
          )}
        </div>
      </div>
      {origin && (
        <p class="small" data-testid="task-workflow">
          Started by step{" "}
          <a href={`${link("agents", "workflows", origin.wf.id)}?step=${encodeURIComponent(origin.step)}`} data-testid="task-workflow-link">
            <code>{origin.step}</code> of workflow {origin.wf.name}
          </a>
        </p>
      )}
      {(task.thread_id || task.forked_from) && (
        <p class="small" data-testid="task-lineage">
          {task.thread_id && (
            <>
              In thread <a href={link("agents", "threads", task.thread_id)} data-testid="task-thread-link">{task.thread_id}</a>
              {task.forked_from ? " · " : ""}
            </>
          )}
          {task.forked_from && (
            <>
              Forked from <a href={link("agents", "tasks", task.forked_from)}>{task.forked_from}</a> {forkPoint(task.fork_checkpoint)}
            </>
          )}
        </p>
      )}
      <p>{task.goal}</p>
      <div class="muted small">
        {task.id} · tools {task.tools?.join(", ")} · max {task.max_steps} steps{task.protocol ? ` · ${task.protocol} tool calls` : ""}
      </div>
      {task.error && <TaskErrorView error={task.error} />}
      <ErrorBox error={error} />
      <TaskTimeline steps={task.steps} live={running} usage={task.usage} decisions={decisions}
        actions={(s) => <ForkButton task={task} step={s} />}>
        {live ? <LiveTurns run={run} running={running} /> : undefined}
      </TaskTimeline>
      {task.status === "waiting" && (task.pending ?? []).length > 0 && (
        <div class="approval" data-testid="task-pending">
          <strong>Waiting for your decision</strong>
          {(task.pending ?? []).map((c) => (
            <PendingCall key={c.call_id} task={task} call={c} onDecided={(t) => (t ? setTask(t) : refresh(), setDecided((n) => n + 1), onChange())} />
          ))}
        </div>
      )}
      {task.result != null && (
        <div>
          <h3>Result</h3>
          <pre>{typeof task.result === "string" ? task.result : JSON.stringify(task.result, null, 2)}</pre>
        </div>
      )}
    </section>
  );
}

function AgentsAndMetrics({ agents, reload }: { agents: any[]; reload: () => void }) {
  const metrics = useLoad<Record<string, number>>((s, poll) => getJSON(`${O}/metrics`, s, poll));
  useInterval(metrics.poll, 3000);
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
      <AgentForm onDone={reload} />
      <section class="pane" aria-label="Agents">
        <div class="row between">
          <h2>Agents</h2>
          <button type="button" class="small" onClick={reload}>
            Refresh
          </button>
        </div>
        {/* Focusable, so the keyboard can scroll a table wider than a phone (it has no links). */}
        <div class="scroll-x" tabIndex={0} role="region" aria-label="Agents table">
          <table class="data">
            <thead>
              <tr>
                <th>Id</th>
                <th>Status</th>
                <th>Model</th>
                <th>Capabilities</th>
                <th>Approvals</th>
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
                  <td class="small" data-testid="agent-approvals">{policyText(a.approvals)}</td>
                  <td>{a.description}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      </section>
    </div>
  );
}

/** Register an agent (`POST /agents`): its id, what it is for, its system prompt, tools,
 * model and approval policy. The same id again replaces the agent; the server's `400` is
 * shown on the field it names. */
function AgentForm({ onDone }: { onDone: () => void }) {
  const [id, setId] = useState("");
  const [description, setDescription] = useState("");
  const [prompt, setPrompt] = useState("");
  const [tools, setTools] = useState("ls, cat, len");
  const [model, setModel] = useState("");
  const [policy, setPolicy] = useState<Policy>({});
  const [error, setError] = useState<unknown>(null);
  const [done, setDone] = useState<string | null>(null);
  const toolList = tools.split(",").map((t) => t.trim()).filter(Boolean);
  const field = error instanceof ApiError ? String(error.field ?? "").split(/[.[]/)[0] : "";
  const submit = async (e: Event) => {
    e.preventDefault();
    setError(null);
    setDone(null);
    try {
      const body: Record<string, unknown> = { id: id.trim(), tools: toolList, system_prompt: prompt, description };
      if (model.trim()) body.model = model.trim();
      const approvals = policyFor(policy, toolList);
      if (approvals) body.approvals = approvals;
      const made = await postJSON<{ id: string }>(`${O}/agents`, body);
      setDone(`Agent ${made?.id ?? id} registered: pick it in the task form.`);
      onDone();
    } catch (err) {
      setError(err);
    }
  };
  const invalid = (name: string) => (field === name ? { "aria-invalid": "true" as const, "aria-describedby": "agent-form-error" } : {});
  return (
    <form class="pane form" onSubmit={submit} aria-label="Register an agent" data-testid="agent-form">
      <h2>Register an agent</h2>
      <div class="row">
        <label>
          Id
          <input required maxLength={64} value={id} onInput={(e) => setId((e.currentTarget as HTMLInputElement).value)} name="id" placeholder="file-counter" {...invalid("id")} />
        </label>
        <label>
          Model (optional, provider:model)
          <input value={model} onInput={(e) => setModel((e.currentTarget as HTMLInputElement).value)} name="model" placeholder="the server's default" {...invalid("model")} />
        </label>
      </div>
      <label>
        Description
        <input value={description} onInput={(e) => setDescription((e.currentTarget as HTMLInputElement).value)} name="description" />
      </label>
      <label>
        System prompt
        <textarea rows={3} value={prompt} onInput={(e) => setPrompt((e.currentTarget as HTMLTextAreaElement).value)} name="system_prompt" {...invalid("system_prompt")} />
      </label>
      <label>
        Tools (builtin names, comma-separated)
        <input required value={tools} onInput={(e) => setTools((e.currentTarget as HTMLInputElement).value)} name="tools" {...invalid("tools")} />
      </label>
      <PolicyEditor value={policy} onChange={setPolicy} tools={toolList} idPrefix="agent-policy" />
      <div id="agent-form-error">
        <ErrorBox error={error} />
      </div>
      {done && (
        <div role="status" class="small" data-testid="agent-registered">
          {done}
        </div>
      )}
      <button type="submit" class="primary" data-testid="register-agent">
        Register agent
      </button>
    </form>
  );
}
