/** A Record or Array as a collapsible tree (native <details>, so it is keyboard-usable). */
export function Tree({ value, name, depth = 0 }: { value: unknown; name?: string; depth?: number }) {
  const label = name != null ? <span class="key">{name}: </span> : null;
  if (value !== null && typeof value === "object") {
    const entries = Array.isArray(value) ? value.map((v, i) => [String(i), v] as const) : Object.entries(value);
    const summary = Array.isArray(value) ? `Array [${entries.length}]` : `Record {${entries.length}}`;
    return (
      <details class="tree" open={depth < 2}>
        <summary>
          {label}
          <span class="muted">{summary}</span>
        </summary>
        <div class="tree-children">
          {entries.map(([k, v]) => (
            <Tree key={k} name={k} value={v} depth={depth + 1} />
          ))}
        </div>
      </details>
    );
  }
  const cls = value === null ? "null" : typeof value;
  return (
    <div class="tree-leaf">
      {label}
      <span class={`v-${cls}`}>{typeof value === "string" ? JSON.stringify(value) : String(value)}</span>
    </div>
  );
}
