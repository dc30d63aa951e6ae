import { Component } from "preact";
import { useEffect, useLayoutEffect, useMemo, useRef, useState } from "preact/hooks";
import { getJSON } from "../api";
import * as store from "../chats";
import type { Chat as ChatRec, Msg, Settings } from "../chats";
import { Confirm, ErrorBox, Failure, useLoad } from "../components/common";
import { CopyButton } from "../components/CopyButton";
import { Markdown } from "../components/Markdown";
import { NotFound } from "../components/NotFound";
import { inferenceBase } from "../config";
import { link, navigate, useRoute } from "../router";

// Messages rendered at a time in a long chat (see `shown`).
const PAGE = 80;

type ModelInfo = { id: string; owned_by: string; capabilities?: string[] };

/** A model the chat may offer: a local model whose capabilities include "chat" (not an
 * embedding-only model, nor a source-format model that must be converted first: its
 * capabilities are []), or a provider's model (providers list no capabilities) not named
 * as an embedding model. */
export function canChat(m: ModelInfo): boolean {
  if (m.owned_by === "local") return (m.capabilities ?? []).includes("chat");
  if (m.capabilities?.length) return m.capabilities.includes("chat");
  return !/embed/i.test(m.id);
}

const STATUS_TEXT: Record<string, string> = {
  streaming: "writing…",
  stopped: "stopped",
  failed: "failed",
  interrupted: "cut off",
};

/** Re-renders when any chat changes; gives the list and the chat `id`. */
function useChats(id: string | null) {
  const [list, setList] = useState<ChatRec[] | null>(null);
  const [chat, setChat] = useState<ChatRec | null | undefined>(undefined); // undefined: loading
  const [error, setError] = useState<unknown>(null);
  useEffect(() => {
    let live = true;
    const refresh = () => {
      store.allChats().then((l) => live && setList(l), (e) => live && setError(e));
      if (id) store.getChat(id).then((c) => live && setChat(c), (e) => live && (setError(e), setChat(null)));
      else setChat(null);
    };
    refresh();
    const off = store.subscribe(refresh);
    return () => {
      live = false;
      off();
    };
  }, [id]);
  return { list, chat, error };
}

export function Chat() {
  const route = useRoute();
  const id = route.parts[0] ?? null;
  const { list, chat, error: storeError } = useChats(id);
  const models = useLoad<{ data: ModelInfo[] }>((s) => getJSON(`${inferenceBase}/v1/models`, s));
  const [draft, setDraft] = useState<Settings>(store.lastSettings);
  const [input, setInput] = useState("");
  const [editing, setEditing] = useState<{ index: number; text: string } | null>(null);
  const [renaming, setRenaming] = useState<string | null>(null);
  const [deleting, setDeleting] = useState(false);
  const log = useRef<HTMLDivElement>(null);
  const stick = useRef(true);
  // A long chat renders its latest messages, and earlier ones a page at a time as the view
  // reaches them (scrolled to the top, or the button): 2,000 messages at once would hold the
  // page for a second. `grown` keeps the scroll position when a page is added above.
  const [shown, setShown] = useState(PAGE);
  const grown = useRef<number | null>(null);

  const offered = useMemo(() => (models.data?.data ?? []).filter(canChat), [models.data]);
  const settings = chat ? chat.settings : draft;
  const modelOk = offered.some((m) => m.id === settings.model);

  // A new chat starts with the last model used, else the first local chat model.
  useEffect(() => {
    if (chat || !offered.length || modelOk) return;
    setDraft((d) => ({ ...d, model: (offered.find((m) => m.owned_by === "local") ?? offered[0]).id }));
  }, [offered, chat]);

  useEffect(() => {
    setEditing(null);
    setRenaming(null);
    setShown(PAGE);
    stick.current = true;
  }, [id]);

  const messages = chat?.messages ?? [];
  const last = messages[messages.length - 1];
  useEffect(() => {
    const el = log.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  }, [messages.length, last?.content]);
  const first = Math.max(0, messages.length - shown);
  const earlier = () => {
    if (first === 0) return;
    grown.current = log.current ? log.current.scrollHeight - log.current.scrollTop : null;
    setShown((n) => n + PAGE);
  };
  useLayoutEffect(() => {
    const el = log.current;
    if (el && grown.current != null) el.scrollTop = el.scrollHeight - grown.current;
    grown.current = null;
  }, [shown]);

  if (route.parts.length > 1) return <NotFound what="Chat" back={{ href: "#/chat", label: "Start a new chat" }} />;

  const busy = chat ? store.isRunning(chat.id) : false;
  const change = (patch: Partial<Settings>) => {
    if (chat) store.setSettings(chat.id, patch);
    else {
      const next = { ...draft, ...patch };
      setDraft(next);
      localStorage.setItem("conch.chat.settings", JSON.stringify(next));
    }
  };

  const sendMessage = () => {
    const text = input.trim();
    if (!text || busy || !modelOk) return;
    setInput("");
    stick.current = true;
    if (chat) store.send(chat.id, text);
    else {
      const c = store.createChat({ ...draft }, text);
      // The new chat's address replaces `#/chat`, so Back does not lead to an empty chat.
      navigate(link("chat", c.id), true);
      void store.answer(c.id);
    }
  };

  const notFound = id != null && chat === null;
  return (
    <div class="chat">
      <nav class="pane chat-list" aria-label="Chats">
        <a class="button primary" href="#/chat" aria-current={id == null ? "page" : undefined} data-testid="new-chat">
          New chat
        </a>
        {/* IndexedDB refused (a private window, a full disk): chats then live until the tab closes. */}
        <ErrorBox error={storeError ?? store.lastWriteError()} />
        {list == null ? (
          <p class="muted small">loading…</p>
        ) : list.length === 0 ? (
          <p class="muted small">No chats yet. They are kept in this browser.</p>
        ) : (
          <ul class="item-list" data-testid="chat-list">
            {list.map((c) => (
              <li key={c.id}>
                <a href={link("chat", c.id)} class="chat-link" aria-current={c.id === id ? "page" : undefined} data-chat={c.id}>
                  <span class="title">{c.title}</span>
                  <span class="muted small">
                    {new Date(c.updated).toLocaleString()}
                    {store.isRunning(c.id) ? " · writing…" : ""}
                  </span>
                </a>
              </li>
            ))}
          </ul>
        )}
      </nav>
      <section class="pane chat-main" aria-labelledby="chat-title">
        {notFound ? (
          <NotFound what="Chat" back={{ href: "#/chat", label: "Start a new chat" }} />
        ) : (
          <>
            <div class="row between chat-head">
              {renaming != null && chat ? (
                <form
                  class="row"
                  onSubmit={(e) => {
                    e.preventDefault();
                    store.renameChat(chat.id, renaming);
                    setRenaming(null);
                  }}
                >
                  <input aria-label="Chat title" value={renaming} onInput={(e) => setRenaming((e.currentTarget as HTMLInputElement).value)} data-testid="rename-input" autofocus />
                  <button type="submit" class="small primary">
                    Save
                  </button>
                  <button type="button" class="small" onClick={() => setRenaming(null)}>
                    Cancel
                  </button>
                </form>
              ) : (
                <h2 id="chat-title" data-testid="chat-title">
                  {chat ? chat.title : "New chat"}
                </h2>
              )}
              {chat && (
                <div class="row chat-actions">
                  <button type="button" class="small" onClick={() => setRenaming(chat.title)} data-testid="rename">
                    Rename
                  </button>
                  <button type="button" class="small" onClick={() => store.download(store.fileName(chat, "json"), "application/json", JSON.stringify(chat, null, 2))} data-testid="export-json">
                    Export JSON
                  </button>
                  <button type="button" class="small" onClick={() => store.download(store.fileName(chat, "md"), "text/markdown", store.toMarkdown(chat))} data-testid="export-md">
                    Export Markdown
                  </button>
                  <button type="button" class="small danger" onClick={() => setDeleting(true)} data-testid="delete-chat">
                    Delete
                  </button>
                </div>
              )}
            </div>
            <div class="messages" ref={log} data-testid="messages" onScroll={(e) => {
              const el = e.currentTarget as HTMLDivElement;
              stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
              if (el.scrollTop < 80 && first > 0 && grown.current == null) earlier();
            }}>
              {first > 0 && (
                <button type="button" class="small earlier" onClick={earlier} data-testid="earlier-messages">
                  Show {Math.min(PAGE, first)} earlier messages ({first} not shown)
                </button>
              )}
              {messages.length === 0 && (
                <p class="muted">
                  {id && chat === undefined ? "loading…" : "Ask the model something. Enter sends, Shift+Enter adds a line. Chats are kept in this browser."}
                </p>
              )}
              {messages.slice(first).map((m, j) => {
                const i = first + j;
                return (
                <MessageRow
                  key={m.id}
                  m={m}
                  last={i === messages.length - 1}
                  busy={busy}
                  editing={editing?.index === i ? editing.text : null}
                  onEdit={(text) => setEditing(text == null ? null : { index: i, text })}
                  onResend={(text) => {
                    setEditing(null);
                    stick.current = true;
                    store.redo(chat!.id, i, text);
                  }}
                  onRetry={() => {
                    stick.current = true;
                    store.redo(chat!.id, i);
                  }}
                />
                );
              })}
            </div>
            {/* Said once an answer ends (the streamed text itself is not read out token by token). */}
            <div class="sr-only" role="status" data-testid="chat-announce">
              {last?.role === "assistant" && last.status && last.status !== "streaming" ? `Answer ${last.status === "done" ? "finished" : STATUS_TEXT[last.status]}` : ""}
            </div>
            <form
              class="composer"
              onSubmit={(e) => {
                e.preventDefault();
                sendMessage();
              }}
            >
              <textarea
                rows={2}
                aria-label="Message"
                placeholder="Message"
                value={input}
                onInput={(e) => setInput((e.currentTarget as HTMLTextAreaElement).value)}
                onKeyDown={(e) => {
                  if (e.key === "Enter" && !e.shiftKey) {
                    e.preventDefault();
                    sendMessage();
                  }
                }}
                data-testid="chat-input"
              />
              {busy ? (
                <button type="button" class="danger" onClick={() => store.stop(chat!.id)} data-testid="stop">
                  Stop
                </button>
              ) : (
                <button type="submit" class="primary" disabled={!modelOk} data-testid="send">
                  Send
                </button>
              )}
            </form>
          </>
        )}
      </section>
      <ChatSettings settings={settings} offered={offered} models={models} change={change} />
      <Confirm
        open={deleting}
        title="Delete this chat?"
        confirm="Delete"
        onClose={(ok) => {
          setDeleting(false);
          if (ok && chat) {
            void store.deleteChat(chat.id);
            navigate("#/chat", true);
          }
        }}
      >
        <p>
          “{chat?.title}” and its {messages.length} messages will be removed from this browser.
        </p>
      </Confirm>
    </div>
  );
}

function ChatSettings(props: { settings: Settings; offered: ModelInfo[]; models: { error?: unknown; loading: boolean; reload: () => void }; change: (p: Partial<Settings>) => void }) {
  const { settings, offered, models, change } = props;
  const known = offered.some((m) => m.id === settings.model);
  const [open] = useState(() => matchMedia("(min-width: 760px)").matches);
  const num = (e: Event) => Number((e.currentTarget as HTMLInputElement).value);
  return (
    <details class="pane chat-settings" open={open} aria-label="Chat settings">
      <summary>Settings</summary>
      {models.error ? (
        <div>
          <Failure what="Chat (the inference server)" error={models.error} />
          <button type="button" class="small" onClick={models.reload}>
            Try again
          </button>
        </div>
      ) : null}
      <label>
        Model
        <select value={settings.model} onChange={(e) => change({ model: (e.currentTarget as HTMLSelectElement).value })} data-testid="model-picker">
          {!known && settings.model && (
            <option value={settings.model} disabled>
              {settings.model} (not available)
            </option>
          )}
          {offered.map((m) => (
            <option key={m.id} value={m.id}>
              {m.id} {m.owned_by !== "local" ? `(${m.owned_by})` : ""}
            </option>
          ))}
        </select>
      </label>
      {!models.loading && !models.error && !offered.length && <p class="notice small">No model on this server can chat: pull or convert one on the Models page.</p>}
      {!known && settings.model && offered.length > 0 && (
        <p class="notice small" data-testid="model-missing">
          This chat's model is not offered by this server now; pick another to go on.
        </p>
      )}
      <label>
        System prompt
        <textarea rows={4} value={settings.system} onInput={(e) => change({ system: (e.currentTarget as HTMLTextAreaElement).value })} />
      </label>
      <div class="field">
        <label for="chat-temperature">
          Temperature <output for="chat-temperature">{settings.temperature.toFixed(2)}</output>
        </label>
        <input id="chat-temperature" type="range" min={0} max={2} step={0.05} value={settings.temperature} aria-valuetext={settings.temperature.toFixed(2)} onInput={(e) => change({ temperature: num(e) })} />
      </div>
      <div class="row">
        <label>
          Top P
          <input type="number" min={0} max={1} step={0.05} value={settings.topP} onInput={(e) => change({ topP: Math.min(1, Math.max(0, num(e))) })} />
        </label>
        <label>
          Max tokens
          <input type="number" min={1} max={32768} value={settings.maxTokens} onInput={(e) => change({ maxTokens: num(e) || 1 })} />
        </label>
      </div>
      <p class="muted small">Settings are kept with each chat; a new chat starts with the last ones used.</p>
    </details>
  );
}

type MessageProps = {
  m: Msg;
  last: boolean;
  busy: boolean;
  editing: string | null;
  onEdit: (text: string | null) => void;
  onResend: (text: string) => void;
  onRetry: () => void;
};

/** A message renders again only when what it shows changes: a long chat that grows by a page
 * of earlier messages, or streams into its last one, does not parse every other one again. */
class MessageRow extends Component<MessageProps> {
  shouldComponentUpdate(next: MessageProps): boolean {
    const p = this.props;
    return next.m !== p.m || next.last !== p.last || next.busy !== p.busy || next.editing !== p.editing;
  }
  render() {
    return <Message {...this.props} />;
  }
}

function Message(props: MessageProps) {
  const { m, last, busy, editing } = props;
  const status = m.role === "assistant" && m.status && m.status !== "done" ? m.status : null;
  const unfinished = status === "failed" || status === "interrupted" || status === "stopped";
  return (
    <article class={`msg ${m.role}${unfinished ? " unfinished" : ""}`} data-testid={`msg-${m.role}`} data-status={m.status}>
      <header class="muted small row between">
        <span>
          {m.role}
          {m.model ? ` · ${m.model}` : ""}
          {status && <span class={`badge ${status === "streaming" ? "busy" : "bad"}`} data-testid="msg-status">{STATUS_TEXT[status]}</span>}
        </span>
        {editing == null && status !== "streaming" && (
          <span class="msg-actions">
            <CopyButton text={() => m.content} label={`Copy this ${m.role === "user" ? "message" : "answer"}`} />
            {m.role === "user" && !busy && (
              <button type="button" class="small" onClick={() => props.onEdit(m.content)}>
                Edit
              </button>
            )}
            {m.role === "assistant" && last && !busy && (
              <button type="button" class={`small ${unfinished ? "primary" : ""}`} onClick={props.onRetry} data-testid={unfinished ? "retry" : "regenerate"}>
                {unfinished ? "Retry" : "Regenerate"}
              </button>
            )}
          </span>
        )}
      </header>
      {editing != null ? (
        <form
          class="stack"
          onSubmit={(e) => {
            e.preventDefault();
            if (editing.trim()) props.onResend(editing.trim());
          }}
        >
          <textarea aria-label="Edit message" rows={3} value={editing} onInput={(e) => props.onEdit((e.currentTarget as HTMLTextAreaElement).value)} data-testid="edit-input" />
          <div class="row">
            <button type="submit" class="small primary" data-testid="resend">
              Save and send
            </button>
            <button type="button" class="small" onClick={() => props.onEdit(null)}>
              Cancel
            </button>
            <span class="muted small">The messages after this one are replaced by the new answer.</span>
          </div>
        </form>
      ) : m.role === "assistant" ? (
        <Markdown text={m.content} />
      ) : (
        <p class="plain">{m.content}</p>
      )}
      {m.error && (
        <div class="error-box" role="alert" data-testid="msg-error">
          {m.error}
        </div>
      )}
      {m.stats && (
        <footer class="muted small" data-testid="chat-stats">
          {m.stats}
        </footer>
      )}
    </article>
  );
}
