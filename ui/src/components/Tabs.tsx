import type { ComponentChildren } from "preact";
import { navigate } from "../router";

export type Tab = { id: string; label: string; href: string };

/** WAI-ARIA tabs: a tablist whose tabs are routes (Back returns to the previous tab), one
 * tabpanel labelled by the selected tab. Arrow keys, Home and End move between the tabs and
 * select them (replacing the history entry, so arrowing does not fill the history); only the
 * selected tab is in the Tab order. */
export function Tabs(props: { label: string; idPrefix: string; tabs: Tab[]; selected: string; children: ComponentChildren }) {
  const { tabs, selected, idPrefix } = props;
  const tabId = (id: string) => `${idPrefix}-tab-${id}`;
  const panelId = `${idPrefix}-panel`;
  const onKey = (e: KeyboardEvent) => {
    const i = tabs.findIndex((t) => t.id === selected);
    let j: number;
    if (e.key === "ArrowRight") j = (i + 1) % tabs.length;
    else if (e.key === "ArrowLeft") j = (i - 1 + tabs.length) % tabs.length;
    else if (e.key === "Home") j = 0;
    else if (e.key === "End") j = tabs.length - 1;
    else return;
    e.preventDefault();
    navigate(tabs[j].href, true);
    document.getElementById(tabId(tabs[j].id))?.focus();
  };
  return (
    <>
      <div role="tablist" class="tabs" aria-label={props.label} onKeyDown={onKey}>
        {tabs.map((t) => (
          <button
            key={t.id}
            id={tabId(t.id)}
            role="tab"
            type="button"
            aria-selected={t.id === selected}
            aria-controls={panelId}
            tabIndex={t.id === selected ? 0 : -1}
            onClick={() => navigate(t.href)}
          >
            {t.label}
          </button>
        ))}
      </div>
      <div role="tabpanel" id={panelId} aria-labelledby={tabId(selected)} class="tabpanel">
        {props.children}
      </div>
    </>
  );
}
