import { useState } from "preact/hooks";
import { Confirm, ErrorBox, Failure, Head, useInterval, useLoad } from "../components/common";
import { NotFound } from "../components/NotFound";
import { FilesPanel, VariablesPanel } from "../components/SessionPanels";
import { link, navigate, plural, useRoute } from "../router";
import {
  ago,
  bytes,
  createSession,
  deleteSession,
  describeSession,
  isGone,
  listSessions,
  pauseSession,
  playgroundSession,
  type Session,
  shortId,
} from "../sessions";

/** `#/sessions`: the agent server's sessions (status, last used, workspace size) with pause
 * and delete; `#/sessions/:id`: one session, its variables and files. */
export function Sessions() {
  const route = useRoute();
  const id = route.parts[0];
  if (route.parts.length > 1) return <NotFound what="Session" back={{ href: "#/sessions", label: "All sessions" }} />;
  return id ? <SessionDetail id={id} /> : <SessionList />;
}

function useActions(after: () => void, deleted: () => void = after) {
  const [error, setError] = useState<unknown>(null);
  const [confirm, setConfirm] = useState<string | null>(null);
  const act = async (fn: () => Promise<unknown>) => {
    setError(null);
    try {
      await fn();
    } catch (e) {
      setError(e);
    }
    after();
  };
  const remove = async (id: string) => {
    setError(null);
    try {
      await deleteSession(id);
      if (playgroundSession.id() === id) playgroundSession.set(null);
      deleted();
    } catch (e) {
      setError(e);
      after();
    }
  };
  return {
    error,
    pause: (id: string) => act(() => pauseSession(id)),
    askDelete: setConfirm,
    dialog: (
      <Confirm
        open={confirm != null}
        title="Delete this session?"
        confirm="Delete session"
        onClose={(ok) => {
          const id = confirm;
          setConfirm(null);
          if (ok && id) void remove(id);
        }}
      >
        <p>
          <code>{confirm}</code>: its variables, its files and its saved state are removed for good; a run in progress is stopped.
        </p>
      </Confirm>
    ),
  };
}

function usePlayground(id: string) {
  return () => {
    playgroundSession.setStateless(false);
    playgroundSession.set(id);
    navigate("#/playground");
  };
}

function SessionList() {
  const list = useLoad<Session[]>((s, poll) => listSessions(s, poll));
  useInterval(list.poll, 5000);
  const actions = useActions(list.reload);
  const [createError, setCreateError] = useState<unknown>(null);
  const mine = playgroundSession.id();
  if (list.error) return <Failure what="Sessions" error={list.error} />;
  const rows = list.data ?? [];
  return (
    <section class="pane" aria-labelledby="sessions-title">
      <div class="row between">
        <h2 id="sessions-title">
          Sessions <span class="muted small">{list.data ? plural(rows.length, "session") : "loading…"}</span>
        </h2>
        <div class="row">
          <button type="button" onClick={list.reload}>
            Refresh
          </button>
          <button
            type="button"
            class="primary"
            onClick={async () => {
              setCreateError(null);
              try {
                const s = await createSession();
                navigate(link("sessions", s.id));
              } catch (e) {
                setCreateError(e);
              }
            }}
          >
            New session
          </button>
        </div>
      </div>
      <p class="muted small">
        Each session keeps its variables between runs and has a workspace of its own; an idle one is paused to disk (no process) and resumed by its next run.
        The playground runs in one of them.
      </p>
      <ErrorBox error={createError ?? actions.error} />
      {list.data && rows.length === 0 ? (
        <p class="muted" data-testid="no-sessions">
          No sessions yet. The playground makes one on its first run.
        </p>
      ) : (
        <div class="table-wrap" role="region" aria-label="Sessions" tabIndex={0}>
          <table class="data" data-testid="sessions-table">
            <Head
              cols={["Session", "Status", "Last used", "Created", { name: "Runs", num: true }, { name: "Workspace", num: true }, "Expires", { name: "Actions", hidden: true }]}
            />
            <tbody>
              {rows.map((s) => (
                <SessionRow key={s.id} s={s} mine={s.id === mine} onPause={() => actions.pause(s.id)} onDelete={() => actions.askDelete(s.id)} />
              ))}
            </tbody>
          </table>
        </div>
      )}
      {actions.dialog}
    </section>
  );
}

function SessionRow({ s, mine, onPause, onDelete }: { s: Session; mine: boolean; onPause: () => void; onDelete: () => void }) {
  const use = usePlayground(s.id);
  return (
    <tr data-session={s.id}>
      <td>
        <a href={link("sessions", s.id)} class="mono" title={s.id}>
          {shortId(s.id)}
        </a>
        {mine && <span class="badge">playground</span>}
      </td>
      <td>
        <span class={`badge ${s.status === "active" ? "good" : ""}`} data-testid="session-status">
          {s.status}
        </span>
      </td>
      <td title={s.last_used_at}>{ago(s.last_used_at)}</td>
      <td title={s.created_at}>{ago(s.created_at)}</td>
      <td class="num">{s.runs.toLocaleString()}</td>
      <td class="num" data-testid="session-size">
        {bytes(s.workspace_bytes)}
      </td>
      <td title={s.expires_at}>{new Date(s.expires_at).toLocaleString()}</td>
      <td class="actions">
        <button type="button" class="small" onClick={use} aria-label={`Open ${s.id} in the playground`}>
          Playground
        </button>
        <button type="button" class="small" onClick={onPause} disabled={s.status === "paused"} aria-label={`Pause ${s.id}`}>
          Pause
        </button>
        <button type="button" class="small danger" onClick={onDelete} aria-label={`Delete ${s.id}`}>
          Delete
        </button>
      </td>
    </tr>
  );
}

function SessionDetail({ id }: { id: string }) {
  const info = useLoad((s, poll) => describeSession(id, s, poll), [id]);
  const actions = useActions(info.reload, () => navigate("#/sessions"));
  const use = usePlayground(id);
  if (info.error && isGone(info.error)) return <NotFound what="Session" back={{ href: "#/sessions", label: "All sessions" }} />;
  if (info.error) return <Failure what="Sessions" error={info.error} />;
  const s = info.data;
  return (
    <div class="stack">
      <section class="pane" aria-labelledby="session-title" data-testid="session-detail">
        <p class="small">
          <a href="#/sessions">← All sessions</a>
        </p>
        <h2 id="session-title" class="mono">
          {id}
        </h2>
        {!s ? (
          <p class="muted">loading…</p>
        ) : (
          <>
            <dl class="facts">
              <dt>Status</dt>
              <dd>
                <span class={`badge ${s.status === "active" ? "good" : ""}`} data-testid="session-status">
                  {s.status}
                </span>
                {s.status === "paused" ? <span class="muted small"> no process; its next run resumes it</span> : null}
              </dd>
              <dt>Last used</dt>
              <dd title={s.last_used_at}>{ago(s.last_used_at)}</dd>
              <dt>Created</dt>
              <dd>{new Date(s.created_at).toLocaleString()}</dd>
              <dt>Expires</dt>
              <dd>
                {new Date(s.expires_at).toLocaleString()} <span class="muted small">({Math.round(s.ttl_s / 3600)} h after its last use)</span>
              </dd>
              <dt>Runs</dt>
              <dd>{s.runs.toLocaleString()}</dd>
              <dt>Disk</dt>
              <dd>
                workspace {bytes(s.workspace_bytes)}, saved variables {bytes(s.state_bytes)}
              </dd>
              <dt>Permissions</dt>
              <dd>
                network {s.allow_network ? "allowed" : "off"}, processes {s.allow_process ? "allowed" : "off"}
              </dd>
            </dl>
            <div class="row">
              <button type="button" class="primary" onClick={use}>
                Open in the playground
              </button>
              <button type="button" onClick={() => actions.pause(id)} disabled={s.status === "paused"}>
                Pause
              </button>
              <button type="button" class="danger" onClick={() => actions.askDelete(id)}>
                Delete
              </button>
            </div>
            <ErrorBox error={actions.error} />
          </>
        )}
      </section>
      {s && (
        <div class="session-panels">
          <VariablesPanel info={s} />
          <FilesPanel info={s} onChange={info.reload} onGone={info.reload} />
        </div>
      )}
      {actions.dialog}
    </div>
  );
}
