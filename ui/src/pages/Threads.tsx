import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, getJSON, listOf, postJSON } from "../api";
import { AgentSelect } from "../components/AgentSelect";
import { ErrorBox, Failure, StatusBadge, useIntoView, useLoad } from "../components/common";
import { LiveTurns } from "../components/LiveTurns";
import { NotFound } from "../components/NotFound";
import { PendingCall } from "../components/PendingCall";
import { TaskErrorView } from "../components/TaskError";
import { TaskTimeline } from "../components/TaskTimeline";
import { useTaskStream } from "../live";
import { FINISHED, O, show, type Task, type Thread, type TStep, useDecisions } from "../orch";
import { link, navigate, plural } from "../router";

// Threads (docs/orchestration.md, "Forks and threads"): tasks that share one conversation.
// The API has no list of threads; the list here is the tasks' `thread_id`s.

/** Where a fork went on from: after its kept steps. */
export function forkPoint(cp: number | null | undefined): string {
  return cp ? `after step ${cp}` : "from the start";
}

const shortId = () => Math.random().toString(36).slice(2, 7);

type Summary = { id: string; tasks: Task[]; last: Task };

function summaries(tasks: Task[]): Summary[] {
  const by = new Map<string, Task[]>();
  for (const t of tasks) if (t.thread_id) by.set(t.thread_id, [...(by.get(t.thread_id) ?? []), t]);
  return [...by.entries()]
    .map(([id, ts]) => {
      ts.sort((a, b) => String(a.created_at).localeCompare(String(b.created_at)));
      return { id, tasks: ts, last: ts[ts.length - 1] };
    })
    .sort((a, b) => String(b.last.created_at).localeCompare(String(a.last.created_at)));
}

/** The Threads tab: a new thread's first goal and the threads there are; the open thread
 * beside them (in their place on a phone). */
export function Threads({ agents, selected }: { agents: any[]; selected: string | null }) {
  const list = useLoad<Task[]>(async (s) => listOf(await getJSON(`${O}/tasks?limit=1000`, s), "tasks"));
  const [thread, setThread] = useState(() => `thread-${shortId()}`);
  const [goal, setGoal] = useState("");
  const [tools, setTools] = useState("ls, cat, len");
  const [agent, setAgent] = useState("");
  const [error, setError] = useState<unknown>(null);
  const start = async (e: Event) => {
    e.preventDefault();
    setError(null);
    try {
      const body: Record<string, unknown> = { goal, thread_id: thread.trim(), tools: tools.split(",").map((t) => t.trim()).filter(Boolean) };
      if (agent) body.agent = agent;
      await postJSON<Task>(`${O}/tasks`, body);
      navigate(link("agents", "threads", thread.trim()));
      setThread(`thread-${shortId()}`);
      setGoal("");
      list.reload();
    } catch (err) {
      setError(err);
    }
  };
  const threads = summaries(list.data ?? []);
  return (
    <div class={`two wide-right split${selected ? " has-selection" : ""}`}>
      <div class="stack split-list">
        <form class="pane form" onSubmit={start} aria-label="New thread">
          <h2>New thread</h2>
          <label>
            Thread id
            <input required maxLength={200} value={thread} onInput={(e) => setThread((e.currentTarget as HTMLInputElement).value)} name="thread_id" />
          </label>
          <label>
            First goal
            <textarea rows={2} required value={goal} onInput={(e) => setGoal((e.currentTarget as HTMLTextAreaElement).value)} name="goal" />
          </label>
          <div class="row">
            <label>
              Tools
              <input value={tools} onInput={(e) => setTools((e.currentTarget as HTMLInputElement).value)} name="tools" />
            </label>
            <AgentSelect agents={agents} value={agent} onChange={setAgent} />
          </div>
          <ErrorBox error={error} />
          <button type="submit" class="primary" data-testid="start-thread">
            Start thread
          </button>
        </form>
        <section class="pane" aria-label="Threads">
          <div class="row between">
            <h2>Threads</h2>
            <button type="button" class="small" onClick={list.reload}>
              Refresh
            </button>
          </div>
          {list.error ? <Failure what="Threads" error={list.error} /> : null}
          {list.data && !threads.length && <p class="muted">No threads yet: start one above.</p>}
          <ul class="item-list" data-testid="thread-list">
            {threads.map((t) => (
              <li key={t.id}>
                <a class="item-link" href={link("agents", "threads", t.id)} aria-current={t.id === selected ? "page" : undefined} data-thread={t.id}>
                  <StatusBadge status={t.last.status} /> <strong>{t.id}</strong> <span class="muted small">{plural(t.tasks.length, "task")}: {t.last.goal}</span>
                </a>
              </li>
            ))}
          </ul>
        </section>
      </div>
      {selected ? <ThreadView key={selected} id={selected} all={list.data ?? []} onChange={list.reload} /> : <div class="pane muted">Select or start a thread.</div>}
    </div>
  );
}

/** One thread: its conversation over its tasks, each step with "Fork from here", a box for
 * the next goal, and the fork tree it belongs to. */
function ThreadView({ id, all, onChange }: { id: string; all: Task[]; onChange: () => void }) {
  const [thread, setThread] = useState<Thread | null>(null);
  const [error, setError] = useState<unknown>(null);
  const box = useRef<HTMLElement>(null);
  useIntoView(box, thread != null);
  // Every stored event of a task asks again; under load the answers can come back out of
  // order, and an older one must not draw over a newer (a step seen, then gone again).
  const asked = useRef(0);
  const refresh = () => {
    const n = ++asked.current;
    getJSON<Thread>(`${O}/threads/${encodeURIComponent(id)}`).then(
      (t) => n === asked.current && (setThread(t), setError(null)),
      (e) => n === asked.current && setError(e),
    );
  };
  useEffect(() => {
    refresh();
    onChange(); // the list (and the fork tree drawn from it) may not have this thread yet
  }, [id]);
  if (error && !thread)
    return error instanceof ApiError && error.status === 404 ? (
      <NotFound what="Thread" back={{ href: link("agents", "threads"), label: "All threads" }} />
    ) : (
      <Failure what="This thread" error={error} />
    );
  if (!thread) return <div class="pane muted">loading…</div>;
  const tasks = thread.tasks;
  const last = tasks[tasks.length - 1];
  const busy = tasks.find((t) => !FINISHED.has(t.status));
  const changed = () => (refresh(), onChange());
  return (
    <section class="pane open-object stack" aria-label={`Thread ${id}`} data-testid="thread" ref={box}>
      <a class="phone-only back-link" href={link("agents", "threads")}>
        ← All threads
      </a>
      <div class="row between">
        <h2>
          Thread <code>{id}</code>
        </h2>
        <span class="muted small">{plural(tasks.length, "task")}</span>
      </div>
      <ol class="conversation" aria-label="Conversation">
        {tasks.map((t) => (
          <ThreadTask key={t.id} task={t} onChange={changed} />
        ))}
      </ol>
      <NextGoal thread={id} last={last} busy={busy ?? null} onSent={changed} />
      <ForkTree tasks={all.length ? mergeTasks(all, tasks) : tasks} here={id} />
    </section>
  );
}

function mergeTasks(all: Task[], fresh: Task[]): Task[] {
  const ids = new Set(fresh.map((t) => t.id));
  return [...all.filter((t) => !ids.has(t.id)), ...fresh];
}

/** One task of the thread: the goal asked, its steps (live while it runs), its answer. */
function ThreadTask({ task, onChange }: { task: Task; onChange: () => void }) {
  const live = !FINISHED.has(task.status);
  const running = live && task.status !== "waiting";
  const run = useTaskStream(task.id, live, (name) => {
    if (["step", "interrupt", "resume", "complete", "error"].includes(name)) onChange();
  });
  const final = task.steps.find((s) => s.action === "final");
  const decisions = useDecisions(task.id, `${task.status}/${task.steps.length}/${task.pending?.length ?? 0}`);
  return (
    <li class="thread-task" data-testid="thread-task" data-task={task.id}>
      <article class="msg user" aria-label="Goal">
        <div class="muted small">
          goal · <a href={link("agents", "tasks", task.id)}>{task.id}</a>
          {task.forked_from ? ` · forked from ${task.forked_from} ${forkPoint(task.fork_checkpoint)}` : ""}
        </div>
        <div data-testid="thread-goal">{task.goal}</div>
      </article>
      <div class="thread-steps">
        <TaskTimeline steps={task.steps.filter((s) => s.action !== "final")} live={running} usage={task.usage} decisions={decisions}
          actions={(s) => <ForkButton task={task} step={s} />}>
          {live ? <LiveTurns run={run} running={running} /> : undefined}
        </TaskTimeline>
      </div>
      {task.status === "waiting" &&
        (task.pending ?? []).map((c) => <PendingCall key={c.call_id} task={task} call={c} onDecided={() => onChange()} />)}
      {final && (
        <article class="msg assistant" aria-label="Answer" data-testid="thread-answer">
          <div class="row between">
            <span class="muted small">answer · step {final.index + 1}</span>
            <ForkButton task={task} step={final} />
          </div>
          <div>{show((final.args as any)?.final ?? task.result)}</div>
        </article>
      )}
      {task.error && <TaskErrorView error={task.error} />}
      <div class="muted small">
        <StatusBadge status={task.status} />
      </div>
    </li>
  );
}

/** The box for the thread's next goal: a new task in the thread, with the last task's tools,
 * agent, model, step budget and policy. The server refuses it (409) while a task of the
 * thread is active; the box says so first. */
function NextGoal({ thread, last, busy, onSent }: { thread: string; last: Task | undefined; busy: Task | null; onSent: () => void }) {
  const [goal, setGoal] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [sending, setSending] = useState(false);
  const send = async (e: Event) => {
    e.preventDefault();
    if (!goal.trim() || busy) return;
    setError(null);
    setSending(true);
    try {
      const body: Record<string, unknown> = { goal: goal.trim(), thread_id: thread };
      if (last) {
        body.tools = last.tools;
        body.max_steps = last.max_steps;
        if (last.agent) body.agent = last.agent;
        if (last.model) body.model = last.model;
        const p = last.approvals;
        if (p && (p.default || Object.keys(p.effects ?? {}).length || Object.keys(p.tools ?? {}).length)) body.approvals = p;
      }
      await postJSON<Task>(`${O}/tasks`, body);
      setGoal("");
      onSent();
    } catch (err) {
      setError(err);
    } finally {
      setSending(false);
    }
  };
  return (
    <form class="form next-goal" onSubmit={send} aria-label="Next goal" data-testid="next-goal">
      <label>
        Next goal in this thread
        <textarea
          rows={2}
          value={goal}
          onInput={(e) => setGoal((e.currentTarget as HTMLTextAreaElement).value)}
          onKeyDown={(e) => {
            if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) send(e);
          }}
          aria-describedby="next-goal-note"
          name="goal"
          data-testid="next-goal-input"
        />
      </label>
      <div class="row between">
        <span id="next-goal-note" class="muted small">
          {busy ? `Wait for task ${busy.id} (${busy.status}) to end: a thread runs one task at a time.` : "The model sees the whole conversation so far. Ctrl+Enter sends."}
        </span>
        <button type="submit" class="primary" disabled={!!busy || sending || !goal.trim()} data-testid="send-goal">
          Send
        </button>
      </div>
      <ErrorBox error={error} />
    </form>
  );
}

/** "Fork from here" on a step: a new task that keeps the steps up to this one (a tool step)
 * or before it (the final answer), with this step's tool result edited and/or a message
 * added; by default it starts a thread of its own, to go on talking there. */
export function ForkButton({ task, step }: { task: Task; step: TStep }) {
  const [open, setOpen] = useState(false);
  const final = step.action === "final";
  // A tool step is kept (its result may be edited); the final answer is not (a fork goes on
  // before it: the API keeps at most the steps before a final answer).
  const checkpoint = final ? step.index : step.index + 1;
  const original = show(step.observation);
  const [result, setResult] = useState(original);
  const [message, setMessage] = useState("");
  const [thread, setThread] = useState(() => `${task.thread_id ?? "fork"}-${shortId()}`);
  const [maxSteps, setMaxSteps] = useState(Math.max(task.max_steps, checkpoint + 1));
  const [error, setError] = useState<unknown>(null);
  const canEdit = !final && step.observation != null;
  const base = `fork-${task.id}-${step.index}`;
  const submit = async (e: Event) => {
    e.preventDefault();
    setError(null);
    try {
      const body: Record<string, unknown> = { checkpoint };
      if (canEdit && result !== original) body.tool_result = result;
      if (message.trim()) body.message = message.trim();
      if (thread.trim()) body.thread_id = thread.trim();
      if (maxSteps !== task.max_steps) body.max_steps = maxSteps;
      const made = await postJSON<Task>(`${O}/tasks/${encodeURIComponent(task.id)}/fork`, body);
      setOpen(false);
      navigate(made.thread_id ? link("agents", "threads", made.thread_id) : link("agents", "tasks", made.id));
    } catch (err) {
      setError(err);
    }
  };
  if (!open)
    return (
      <button type="button" class="small fork-button" onClick={() => setOpen(true)} data-testid="fork-here" aria-label={`Fork from here (step ${step.index + 1})`}>
        <span aria-hidden="true">↳ </span>Fork from here
      </button>
    );
  return (
    <form class="fork-form form" onSubmit={submit} aria-label={`Fork from step ${step.index + 1}`} data-testid="fork-form">
      <div class="small">
        {final
          ? `A new task with steps 1–${step.index} of this one, asked again for its answer.`
          : `A new task with steps 1–${step.index + 1} of this one (nothing is asked or run again), going on from there.`}
      </div>
      {canEdit && (
        <label for={`${base}-result`}>
          Tool result the model is told (edit it to change what the call returned)
          <textarea id={`${base}-result`} class="mono" rows={Math.min(8, original.split("\n").length + 1)} value={result} onInput={(e) => setResult((e.currentTarget as HTMLTextAreaElement).value)} data-testid="fork-result" />
        </label>
      )}
      <label for={`${base}-message`}>
        Message added before the next model request (optional)
        <textarea id={`${base}-message`} rows={2} value={message} onInput={(e) => setMessage((e.currentTarget as HTMLTextAreaElement).value)} data-testid="fork-message" />
      </label>
      <div class="row">
        <label for={`${base}-thread`}>
          As a new thread (empty: in no thread)
          <input id={`${base}-thread`} maxLength={200} value={thread} onInput={(e) => setThread((e.currentTarget as HTMLInputElement).value)} data-testid="fork-thread" />
        </label>
        <label for={`${base}-max`}>
          Max steps
          <input id={`${base}-max`} type="number" min={checkpoint + 1} max={1000} value={maxSteps} onInput={(e) => setMaxSteps(Number((e.currentTarget as HTMLInputElement).value) || task.max_steps)} />
        </label>
      </div>
      <ErrorBox error={error} />
      <div class="row">
        <button type="submit" class="primary small" data-testid="fork-submit">
          Fork
        </button>
        <button type="button" class="small" onClick={() => setOpen(false)}>
          Cancel
        </button>
      </div>
    </form>
  );
}

type Node = { task: Task; kind: "root" | "fork" | "next"; children: Node[] };

/** The tree of tasks this thread belongs to: each task under the one it continues (the
 * previous task of its thread) or was forked from (at which step), from the first task of
 * the lineage down; this thread's tasks marked. */
export function ForkTree({ tasks, here }: { tasks: Task[]; here: string }) {
  const byId = new Map(tasks.map((t) => [t.id, t]));
  const order = [...tasks].sort((a, b) => String(a.created_at).localeCompare(String(b.created_at)));
  const prev = new Map<string, string>();
  const lastOf = new Map<string, string>();
  for (const t of order) {
    if (!t.thread_id) continue;
    const p = lastOf.get(t.thread_id);
    if (p && !t.forked_from) prev.set(t.id, p);
    lastOf.set(t.thread_id, t.id);
  }
  const parent = (t: Task): string | null => (t.forked_from && byId.has(t.forked_from) ? t.forked_from : prev.get(t.id) ?? null);
  const mine = order.filter((t) => t.thread_id === here);
  if (!mine.length) return null;
  let root = mine[0];
  for (let guard = 0; guard < 1000; guard++) {
    const p = parent(root);
    if (!p) break;
    root = byId.get(p)!;
  }
  const kids = new Map<string, Task[]>();
  for (const t of order) {
    const p = parent(t);
    if (p) kids.set(p, [...(kids.get(p) ?? []), t]);
  }
  const build = (t: Task, kind: Node["kind"], depth: number): Node => ({
    task: t,
    kind,
    children: depth > 50 ? [] : (kids.get(t.id) ?? []).map((c) => build(c, c.forked_from === t.id ? "fork" : "next", depth + 1)),
  });
  const tree = build(root, "root", 0);
  const forks = tasks.filter((t) => t.forked_from).length;
  return (
    <section aria-label="Fork tree" data-testid="fork-tree">
      <h3>Fork tree</h3>
      <p class="muted small">Each task under the one it continues (→, the thread's previous task) or was forked from (↳, at which step). This thread's tasks are marked.</p>
      {forks === 0 && tree.children.length === 0 ? <p class="muted small">No forks yet: "Fork from here" on a step starts one.</p> : null}
      <ul class="forktree">
        <TreeNode node={tree} here={here} />
      </ul>
    </section>
  );
}

function TreeNode({ node, here }: { node: Node; here: string }) {
  const t = node.task;
  const mine = t.thread_id === here;
  return (
    <li data-testid="fork-node" data-task={t.id} data-kind={node.kind} class={mine ? "here" : undefined}>
      <span class="fork-node">
        <span class="fork-edge" aria-hidden="true">
          {node.kind === "fork" ? "↳" : node.kind === "next" ? "→" : "●"}
        </span>
        {node.kind === "fork" && <span class="muted small">fork {forkPoint(t.fork_checkpoint)} · </span>}
        {node.kind === "next" && <span class="muted small">next · </span>}
        <a href={t.thread_id ? link("agents", "threads", t.thread_id) : link("agents", "tasks", t.id)}>{t.goal.length > 60 ? `${t.goal.slice(0, 60)}…` : t.goal}</a>
        <span class="muted small"> {t.thread_id ? `thread ${t.thread_id}` : "no thread"}</span> <StatusBadge status={t.status} />
        {mine && <span class="small"> (this thread)</span>}
      </span>
      {node.children.length > 0 && (
        <ul>
          {node.children.map((c) => (
            <TreeNode key={c.task.id} node={c} here={here} />
          ))}
        </ul>
      )}
    </li>
  );
}
