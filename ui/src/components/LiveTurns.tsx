import { duration } from "./common";
import { type LiveRun, type LiveTurn, useLive, useTicker } from "../live";
import { tokens } from "../orch";

/** The model turns of a running task not yet recorded as steps, as they are generated: the
 * thinking text where the model gives it, the reply's text, each tool call as it forms, the
 * tokens so far and the time since the turn began. Rendered once per animation frame at most
 * (LiveRun batches the deltas). */
export function LiveTurns({ run, running }: { run: LiveRun; running: boolean }) {
  useLive(run);
  const busy = running && run.turns.some((t) => t.elapsedMs == null);
  useTicker(busy || (running && run.retry != null), 100);
  return (
    <>
      {run.turns.map((t) => (
        <Turn key={`${t.step}.${t.turn}`} t={t} />
      ))}
      {running && run.turns.length === 0 && !run.retry && (
        <li class="muted" data-testid="live-waiting">
          waiting for the next step…
        </li>
      )}
      {running && run.retry && (
        <li class="muted small" data-testid="live-retry">
          The model server is not answering ({run.retry.error}): asking again in {duration(run.retry.retryInMs)}; waited {duration(run.retry.waitedMs)} so far.
        </li>
      )}
      {run.dropped > 0 && (
        <li class="muted small" data-testid="live-gap">
          {run.dropped.toLocaleString()} live updates were dropped (this page fell behind); each step's full text is in its record once it ends.
        </li>
      )}
    </>
  );
}

function Turn({ t }: { t: LiveTurn }) {
  const ms = t.elapsedMs ?? performance.now() - t.began;
  const live = t.elapsedMs == null;
  const total = tokens(t.usage);
  return (
    <li value={t.step + 1} class={`tl-step live-turn${live ? " is-live" : ""}`} data-testid="live-turn" data-step={t.step} aria-busy={live ? "true" : undefined}>
      <span class="tl-num" aria-hidden="true">
        {t.step + 1}
      </span>
      <div class="tl-body">
        <div class="tl-head">
          <strong>{live ? "the model is answering" : "answered; running its calls"}</strong>
          {t.turn > t.step && <span class="muted small">model request {t.turn + 1}</span>}
          <span class="muted small" data-testid="live-elapsed">
            {duration(ms)}
          </span>
          <span class="muted small" data-testid="live-tokens" title={total != null ? `${t.usage?.prompt_tokens ?? "?"} in, ${t.usage?.completion_tokens ?? "?"} out` : "tokens generated so far"}>
            {t.tokens.toLocaleString()} tokens{total != null ? ` (${total.toLocaleString()} in all)` : ""}
          </span>
          {live && <span class="badge busy">live</span>}
        </div>
        {!t.streamed && live && <div class="muted small">This request began before the page joined: its text comes with the step.</div>}
        {t.thinking && (
          <details open class="thinking" data-testid="live-thinking">
            <summary>Thinking</summary>
            <pre class="small">{t.thinking}</pre>
          </details>
        )}
        {t.text && (
          <pre class="small live-text" data-testid="live-text">
            {t.text}
          </pre>
        )}
        {t.calls.map((c) => (
          <pre class="small" key={c.index} data-testid="live-call">
            {`${c.name ?? "…"}(${c.args}${live ? "…" : ")"}`}
          </pre>
        ))}
        {t.error && <div class="small field-error">{t.error}</div>}
      </div>
    </li>
  );
}
