import { useState } from "preact/hooks";
import { ApiError, getJSON, listOf, postJSON } from "../api";
import { ErrorBox, Failure, useLoad } from "../components/common";
import { NotFound } from "../components/NotFound";
import { Tabs } from "../components/Tabs";
import { link, navigate, plural, useRoute } from "../router";

const M = "/api/v1/marketplace";

type Agent = {
  name: string;
  version: string;
  description: string;
  system_prompt?: string;
  tools?: string[];
  model?: string;
  category?: string;
  tags?: string[];
  author?: string;
  digest?: string;
  published_at?: string;
  downloads?: number;
  installed?: boolean;
  installed_version?: string | null;
  origin?: string;
};

const TABS = [
  { id: "browse", label: "Browse", href: "#/marketplace" },
  { id: "publish", label: "Publish", href: "#/marketplace?tab=publish" },
];

/** `#/marketplace[/:name]`, and `#/marketplace?tab=publish` (an agent may be named "publish"). */
export function Marketplace() {
  const route = useRoute();
  const selected = route.parts[0] ?? null;
  const tab = route.query.get("tab") === "publish" ? "publish" : "browse";
  const [q, setQ] = useState("");
  const [category, setCategory] = useState("");
  const [query, setQuery] = useState({ q: "", category: "" });
  const all = useLoad<Agent[]>(async (s) => listOf(await getJSON(`${M}/agents`, s), "agents"));
  const search = useLoad<{ total: number; results: Agent[] }>(
    (s) => getJSON(`${M}/search?${new URLSearchParams({ q: query.q, category: query.category })}`, s),
    [query.q, query.category],
  );
  if (route.parts.length > 1) return <NotFound what="Page" back={{ href: "#/marketplace", label: "Marketplace" }} />;
  if (all.error) return <Failure what="The marketplace" error={all.error} />;
  const categories = [...new Set((all.data ?? []).map((a) => a.category).filter(Boolean))].sort() as string[];
  const installed = new Map((all.data ?? []).map((a) => [a.name, a]));
  const results = search.data?.results ?? [];
  // The record from search, with the install state from the list.
  const listed = selected ? installed.get(selected) : undefined;
  const found = selected ? results.find((r) => r.name === selected) : undefined;
  const current = found || listed ? ({ ...listed, ...found, installed: listed?.installed, installed_version: listed?.installed_version } as Agent) : null;
  return (
    <div class="stack">
      <Tabs label="Marketplace" idPrefix="market" tabs={TABS} selected={tab}>
      {tab === "publish" ? (
        <Publish onPublished={(name) => (all.reload(), search.reload(), navigate(link("marketplace", name)))} />
      ) : (
        <div class="two wide-right">
          <section class="pane" aria-label="Search">
            <form
              class="row"
              role="search"
              onSubmit={(e) => {
                e.preventDefault();
                setQuery({ q, category });
              }}
            >
              <input type="search" aria-label="Search agents" placeholder="Search agents" value={q} onInput={(e) => setQ((e.currentTarget as HTMLInputElement).value)} data-testid="market-search" />
              <select aria-label="Category" value={category} onChange={(e) => (setCategory((e.currentTarget as HTMLSelectElement).value), setQuery({ q, category: (e.currentTarget as HTMLSelectElement).value }))}>
                <option value="">All categories</option>
                {categories.map((c) => (
                  <option key={c}>{c}</option>
                ))}
              </select>
              <button type="submit">Search</button>
            </form>
            {search.error ? <Failure what="Marketplace search" error={search.error} /> : null}
            <div class="muted small">{search.data ? plural(search.data.total, "agent") : "…"}</div>
            <ul class="item-list" data-testid="market-results">
              {results.map((a) => (
                <li key={a.name}>
                  <a class="item-link card-button" href={link("marketplace", a.name)} aria-current={selected === a.name ? "page" : undefined} data-agent={a.name}>
                    <strong>{a.name}</strong> <span class="muted small">{a.version}</span>
                    {installed.get(a.name)?.installed && <span class="badge good">installed {installed.get(a.name)?.installed_version}</span>}
                    {a.category && <span class="badge">{a.category}</span>}
                    <div class="small">{a.description}</div>
                  </a>
                </li>
              ))}
            </ul>
          </section>
          {current ? (
            <Detail key={current.name} agent={current} onChange={() => (all.reload(), search.reload())} />
          ) : selected && all.data ? (
            <NotFound what="Agent" back={{ href: "#/marketplace", label: "All agents" }} />
          ) : (
            <div class="pane muted">{selected ? "loading…" : "Select an agent."}</div>
          )}
        </div>
      )}
      </Tabs>
    </div>
  );
}

function Detail({ agent, onChange }: { agent: Agent; onChange: () => void }) {
  const [version, setVersion] = useState("latest");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [note, setNote] = useState<string | null>(null);
  const act = async (path: "install" | "uninstall") => {
    setBusy(true);
    setError(null);
    setNote(null);
    try {
      const body = path === "install" ? { name: agent.name, ...(version && version !== "latest" ? { version } : {}) } : { name: agent.name };
      const r = await postJSON<any>(`${M}/${path}`, body);
      setNote(path === "install" ? `installed ${r?.name ?? agent.name} ${r?.version ?? ""}` : `uninstalled ${agent.name}`);
      onChange();
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  };
  const [major] = agent.version.split(".");
  return (
    <section class="pane" aria-label={`Agent ${agent.name}`} data-testid="market-detail">
      <div class="row between">
        <h2>
          {agent.name} <span class="muted small">{agent.version}</span>
        </h2>
        {agent.installed ? <span class="badge good">installed {agent.installed_version}</span> : <span class="badge">not installed</span>}
      </div>
      <p>{agent.description}</p>
      <dl class="facts">
        <dt>Model</dt>
        <dd>{agent.model}</dd>
        <dt>Tools</dt>
        <dd>{(agent.tools ?? []).join(", ")}</dd>
        <dt>Category</dt>
        <dd>{agent.category ?? "—"}</dd>
        <dt>Tags</dt>
        <dd>{(agent.tags ?? []).join(", ") || "—"}</dd>
        <dt>Author</dt>
        <dd>{agent.author ?? "—"}</dd>
        <dt>Downloads</dt>
        <dd>{agent.downloads ?? 0}</dd>
        {agent.origin && (
          <>
            <dt>Origin</dt>
            <dd>{agent.origin}</dd>
          </>
        )}
        <dt>Digest</dt>
        <dd>
          <code class="small">{agent.digest}</code>
        </dd>
      </dl>
      {agent.system_prompt && (
        <details>
          <summary>System prompt</summary>
          <pre class="wrap">{agent.system_prompt}</pre>
        </details>
      )}
      <div class="row">
        <label>
          Version
          <input list="versions" value={version} onInput={(e) => setVersion((e.currentTarget as HTMLInputElement).value)} data-testid="version-picker" />
          <datalist id="versions">
            <option value="latest" />
            <option value={agent.version} />
            <option value={`^${major}`} />
            <option value={`~${agent.version}`} />
          </datalist>
        </label>
        <button type="button" class="primary" disabled={busy} onClick={() => act("install")} data-testid="install">
          {agent.installed ? "Reinstall / change version" : "Install"}
        </button>
        {agent.installed && (
          <button type="button" class="danger" disabled={busy} onClick={() => act("uninstall")} data-testid="uninstall">
            Uninstall
          </button>
        )}
      </div>
      {note && (
        <div class="notice small" role="status">
          {note}
        </div>
      )}
      <ErrorBox error={error} />
    </section>
  );
}

const FIELDS = ["name", "version", "description", "system_prompt", "tools", "model", "category", "tags", "author"] as const;
type Field = (typeof FIELDS)[number];

/** Client-side checks mirror the server's rules (SPEC §2.5); the server has the last word. */
function validate(v: Record<Field, string>): Partial<Record<Field, string>> {
  const e: Partial<Record<Field, string>> = {};
  if (!/^[a-z0-9]+(?:[-_][a-z0-9]+)*$/.test(v.name)) e.name = "a lowercase slug: letters, digits, - or _";
  if (v.version && !/^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?$/.test(v.version)) e.version = "an exact version like 1.2.3 (no ranges)";
  if (!v.description.trim()) e.description = "required";
  if (!v.system_prompt.trim()) e.system_prompt = "required";
  if (!v.tools.split(",").some((t) => t.trim())) e.tools = "at least one builtin name";
  if (!/^[a-z0-9_-]+:.+$/i.test(v.model)) e.model = "<provider>:<model>, e.g. local:smollm2-135m-instruct";
  return e;
}

/** Which field a server error names: its field/param, else the first field name in its message. */
function fieldOf(err: ApiError): Field | null {
  const f = err.field?.split(".").pop();
  if (f && (FIELDS as readonly string[]).includes(f)) return f as Field;
  for (const name of FIELDS) if (new RegExp(`\\b${name}\\b`).test(err.message)) return name;
  return null;
}

function Publish({ onPublished }: { onPublished: (name: string) => void }) {
  const [v, setV] = useState<Record<Field, string>>({
    name: "",
    version: "",
    description: "",
    system_prompt: "",
    tools: "",
    model: "local:smollm2-135m-instruct",
    category: "",
    tags: "",
    author: "",
  });
  const [errors, setErrors] = useState<Partial<Record<Field, string>>>({});
  const [error, setError] = useState<unknown>(null);
  const submit = async (e: Event) => {
    e.preventDefault();
    setError(null);
    const found = validate(v);
    setErrors(found);
    if (Object.keys(found).length) return;
    const list = (s: string) => s.split(",").map((x) => x.trim()).filter(Boolean);
    const body: Record<string, unknown> = {
      name: v.name,
      description: v.description,
      system_prompt: v.system_prompt,
      tools: list(v.tools),
      model: v.model,
    };
    if (v.version) body.version = v.version;
    if (v.category) body.category = v.category;
    if (v.tags) body.tags = list(v.tags);
    if (v.author) body.author = v.author;
    try {
      const rec = await postJSON<Agent>(`${M}/publish`, body);
      onPublished(rec?.name ?? v.name);
    } catch (err) {
      const f = err instanceof ApiError ? fieldOf(err) : null;
      if (f) setErrors({ [f]: (err as ApiError).message });
      else setError(err);
    }
  };
  const input = (f: Field, label: string, opts: { area?: boolean; hint?: string } = {}) => {
    const id = `pub-${f}`;
    const common = {
      id,
      name: f,
      value: v[f],
      "aria-invalid": errors[f] ? true : undefined,
      "aria-describedby": errors[f] ? `${id}-err` : undefined,
      onInput: (e: Event) => setV({ ...v, [f]: (e.currentTarget as HTMLInputElement).value }),
      placeholder: opts.hint,
    };
    return (
      <div class="field">
        <label for={id}>{label}</label>
        {opts.area ? <textarea rows={4} {...common} /> : <input {...common} />}
        {errors[f] && (
          <div class="field-error" id={`${id}-err`} data-testid={`error-${f}`}>
            {errors[f]}
          </div>
        )}
      </div>
    );
  };
  return (
    <form class="pane form narrow" onSubmit={submit} aria-label="Publish an agent" noValidate>
      <h2>Publish an agent</h2>
      {input("name", "Name", { hint: "csv-analyst" })}
      {input("version", "Version (empty: next patch)", { hint: "1.0.0" })}
      {input("description", "Description")}
      {input("system_prompt", "System prompt", { area: true })}
      {input("tools", "Tools (comma-separated builtin names)", { hint: "open, where, sort_by" })}
      {input("model", "Model")}
      {input("category", "Category", { hint: "data" })}
      {input("tags", "Tags (comma-separated)")}
      {input("author", "Author")}
      <ErrorBox error={error} />
      <button type="submit" class="primary" data-testid="publish">
        Publish
      </button>
    </form>
  );
}
