import type { ComponentChildren } from "preact";
import { Failure, StatusBadge } from "./common";

/** The list pane of the Tasks and Workflows pages: a title with Refresh, the failure or the
 *  empty state, and one link per run (its status and ``label``), the selected one marked. */
export function RunList<T extends { id: string; status: string }>({ title, kind, list, empty, href, selected, label }: {
  title: string;
  kind: "task" | "workflow"; // names the test ids and the data attribute each link carries
  list: { data?: T[]; error?: unknown; reload: () => void };
  empty: string;
  href: (run: T) => string;
  selected: string | null | undefined;
  label: (run: T) => ComponentChildren;
}) {
  return (
    <section class="pane" aria-label={title}>
      <div class="row between">
        <h2>{title}</h2>
        <button type="button" class="small" onClick={list.reload}>
          Refresh
        </button>
      </div>
      {list.error ? <Failure what={title} error={list.error} /> : null}
      {list.data && list.data.length === 0 && (
        <p class="muted" data-testid={`empty-${kind}s`}>
          {empty}
        </p>
      )}
      <ul class="item-list" data-testid={`${kind}-list`}>
        {(list.data ?? []).map((run) => (
          <li key={run.id}>
            <a class="item-link" href={href(run)} aria-current={selected === run.id ? "page" : undefined} {...{ [`data-${kind}`]: run.id }}>
              <StatusBadge status={run.status} /> {label(run)}
            </a>
          </li>
        ))}
      </ul>
    </section>
  );
}
