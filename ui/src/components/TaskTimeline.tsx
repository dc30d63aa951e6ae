import type { ComponentChildren } from "preact";
import { duration } from "./common";
import { type Decision, show, tokens, type TStep, type Usage } from "../orch";

/** A task's steps as a timeline: one row per step (its number once), a bar placed where the
 * step ran within the task (steps run one after the other) and as long as it took, its tokens,
 * the call(s) and what came back. */
export function TaskTimeline({ steps, live, usage, decisions, actions, children }: {
  steps: TStep[];
  live?: boolean;
  usage?: Usage | null;
  /** Who approved, edited or rejected each call (from the checkpoint), by call id. */
  decisions?: Map<string, Decision>;
  /** Controls for a step (e.g. "Fork from here"). */
  actions?: (s: TStep) => ComponentChildren;
  /** The turns under way (LiveTurns), after the recorded steps. */
  children?: ComponentChildren;
}) {
  const total = steps.reduce((n, s) => n + (s.elapsed_ms ?? 0), 0);
  const allTokens = tokens(usage) ?? steps.reduce((n, s) => n + (tokens(s.usage) ?? 0), 0);
  let at = 0;
  return (
    <div>
      <div class="muted small" data-testid="timeline-summary">
        {steps.length} step{steps.length === 1 ? "" : "s"} · {duration(total)} in steps · {allTokens.toLocaleString()} tokens
      </div>
      <ol class="tl" data-testid="timeline" aria-label="Steps">
        {steps.map((s) => {
          const ms = s.elapsed_ms ?? 0;
          const left = total ? (at / total) * 100 : 0;
          const width = total ? (ms / total) * 100 : 0;
          at += ms;
          const t = tokens(s.usage);
          const calls = s.calls && s.calls.length > 1 ? s.calls : null;
          const ids = s.calls?.length ? s.calls.map((c) => c.call_id ?? "") : [`call_${s.index}`];
          const decided = ids.map((id) => decisions?.get(id)).filter((d): d is Decision => d?.decision != null);
          return (
            <li key={s.index} value={s.index + 1} class={`tl-step${s.error ? " err" : ""}`} data-testid="timeline-step">
              <span class="tl-num" aria-hidden="true">
                {s.index + 1}
              </span>
              <div class="tl-body">
                <div class="tl-head">
                  <strong>{s.action === "final" ? "final answer" : s.action}</strong>
                  <span class="muted small" data-testid="step-duration">
                    {s.elapsed_ms != null ? duration(s.elapsed_ms) : ""}
                  </span>
                  {t != null && (
                    <span class="muted small" data-testid="step-tokens" title={`${s.usage?.prompt_tokens ?? "?"} in, ${s.usage?.completion_tokens ?? "?"} out`}>
                      {t.toLocaleString()} tokens
                    </span>
                  )}
                  {s.error && <span class="badge bad">{s.error.kind ?? "error"}</span>}
                </div>
                <div class="tl-bar" role="img" aria-label={`step ${s.index + 1}: ${duration(ms)}`}>
                  <span style={{ left: `${left}%`, width: `${width}%` }} />
                </div>
                {calls
                  ? calls.map((c) => (
                      <pre class="small" key={c.call_id}>
                        {`${c.tool}(${show(c.args)})\n→ ${show(c.observation)}`}
                      </pre>
                    ))
                  : s.action !== "final" && s.args != null && <pre class="small">{show(s.args)}</pre>}
                {!calls && s.observation != null && s.action !== "final" && <pre class="small observation">{show(s.observation)}</pre>}
                {s.action === "final" && <pre class="small">{show((s.args as any)?.final ?? s.args)}</pre>}
                {s.error?.message && <div class="small field-error">{s.error.message}</div>}
                {decided.map((d) => (
                  <DecisionView key={d.call_id} d={d} />
                ))}
                {actions?.(s)}
              </div>
            </li>
          );
        })}
        {children}
        {live && children == null && <li class="muted">waiting for the next step…</li>}
      </ol>
    </div>
  );
}

/** One decision on a call: approved as it was, approved with edited arguments (before and
 * after), or rejected (with the message the model was told), and by whom: the API key that
 * decided (when the server runs with keys), a person, or the approval timeout. */
export function DecisionView({ d }: { d: Decision }) {
  const dec = d.decision!;
  // The configured admin key and a server that needs no key both decide as "admin".
  const who =
    dec.by === "timeout" ? "the approval timeout" : dec.key ? (dec.key.id === "admin" ? "the admin" : `key ${dec.key.name ?? dec.key.id}`) : "a person";
  const tool = d.ask?.tool ?? "";
  const verb = dec.decision === "reject" ? "Rejected" : dec.edited ? "Approved with edited arguments" : "Approved";
  return (
    <div class={`decision ${dec.decision === "reject" ? "rejected" : "approved"}`} data-testid="decision" data-decision={dec.decision} data-edited={dec.edited ? "true" : undefined}>
      <div class="small">
        <strong data-testid="decision-verb">{verb}</strong> by <span data-testid="decision-by">{who}</span>
        {tool ? <> · <code>{tool}</code></> : null}
        {d.ask?.reason ? <span class="muted"> · asked because {d.ask.reason}</span> : null}
        {d.at ? <span class="muted"> · {new Date(d.at).toLocaleString()}</span> : null}
      </div>
      {dec.decision === "approve" && dec.edited && (
        <div class="decision-args">
          <div>
            <div class="muted small">arguments before</div>
            <pre class="small" data-testid="args-before">{show(d.ask?.args, true)}</pre>
          </div>
          <div>
            <div class="muted small">arguments after</div>
            <pre class="small" data-testid="args-after">{show(dec.args, true)}</pre>
          </div>
        </div>
      )}
      {dec.decision === "approve" && !dec.edited && d.ask?.args != null && <pre class="small">{show(d.ask.args)}</pre>}
      {dec.decision === "reject" && (
        <div class="small">
          {d.ask?.args != null && <pre class="small">{show(d.ask.args)}</pre>}
          {dec.message ? <>the model was told: <q data-testid="decision-message">{dec.message}</q></> : <span class="muted">no message</span>}
        </div>
      )}
    </div>
  );
}
