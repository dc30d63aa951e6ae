import { useRef, useState } from "preact/hooks";
import { getJSON, listOf } from "../api";
import { Failure, StatusBadge, Unreachable, unreachable, useInterval, useLoad } from "../components/common";
import { PendingCall } from "../components/PendingCall";
import { O, type Task, type Workflow } from "../orch";
import { link, plural } from "../router";

type Inbox = { tasks: Task[]; steps: Map<string, { wf: Workflow; step: string }> };

/** Everything that waits for a person: tasks in status `waiting` (a workflow's task step
 * among them, named by its workflow and step), each with its pending calls. Polled; while
 * the server cannot be reached (a restart) the calls last read stay, marked as such. */
export function Approvals({ onCount }: { onCount?: (waiting: { calls: number; tasks: number }) => void }) {
  const inbox = useLoad<Inbox>(async (s, poll) => {
    const [tasks, wfs] = await Promise.all([
      getJSON(`${O}/tasks?status=waiting&limit=200`, s, poll).then((b) => listOf<Task>(b, "tasks")),
      getJSON(`${O}/workflows?status=running&limit=200`, s, poll).then((b) => listOf<Workflow>(b, "workflows")),
    ]);
    const steps = new Map<string, { wf: Workflow; step: string }>();
    for (const wf of wfs) for (const st of wf.steps) if (st.task_id) steps.set(st.task_id, { wf, step: st.id });
    const waiting = tasks.filter((t) => t.status === "waiting");
    onCount?.({ calls: waiting.reduce((n, t) => n + (t.pending?.length ?? 0), 0), tasks: waiting.length });
    return { tasks: waiting, steps };
  });
  useInterval(inbox.poll, 3000);
  const lastRead = useRef<Inbox | null>(null);
  if (inbox.data) lastRead.current = inbox.data;
  const down = unreachable(inbox.error);
  const data = inbox.data ?? (down ? lastRead.current : null);
  const [decided, setDecided] = useState<string | null>(null);
  const calls = (data?.tasks ?? []).reduce((n, t) => n + (t.pending?.length ?? 0), 0);
  return (
    <section class="pane stack" aria-label="Approvals" data-testid="approvals">
      <div class="row between">
        <h2>Waiting for a person</h2>
        <button type="button" class="small" onClick={inbox.reload}>
          Refresh
        </button>
      </div>
      {down && data ? <Unreachable error={inbox.error} what="the calls below are" /> : inbox.error ? <Failure what="Approvals" error={inbox.error} /> : null}
      <div role="status" class="muted small" data-testid="approvals-summary">
        {data ? `${plural(data.tasks.length, "task")} waiting, ${plural(calls, "call")} to decide` : "loading…"}
        {decided ? ` · ${decided}` : ""}
      </div>
      {data && data.tasks.length === 0 && (
        <p class="muted" data-testid="approvals-empty">
          Nothing waits for an approval. A task waits when its approval policy says <code>ask</code> for a call (docs/orchestration.md, "Approval policies").
        </p>
      )}
      {(data?.tasks ?? []).map((t) => {
        const step = data!.steps.get(t.id);
        return (
          <article class="approval" key={t.id} data-testid="approval" data-task={t.id} aria-label={`Task ${t.goal}`}>
            <div class="row between">
              <div>
                {step ? (
                  <div class="small" data-testid="approval-workflow">
                    workflow <a href={link("agents", "workflows", step.wf.id) + `?step=${encodeURIComponent(step.step)}`}>{step.wf.name}</a> · step <code>{step.step}</code>
                  </div>
                ) : null}
                <a href={link("agents", "tasks", t.id)}>
                  <strong>{t.goal}</strong>
                </a>
                <div class="muted small">
                  {t.id} · agent {t.agent} · step {t.steps.length + 1} of at most {t.max_steps}
                  {t.approval_deadline ? ` · rejected by itself at ${new Date(t.approval_deadline).toLocaleString()}` : ""}
                </div>
              </div>
              <StatusBadge status={t.status} />
            </div>
            {(t.pending ?? []).map((c) => (
              <PendingCall
                key={`${t.id}/${c.call_id}`}
                task={t}
                call={c}
                onDecided={(after) => {
                  setDecided(`${c.tool} in “${t.goal.slice(0, 40)}”: ${after?.status === "waiting" ? "decided, more calls wait" : "decided"}`);
                  inbox.reload();
                }}
              />
            ))}
          </article>
        );
      })}
    </section>
  );
}
