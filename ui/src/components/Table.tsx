import { useMemo, useState } from "preact/hooks";

const ROW = 28; // px; rows have a fixed height so that only the visible ones are rendered
const OVERSCAN = 10;

export type Row = Record<string, unknown>;

function cell(v: unknown): string {
  if (v === null || v === undefined) return "null";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function compare(a: unknown, b: unknown): number {
  if (typeof a === "number" && typeof b === "number") return a - b;
  if (a == null) return b == null ? 0 : -1;
  if (b == null) return 1;
  return cell(a).localeCompare(cell(b), undefined, { numeric: true });
}

/** A sortable table of Records; virtualised, so 10,000 rows cost what 40 do. */
export function Table({ rows, columns, height = 420 }: { rows: Row[]; columns: string[]; height?: number }) {
  const [sort, setSort] = useState<{ col: string; desc: boolean } | null>(null);
  const [top, setTop] = useState(0);
  const sorted = useMemo(() => {
    if (!sort) return rows;
    const out = rows.slice().sort((x, y) => compare(x[sort.col], y[sort.col])); // stable
    return sort.desc ? out.reverse() : out;
  }, [rows, sort]);
  const viewH = Math.min(height, (sorted.length + 1) * ROW + 2);
  const first = Math.max(0, Math.floor(top / ROW) - OVERSCAN);
  const last = Math.min(sorted.length, Math.ceil((top + viewH) / ROW) + OVERSCAN);
  const toggle = (col: string) =>
    setSort((s) => (s?.col === col ? (s.desc ? null : { col, desc: true }) : { col, desc: false }));
  return (
    <div class="table-wrap" style={{ height: `${viewH}px` }} onScroll={(e) => setTop((e.currentTarget as HTMLElement).scrollTop)} tabIndex={0}>
      <table class="data" data-testid="result-table" aria-rowcount={sorted.length + 1}>
        <thead>
          <tr>
            {columns.map((c) => (
              <th key={c} aria-sort={sort?.col === c ? (sort.desc ? "descending" : "ascending") : "none"}>
                <button type="button" onClick={() => toggle(c)}>
                  {c}
                  <span aria-hidden="true">{sort?.col === c ? (sort.desc ? " ▼" : " ▲") : ""}</span>
                </button>
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {first > 0 && <tr style={{ height: `${first * ROW}px` }} aria-hidden="true" />}
          {sorted.slice(first, last).map((r, i) => (
            <tr key={first + i} aria-rowindex={first + i + 2}>
              {columns.map((c) => {
                const v = r[c];
                return (
                  <td key={c} class={typeof v === "number" ? "num" : ""}>
                    {cell(v)}
                  </td>
                );
              })}
            </tr>
          ))}
          {last < sorted.length && <tr style={{ height: `${(sorted.length - last) * ROW}px` }} aria-hidden="true" />}
        </tbody>
      </table>
    </div>
  );
}

/** Columns when every item is a Record with the same keys in the same order (a conch Table). */
export function tableColumns(items: unknown[]): string[] | null {
  if (items.length === 0) return null;
  const first = items[0];
  if (!first || typeof first !== "object" || Array.isArray(first)) return null;
  const keys = Object.keys(first);
  const sig = keys.join("\u0000");
  for (const it of items) {
    if (!it || typeof it !== "object" || Array.isArray(it) || Object.keys(it).join("\u0000") !== sig) return null;
  }
  return keys;
}
