import { useState } from "preact/hooks";
import { ApiError, getJSON, postJSON, send } from "../api";
import { useWho } from "../auth";
import { Confirm, ErrorBox, Head, useLoad } from "../components/common";
import { CopyButton } from "../components/CopyButton";
import { NotFound } from "../components/NotFound";
import { Tabs } from "../components/Tabs";
import { agentBase } from "../config";
import { link, plural, useRoute } from "../router";

// The admin's page (a key with the `admin` scope): keys (create, showing the secret once;
// change scopes and limits; rotate; revoke), each key's usage, and the audit log. Every
// change goes through the agent server's /api/v1/keys, which both servers apply within 1 s.

const BASE = `${agentBase ?? ""}/api/v1`;
const SCOPES = ["inference", "models:write", "execute", "sessions", "orchestration", "approve", "marketplace:publish", "admin"];
const LIMITS: [string, string][] = [
  ["requests_per_minute", "Requests / minute"],
  ["tokens_per_minute", "Tokens / minute"],
  ["tokens_per_day", "Tokens / day"],
  ["runs_per_minute", "Runs / minute"],
  ["cpu_seconds_per_day", "CPU seconds / day"],
  ["concurrent_runs", "Concurrent runs"],
  ["sessions_max", "Sessions"],
  ["disk_mb", "Disk (MB)"],
];

type Key = {
  id: string;
  name: string;
  tenant: string | null;
  scopes: string[];
  limits: Record<string, number | null>;
  models: string[] | null;
  prefix: string;
  status: string;
  expires_at: string | null;
  created_at: string;
  revoked_at: string | null;
};
type Issued = Key & { secret: string };
type Usage = { key: { id: string; name: string; tenant: string | null }; limits: { limit: string; max: number; used: number; remaining: number; resets_at: string | null }[] };
type Entry = { id: number; at: string; actor: { id: string; name: string; tenant: string | null }; action: string; target: string; details: unknown };

const TABS = [
  { id: "keys", label: "Keys", href: link("admin", "keys") },
  { id: "usage", label: "Usage", href: link("admin", "usage") },
  { id: "audit", label: "Audit log", href: link("admin", "audit") },
];

export function Admin() {
  const route = useRoute();
  const who = useWho();
  const [tab = "keys", ...rest] = route.parts;
  if (!TABS.some((t) => t.id === tab) || rest.length) return <NotFound what="Admin page" back={{ href: "#/admin", label: "Keys" }} />;
  if (who && !who.admin) return <p class="notice">This page is for an admin key.</p>;
  return (
    <section class="admin" aria-labelledby="admin-title">
      <h1 id="admin-title" class="sr-only">
        Admin
      </h1>
      <Tabs label="Admin" idPrefix="admin" tabs={TABS} selected={tab}>
        {tab === "keys" ? <Keys /> : tab === "usage" ? <UsageTab /> : <Audit />}
      </Tabs>
    </section>
  );
}

function when(iso: string | null | undefined): string {
  return iso ? new Date(iso).toLocaleString() : "—";
}

/** The secret of a key just made or rotated: shown this once. */
function Secret({ issued, onDone }: { issued: Issued; onDone: () => void }) {
  return (
    <div class="notice secret" role="status" data-testid="key-secret">
      <p>
        <strong>The secret of “{issued.name}”</strong> — shown this once (only a hash is kept). Copy it now:
      </p>
      <div class="row">
        <code class="secret-text" data-testid="key-secret-text">
          {issued.secret}
        </code>
        <CopyButton text={() => issued.secret} label="Copy the secret" />
        <button type="button" class="small" onClick={onDone}>
          Done
        </button>
      </div>
    </div>
  );
}

function Keys() {
  const keys = useLoad<Key[]>((s) => getJSON(`${BASE}/keys`, s));
  const [issued, setIssued] = useState<Issued | null>(null);
  const [editing, setEditing] = useState<string | null>(null);
  const [revoking, setRevoking] = useState<Key | null>(null);
  const [rotating, setRotating] = useState<Key | null>(null);
  const [error, setError] = useState<unknown>(null);
  const list = keys.data ?? [];
  const act = async (fn: () => Promise<void>) => {
    setError(null);
    try {
      await fn();
    } catch (e) {
      setError(e);
    }
    keys.reload();
  };
  return (
    <div class="admin-keys">
      {issued && <Secret issued={issued} onDone={() => setIssued(null)} />}
      <ErrorBox error={error} />
      <KeyForm
        title="New key"
        submit="Create key"
        onSave={async (body) => {
          const made = await postJSON<Issued>(`${BASE}/keys`, body);
          setIssued(made);
          keys.reload();
        }}
      />
      <h2>Keys</h2>
      {keys.error ? <ErrorBox error={keys.error} /> : null}
      {keys.loading && !keys.data ? (
        <p class="muted">loading…</p>
      ) : (
        <div class="table-wrap">
          <table class="data" data-testid="keys-table">
            <Head cols={["Name", "Tenant", "Scopes", "Limits", "Prefix", "Status", "Created", { name: "Actions", hidden: true }]} />
            <tbody>
              {list.map((k) => (
                <tr key={k.id} data-key={k.id} data-testid="key-row">
                  <td>{k.name}</td>
                  <td>{k.tenant ?? "—"}</td>
                  <td class="clip" title={k.scopes.join(", ")}>
                    {k.scopes.join(", ") || "none"}
                  </td>
                  <td class="clip" title={limitsText(k.limits)}>
                    {limitsText(k.limits) || "none"}
                  </td>
                  <td>
                    <code>{k.prefix}</code>
                  </td>
                  <td>
                    <span class={`badge ${k.status === "active" ? "good" : "bad"}`}>{k.status}</span>
                  </td>
                  <td>{when(k.created_at)}</td>
                  <td>
                    {k.status === "active" && (
                      <div class="row">
                        <button type="button" class="small" onClick={() => setEditing(editing === k.id ? null : k.id)} aria-expanded={editing === k.id} aria-label={`Change ${k.name}`}>
                          Change
                        </button>
                        <button type="button" class="small" onClick={() => setRotating(k)} aria-label={`Rotate ${k.name}`}>
                          Rotate
                        </button>
                        <button type="button" class="small danger" onClick={() => setRevoking(k)} aria-label={`Revoke ${k.name}`}>
                          Revoke
                        </button>
                      </div>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          {list.length === 0 && <p class="muted small">No keys yet.</p>}
        </div>
      )}
      {editing && list.find((k) => k.id === editing) && (
        <KeyForm
          key={editing}
          title={`Change “${list.find((k) => k.id === editing)!.name}”`}
          submit="Save"
          start={list.find((k) => k.id === editing)!}
          onSave={async (body) => {
            // A limit left empty is removed (null in the merge patch); the tenant stays.
            const { tenant: _t, ...rest } = body;
            const limits: Record<string, number | null> = { ...(rest.limits as Record<string, number>) };
            for (const [name] of LIMITS) if (!(name in limits)) limits[name] = null;
            await send(`${BASE}/keys/${encodeURIComponent(editing)}`, { method: "PATCH", body: JSON.stringify({ ...rest, limits }) });
            setEditing(null);
            keys.reload();
          }}
          onCancel={() => setEditing(null)}
        />
      )}
      <Confirm
        open={!!rotating}
        title={`Rotate “${rotating?.name}”?`}
        confirm="Rotate"
        onClose={(ok) => {
          const k = rotating;
          setRotating(null);
          if (ok && k) void act(async () => setIssued(await postJSON<Issued>(`${BASE}/keys/${encodeURIComponent(k.id)}/rotate`)));
        }}
      >
        <p>A new secret replaces the old one, which stops working on every server within a second. Its limits and usage stay.</p>
      </Confirm>
      <Confirm
        open={!!revoking}
        title={`Revoke “${revoking?.name}”?`}
        confirm="Revoke"
        onClose={(ok) => {
          const k = revoking;
          setRevoking(null);
          if (ok && k) void act(async () => void (await send(`${BASE}/keys/${encodeURIComponent(k.id)}`, { method: "DELETE" })));
        }}
      >
        <p>The key stops working on every server within a second, for good.</p>
      </Confirm>
    </div>
  );
}

function limitsText(limits: Record<string, number | null>): string {
  return Object.entries(limits ?? {})
    .filter(([, v]) => v != null)
    .map(([k, v]) => `${k} ${v}`)
    .join(", ");
}

/** A key's fields: name, tenant (on creation only), scopes, limits, models. A bad field
 * the server names is marked where it is. */
function KeyForm(props: { title: string; submit: string; start?: Key; onSave: (body: Record<string, unknown>) => Promise<void>; onCancel?: () => void }) {
  const s = props.start;
  const [name, setName] = useState(s?.name ?? "");
  const [tenant, setTenant] = useState(s?.tenant ?? "");
  const [scopes, setScopes] = useState<string[]>(s?.scopes ?? ["inference"]);
  const [limits, setLimits] = useState<Record<string, string>>(() =>
    Object.fromEntries(Object.entries(s?.limits ?? {}).filter(([, v]) => v != null).map(([k, v]) => [k, String(v)])),
  );
  const [models, setModels] = useState((s?.models ?? []).join(", "));
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  const prefix = s ? `edit-${s.id}` : "new-key";
  const bad = (field: string) => (error?.field && (error.field === field || error.field.startsWith(`${field}.`)) ? error : null);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    const body: Record<string, unknown> = { name: name.trim(), scopes };
    if (!s && tenant.trim()) body.tenant = tenant.trim();
    const lim: Record<string, number> = {};
    for (const [k, v] of Object.entries(limits)) if (v.trim() !== "") lim[k] = Number(v);
    body.limits = lim;
    const ms = models
      .split(",")
      .map((m) => m.trim())
      .filter(Boolean);
    body.models = ms.length ? ms : null;
    try {
      await props.onSave(body);
      if (!s) {
        setName("");
        setTenant("");
        setLimits({});
        setModels("");
      }
    } catch (err) {
      setError(err instanceof ApiError ? err : new ApiError(0, String(err)));
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="pane form key-form" onSubmit={submit} aria-label={props.title} data-testid={s ? "key-edit" : "key-create"} noValidate>
      <h2>{props.title}</h2>
      {error && !error.field ? <ErrorBox error={error} /> : null}
      <div class="row">
        <label>
          Name
          <input value={name} onInput={(e) => setName((e.currentTarget as HTMLInputElement).value)} required aria-invalid={!!bad("name")} data-testid="key-name" />
        </label>
        {!s && (
          <label>
            Tenant (optional)
            <input value={tenant} onInput={(e) => setTenant((e.currentTarget as HTMLInputElement).value)} aria-invalid={!!bad("tenant")} data-testid="key-tenant" />
          </label>
        )}
        <label>
          Models (optional, comma-separated patterns)
          <input value={models} onInput={(e) => setModels((e.currentTarget as HTMLInputElement).value)} placeholder="local:*" aria-invalid={!!bad("models")} />
        </label>
      </div>
      {(["name", "tenant", "models"] as const).map((f) =>
        bad(f) ? (
          <p class="field-error" role="alert" key={f}>
            {bad(f)!.message}
          </p>
        ) : null,
      )}
      <fieldset class="scopes">
        <legend>Scopes</legend>
        {SCOPES.map((sc) => (
          <label class="check" key={sc}>
            <input
              type="checkbox"
              checked={scopes.includes(sc)}
              onChange={(e) => {
                const on = (e.currentTarget as HTMLInputElement).checked;
                setScopes((cur) => (on ? [...cur, sc] : cur.filter((x) => x !== sc)));
              }}
              data-scope={sc}
            />
            {sc}
          </label>
        ))}
      </fieldset>
      {bad("scopes") && (
        <p class="field-error" role="alert">
          {bad("scopes")!.message}
        </p>
      )}
      <fieldset class="limits">
        <legend>Limits (empty: none)</legend>
        <div class="row">
          {LIMITS.map(([k, label]) => (
            <label key={k}>
              {label}
              <input
                type="number"
                min={0}
                inputMode="numeric"
                value={limits[k] ?? ""}
                onInput={(e) => setLimits((cur) => ({ ...cur, [k]: (e.currentTarget as HTMLInputElement).value }))}
                aria-invalid={!!bad(`limits.${k}`)}
                data-limit={k}
                id={`${prefix}-${k}`}
              />
            </label>
          ))}
        </div>
      </fieldset>
      {error?.field?.startsWith("limits") && (
        <p class="field-error" role="alert">
          {error.message}
        </p>
      )}
      <div class="row end">
        {props.onCancel && (
          <button type="button" onClick={props.onCancel}>
            Cancel
          </button>
        )}
        <button type="submit" class="primary" disabled={busy} data-testid={s ? "key-save" : "key-create-submit"}>
          {props.submit}
        </button>
      </div>
    </form>
  );
}

function UsageTab() {
  const who = useWho();
  const keys = useLoad<Key[]>((s) => getJSON(`${BASE}/keys?include_revoked=false`, s));
  const [chosen, setChosen] = useState<string>("");
  const usage = useLoad<Usage>((s) => getJSON(`${BASE}/usage${chosen ? `?key=${encodeURIComponent(chosen)}` : ""}`, s), [chosen]);
  return (
    <div class="pane">
      <label class="narrow-label">
        Key
        <select value={chosen} onChange={(e) => setChosen((e.currentTarget as HTMLSelectElement).value)} data-testid="usage-key">
          <option value="">{who ? `${who.key.name} (this key)` : "this key"}</option>
          {(keys.data ?? []).map((k) => (
            <option key={k.id} value={k.id}>
              {k.name}
              {k.tenant ? ` · ${k.tenant}` : ""}
            </option>
          ))}
        </select>
      </label>
      {usage.error ? (
        <ErrorBox error={usage.error} />
      ) : !usage.data ? (
        <p class="muted">loading…</p>
      ) : usage.data.limits.length === 0 ? (
        <p class="muted" data-testid="usage-none">
          {usage.data.key.name} has no limits: nothing is counted against it.
        </p>
      ) : (
        <div class="table-wrap">
          <table class="data" data-testid="usage-table">
            <caption class="sr-only">Usage of {usage.data.key.name}</caption>
            <Head cols={["Limit", "Used", "Max", "Remaining", "Resets"]} />
            <tbody>
              {usage.data.limits.map((u) => (
                <tr key={u.limit} data-limit={u.limit}>
                  <td>{u.limit}</td>
                  <td>{u.used.toLocaleString()}</td>
                  <td>{u.max.toLocaleString()}</td>
                  <td>{u.remaining.toLocaleString()}</td>
                  <td>{when(u.resets_at)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </div>
  );
}

function Audit() {
  const [action, setAction] = useState("");
  const [pages, setPages] = useState<Entry[][]>([]);
  const [next, setNext] = useState<number | null>(null);
  const [error, setError] = useState<unknown>(null);
  const first = useLoad<{ entries: Entry[]; next_before: number | null }>(
    (s) => getJSON(`${BASE}/audit?limit=50${action ? `&action=${encodeURIComponent(action)}` : ""}`, s),
    [action],
  );
  const entries = [...(first.data?.entries ?? []), ...pages.flat()];
  const more = pages.length ? next : (first.data?.next_before ?? null);
  return (
    <div class="pane">
      <div class="row">
        <label class="narrow-label">
          Action
          <select
            value={action}
            onChange={(e) => {
              setPages([]);
              setAction((e.currentTarget as HTMLSelectElement).value);
            }}
            data-testid="audit-action"
          >
            <option value="">all</option>
            {["key.created", "key.changed", "key.rotated", "key.revoked", "approval.decided", "marketplace.published", "model.pulled", "model.deleted"].map((a) => (
              <option key={a} value={a}>
                {a}
              </option>
            ))}
          </select>
        </label>
        <button type="button" class="small" onClick={() => (setPages([]), first.reload())}>
          Refresh
        </button>
      </div>
      <ErrorBox error={first.error ?? error} />
      {!first.data ? (
        <p class="muted">loading…</p>
      ) : (
        <>
          <p class="muted small">{plural(entries.length, "entry", "entries")} shown, newest first</p>
          <div class="table-wrap">
            <table class="data" data-testid="audit-table">
              <Head cols={["When", "Who", "Action", "Target", "Details"]} />
              <tbody>
                {entries.map((e) => (
                  <tr key={e.id} data-action={e.action}>
                    <td>{when(e.at)}</td>
                    <td>
                      {e.actor?.name ?? "—"}
                      {e.actor?.tenant ? ` · ${e.actor.tenant}` : ""}
                    </td>
                    <td>{e.action}</td>
                    <td>
                      <code>{e.target}</code>
                    </td>
                    <td class="clip" title={JSON.stringify(e.details)}>
                      {JSON.stringify(e.details)}
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
          {more != null && (
            <button
              type="button"
              class="small"
              onClick={async () => {
                try {
                  const page = await getJSON<{ entries: Entry[]; next_before: number | null }>(
                    `${BASE}/audit?limit=50&before=${more}${action ? `&action=${encodeURIComponent(action)}` : ""}`,
                  );
                  setPages((p) => [...p, page.entries]);
                  setNext(page.next_before);
                } catch (e) {
                  setError(e);
                }
              }}
            >
              Older entries
            </button>
          )}
        </>
      )}
    </div>
  );
}
