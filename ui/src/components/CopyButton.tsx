import { useState } from "preact/hooks";

/** Copy text: the Clipboard API where the page may use it, else a selected textarea. */
export async function copyText(text: string): Promise<void> {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const ta = document.createElement("textarea");
    ta.value = text;
    ta.setAttribute("readonly", "");
    ta.style.position = "fixed";
    ta.style.opacity = "0";
    document.body.append(ta);
    ta.select();
    document.execCommand("copy");
    ta.remove();
  }
}

/** A small Copy button that says "Copied" for a moment. */
export function CopyButton({ text, label, class: cls = "" }: { text: () => string; label: string; class?: string }) {
  const [done, setDone] = useState(false);
  return (
    <button
      type="button"
      class={`small ${cls}`}
      aria-label={label}
      title={label}
      onClick={async () => {
        await copyText(text());
        setDone(true);
        setTimeout(() => setDone(false), 1500);
      }}
    >
      {done ? "Copied" : "Copy"}
    </button>
  );
}
