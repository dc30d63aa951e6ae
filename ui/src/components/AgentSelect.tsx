/** The agent a new task or thread runs as: one of the registered agents, or the server's
 * default (the agent named "default" when there is one; shown as selected). */
export function AgentSelect({ agents, value, onChange }: { agents: { id: string }[]; value: string; onChange: (id: string) => void }) {
  const hasDefault = agents.some((a) => a.id === "default");
  return (
    <label>
      Agent
      <select name="agent" value={value || (hasDefault ? "default" : "")} onChange={(e) => onChange((e.currentTarget as HTMLSelectElement).value)}>
        {!hasDefault && <option value="">(server default)</option>}
        {agents.map((a) => (
          <option key={a.id} value={a.id}>
            {a.id}
          </option>
        ))}
      </select>
    </label>
  );
}
