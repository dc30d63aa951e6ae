import { useState } from "preact/hooks";
import { postJSON } from "../api";
import { ErrorBox } from "./common";
import { O, type Pending, type Task } from "../orch";

const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

/** One call a task waits on: its tool, effect, arguments and the reason it asks; approve as it
 * is, approve with edited arguments, or reject with a message for the model. */
export function PendingCall({ task, call, onDecided }: { task: Task; call: Pending; onDecided: (t: Task | null) => void }) {
  const original = JSON.stringify(call.args ?? {}, null, 2);
  const [args, setArgs] = useState(original);
  const [message, setMessage] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  let parsed: unknown = undefined;
  let argsError: string | null = null;
  try {
    parsed = JSON.parse(args);
    if (parsed == null || typeof parsed !== "object" || Array.isArray(parsed)) argsError = "the arguments are a JSON object";
  } catch (e) {
    argsError = `not JSON: ${(e as Error).message}`;
  }
  const edited = argsError == null && !same(parsed, call.args ?? {});
  const base = `${O}/tasks/${encodeURIComponent(task.id)}`;
  const decide = async (what: "approve" | "reject") => {
    setError(null);
    setBusy(true);
    try {
      const body: Record<string, unknown> = { call_id: call.call_id };
      if (what === "approve" && edited) body.args = parsed;
      if (what === "reject" && message.trim()) body.message = message.trim();
      onDecided(await postJSON<Task>(`${base}/${what}`, body));
    } catch (e) {
      setError(e);
      setBusy(false);
    }
  };
  const id = `call-${task.id}-${call.call_id}`;
  return (
    <div class="approval-call" data-testid="pending-call" data-call={call.call_id}>
      <div class="tl-head">
        <strong>
          <code>{call.tool}</code>
        </strong>
        {call.effect && (
          <span class="badge waiting" title="the builtin's declared effect" data-testid="call-effect">
            effect: {call.effect}
          </span>
        )}
        <span class="muted small">{call.call_id}</span>
      </div>
      {call.reason && (
        <div class="small muted" data-testid="call-reason">
          {call.reason}
        </div>
      )}
      <label for={`${id}-args`}>Arguments (JSON; edit them to run the call with yours)</label>
      <textarea
        id={`${id}-args`}
        class="mono"
        rows={Math.min(10, original.split("\n").length + 1)}
        value={args}
        spellcheck={false}
        aria-invalid={argsError ? "true" : undefined}
        onInput={(e) => setArgs((e.currentTarget as HTMLTextAreaElement).value)}
        data-testid="call-args"
      />
      {argsError && <div class="field-error">{argsError}</div>}
      <div class="row">
        <button type="button" class="primary" disabled={busy || argsError != null} onClick={() => decide("approve")} data-testid="approve">
          {edited ? "Approve with edited arguments" : "Approve"}
        </button>
        {edited && (
          <button type="button" class="small" onClick={() => setArgs(original)}>
            Undo edits
          </button>
        )}
      </div>
      <div class="row">
        <label>
          Message to the model (optional)
          <input value={message} onInput={(e) => setMessage((e.currentTarget as HTMLInputElement).value)} placeholder="why not, and what to do instead" data-testid="reject-message" />
        </label>
        <button type="button" class="danger" disabled={busy} onClick={() => decide("reject")} data-testid="reject">
          Reject
        </button>
      </div>
      <ErrorBox error={error} />
    </div>
  );
}
