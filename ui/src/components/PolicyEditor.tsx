import { useState } from "preact/hooks";
import { EFFECTS, type Policy, type Rule } from "../orch";

const RULES: Rule[] = ["allow", "ask", "deny"];

/** A policy with nothing in it is no policy (the request leaves `approvals` out). */
export function emptyPolicy(p: Policy): boolean {
  return !p.default && !Object.keys(p.effects ?? {}).length && !Object.keys(p.tools ?? {}).length;
}

/** An approval policy as a form: a rule for every call (`default`), per effect and per tool
 * (the tools listed), each "inherited" unless set (the agent's and the server's policies
 * decide then: docs/orchestration.md, "Approval policies"). */
export function PolicyEditor({ value, onChange, tools, idPrefix }: { value: Policy; onChange: (p: Policy) => void; tools: string[]; idPrefix: string }) {
  const set = (part: "effects" | "tools", key: string, rule: string) => {
    const next = { ...(value[part] ?? {}) };
    if (rule) next[key] = rule as Rule;
    else delete next[key];
    const out: Policy = { ...value, [part]: next };
    if (!Object.keys(next).length) delete out[part];
    onChange(out);
  };
  const select = (id: string, label: string, current: string | undefined, on: (v: string) => void, testid: string) => (
    <label class="policy-rule" for={id} key={id}>
      <span>{label}</span>
      <select id={id} value={current ?? ""} onChange={(e) => on((e.currentTarget as HTMLSelectElement).value)} data-testid={testid}>
        <option value="">inherited</option>
        {RULES.map((r) => (
          <option key={r} value={r}>
            {r}
          </option>
        ))}
      </select>
    </label>
  );
  const set_ = (value.effects ?? {}) as Record<string, string>;
  const byTool = (value.tools ?? {}) as Record<string, string>;
  const count = (value.default ? 1 : 0) + Object.keys(set_).length + Object.keys(byTool).length;
  // Open at first when it has rules; then as the user leaves it (a constant prop, so that
  // resetting the last rule does not fold it away under the pointer).
  const [opened] = useState(count > 0);
  return (
    <details class="policy" data-testid="policy-editor" open={opened}>
      <summary>
        Approval policy {count ? `(${count} rule${count === 1 ? "" : "s"})` : "(inherited)"}
      </summary>
      <p class="muted small">
        <code>ask</code> stops the task for a person's decision before the call runs; <code>deny</code> tells the model it was not run. A tool's rule wins over its effect's, and that
        over the default.
      </p>
      <fieldset>
        <legend>Every call</legend>
        {select(`${idPrefix}-default`, "default", value.default, (v) => {
          const out = { ...value };
          if (v) out.default = v as Rule;
          else delete out.default;
          onChange(out);
        }, "policy-default")}
      </fieldset>
      <fieldset>
        <legend>Per effect</legend>
        <div class="policy-grid">{EFFECTS.map((e) => select(`${idPrefix}-effect-${e}`, e, set_[e], (v) => set("effects", e, v), `policy-effect-${e}`))}</div>
      </fieldset>
      <fieldset>
        <legend>Per tool</legend>
        {tools.length ? (
          <div class="policy-grid">{tools.map((t) => select(`${idPrefix}-tool-${t}`, t, byTool[t], (v) => set("tools", t, v), `policy-tool-${t}`))}</div>
        ) : (
          <p class="muted small">List tools above to set a rule for each.</p>
        )}
      </fieldset>
    </details>
  );
}
