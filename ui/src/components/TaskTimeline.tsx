import { duration } from "./common";
import { show, tokens, type TStep, type Usage } from "../orch";

/** A task's steps as a timeline: one row per step (its number once), a bar placed where the
 * step ran within the task (steps run one after the other) and as long as it took, its tokens,
 * the call(s) and what came back. */
export function TaskTimeline({ steps, live, usage }: { steps: TStep[]; live?: boolean; usage?: Usage | null }) {
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
              </div>
            </li>
          );
        })}
        {live && <li class="muted">waiting for the next step…</li>}
      </ol>
    </div>
  );
}
