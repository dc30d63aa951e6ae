import { show, type TaskError } from "../orch";

const WHAT: Record<string, string> = {
  StuckError: "The task stopped early: the model kept repeating a call that failed the same way.",
  LimitError: "The task ran out of steps before the model gave a final answer.",
  ProviderError: "The model server failed, or its answers were not actions.",
  InterruptedError: "The server running this task stopped, and the task could not be resumed.",
  CancelledError: "The task was cancelled.",
};

/** A failed (or cancelled) task's error, plainly: its kind, what that means, the message,
 * for a StuckError the call it repeated, how often and the error it got, and the hint. */
export function TaskErrorView({ error }: { error: TaskError }) {
  const kind = error.kind ?? "Error";
  return (
    <div class="error-box task-error" role="alert" data-testid="task-error" data-kind={kind}>
      <div>
        <strong data-testid="task-error-kind">{kind}</strong>
        {WHAT[kind] ? <span> · {WHAT[kind]}</span> : null}
      </div>
      <div data-testid="task-error-message">{error.message}</div>
      {kind === "StuckError" && error.call && (
        <dl class="kv small" data-testid="stuck-detail">
          <dt>Call</dt>
          <dd>
            <code>{`${error.call.tool ?? "?"}(${show(error.call.args)})`}</code>
          </dd>
          <dt>Times</dt>
          <dd>{error.count ?? "?"}</dd>
          <dt>Error each time</dt>
          <dd>
            {error.error?.kind ? `${error.error.kind}: ` : ""}
            {error.error?.message}
          </dd>
        </dl>
      )}
      {error.hint && (
        <div class="hint" data-testid="task-error-hint">
          hint: {error.hint}
        </div>
      )}
    </div>
  );
}
