import { Component } from "preact";
import { useEffect, useLayoutEffect, useMemo, useRef, useState } from "preact/hooks";
import type { ComponentChildren } from "preact";
import { getJSON } from "../api";
import * as store from "../chats";
import type { Chat as ChatRec, Msg, Settings } from "../chats";
import { Confirm, ErrorBox, Failure, useLoad } from "../components/common";
import { CopyButton } from "../components/CopyButton";
import { Markdown } from "../components/Markdown";
import { NotFound } from "../components/NotFound";
import { inferenceBase } from "../config";
import { link, navigate, useRoute } from "../router";

// The message window (see MessageWindow): a message's height until it has been rendered
// once (then the average of those measured), the space between messages (`.msg`'s
// margin-bottom), and how far beyond the view messages are rendered, above and below.
const GUESS = 140;
const GAP = 10;
const OVERSCAN = 800;

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
    if (!id) store.reloadList();
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
  const [createError, setCreateError] = useState<unknown>(null);
  const [query, setQuery] = useState("");
  // On a phone the open chat takes the screen; its list is one tap away (the head's button).
  const [listOpen, setListOpen] = useState(false);
  const opener = useRef<HTMLButtonElement>(null);
  const closer = useRef<HTMLButtonElement>(null);
  const listToggled = useRef(false);
  useEffect(() => {
    // Focus follows the tap: into the list when it opens, back to its button when it closes.
    if (!listToggled.current) return;
    listToggled.current = false;
    (listOpen ? closer : opener).current?.focus();
  }, [listOpen]);
  const showList = (open: boolean) => {
    listToggled.current = true;
    setListOpen(open);
  };
  // A setting the form refuses (e.g. max tokens −3): Send is off until it is mended.
  const [invalid, setInvalid] = useState<string | null>(null);
  // Whether the view follows the end of the chat (it is at the bottom, or a message was sent).
  const stick = useRef(true);

  const offered = useMemo(() => (models.data?.data ?? []).filter(canChat), [models.data]);
  const settings = chat ? chat.settings : draft;
  const modelOk = offered.some((m) => m.id === settings.model);

  // A new chat starts with the last model used, else the first local chat model.
  useEffect(() => {
    if (chat || !offered.length || modelOk) return;
    setDraft((d) => ({ ...d, model: (offered.find((m) => m.owned_by === "local") ?? offered[0]).id }));
  }, [offered, chat]);

  // Another chat opens at its end; set while rendering, as its message window (keyed by the
  // id) is laid out before any effect of this component would run.
  const shownId = useRef(id);
  if (shownId.current !== id) {
    shownId.current = id;
    stick.current = true;
  }
  useEffect(() => {
    setEditing(null);
    setRenaming(null);
    setListOpen(false);
    // A new chat starts with the settings last used, read now: a system prompt just typed
    // in the chat left for this one is among them (the page stays mounted between chats).
    if (id == null) setDraft(store.lastSettings());
  }, [id]);

  // An imported chat opened by the id it had in this browser: its address becomes the server's.
  useEffect(() => {
    if (chat && id && chat.id !== id) navigate(link("chat", chat.id), true);
  }, [chat, id]);

  const messages = chat?.messages ?? [];
  const last = messages[messages.length - 1];
  const where = store.keptOnServer() ? "on the server, for your key's tenant" : "in this browser";

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
    if (!text || busy || !modelOk || invalid) return;
    setInput("");
    stick.current = true;
    if (chat) store.send(chat.id, text);
    else
      store.createChat({ ...draft }, text).then(
        (c) => {
          // The new chat's address replaces `#/chat`, so Back does not lead to an empty chat.
          navigate(link("chat", c.id), true);
          void store.answer(c.id);
        },
        (e) => (setInput(text), setCreateError(e)),
      );
  };

  const notFound = id != null && chat === null;
  return (
    <div class={`chat${listOpen ? " list-open" : ""}`}>
      <nav class="pane chat-list" id="chat-list-pane" aria-label="Chats">
        <button type="button" class="phone-only small" ref={closer} onClick={() => showList(false)} aria-controls="chat-list-pane" aria-expanded="true" data-testid="close-chat-list">
          ← Back to the chat
        </button>
        <a class="button primary" href="#/chat" aria-current={id == null ? "page" : undefined} data-testid="new-chat" onClick={() => setListOpen(false)}>
          New chat
        </a>
        {/* IndexedDB refused (a private window, a full disk): chats then live until the tab closes. */}
        <ErrorBox error={storeError ?? createError ?? store.lastWriteError()} />
        <input
          type="search"
          class="chat-search"
          aria-label="Search chats"
          placeholder="Search chats"
          value={query}
          onInput={(e) => setQuery((e.currentTarget as HTMLInputElement).value)}
          data-testid="chat-search"
        />
        {query.trim() ? (
          <SearchResults q={query.trim()} current={id} onOpen={() => setListOpen(false)} />
        ) : list == null ? (
          <p class="muted small">loading…</p>
        ) : list.length === 0 ? (
          <p class="muted small">No chats yet. They are kept {where}.</p>
        ) : (
          <ul class="item-list" data-testid="chat-list">
            {list.map((c) => (
              <li key={c.id}>
                <a href={link("chat", c.id)} class="chat-link" aria-current={c.id === id ? "page" : undefined} data-chat={c.id} onClick={() => setListOpen(false)}>
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
              <button type="button" class="phone-only small" ref={opener} onClick={() => showList(true)} aria-controls="chat-list-pane" aria-expanded="false" data-testid="open-chat-list">
                ☰ Chats{list ? ` (${list.length})` : ""}
              </button>
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
            <MessageWindow
              key={id ?? ""}
              messages={messages}
              stick={stick}
              busy={busy}
              editing={editing}
              onEdit={(i, text) => setEditing(text == null ? null : { index: i, text })}
              onResend={(i, text) => {
                setEditing(null);
                stick.current = true;
                store.redo(chat!.id, i, text);
              }}
              onRetry={(i) => {
                // An earlier answer is written where it is: the view stays on it.
                stick.current = i === messages.length - 1;
                store.retry(chat!.id, i);
              }}
              empty={id && chat === undefined ? "loading…" : `Ask the model something. Enter sends, Shift+Enter adds a line. Chats are kept ${where}.`}
            />
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
                <button type="submit" class="primary" disabled={!modelOk || !!invalid} data-testid="send" aria-describedby={invalid ? "chat-invalid" : undefined}>
                  Send
                </button>
              )}
            </form>
            {invalid && (
              <p class="field-error" id="chat-invalid" data-testid="chat-invalid">
                Send is off: {invalid}
              </p>
            )}
          </>
        )}
      </section>
      <ChatSettings key={chat?.id ?? ""} settings={settings} offered={offered} models={models} change={change} onInvalid={setInvalid} />
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
          “{chat?.title}” and its {messages.length} messages will be removed {where}.
        </p>
      </Confirm>
    </div>
  );
}

/** The chats matching a search: the server's full-text search (or this browser's), with the
 * matching text; typing waits 200 ms before asking. */
function SearchResults(props: { q: string; current: string | null; onOpen: () => void }) {
  const [found, setFound] = useState<(ChatRec & { snippet?: string })[] | null>(null);
  const [error, setError] = useState<unknown>(null);
  useEffect(() => {
    const ctl = new AbortController();
    const t = setTimeout(() => {
      store.searchChats(props.q, ctl.signal).then(
        (r) => (setFound(r), setError(null)),
        (e) => !ctl.signal.aborted && setError(e),
      );
    }, 200);
    return () => (clearTimeout(t), ctl.abort());
  }, [props.q]);
  if (error) return <ErrorBox error={error} />;
  if (found == null) return <p class="muted small">searching…</p>;
  return (
    <>
      <p class="muted small" role="status" data-testid="search-count">
        {found.length === 1 ? "1 chat matches" : `${found.length} chats match`}
      </p>
      <ul class="item-list" data-testid="search-results">
        {found.map((c) => (
          <li key={c.id}>
            <a href={link("chat", c.id)} class="chat-link" aria-current={c.id === props.current ? "page" : undefined} data-chat={c.id} onClick={props.onOpen}>
              <span class="title">{c.title}</span>
              {c.snippet ? <span class="muted small snippet">{c.snippet}</span> : null}
            </a>
          </li>
        ))}
      </ul>
    </>
  );
}

/** A number setting the form checks itself (the server would refuse it only once sent): a
 * value out of range stays in the field, marked invalid with its message (`aria-invalid`,
 * `aria-describedby`), and is not kept; the last valid value is. */
function NumberSetting(props: { id: string; label: string; value: number; min: number; max: number; step?: number; integer?: boolean; onValid: (v: number) => void; onError: (msg: string | null) => void }) {
  const [text, setText] = useState(String(props.value));
  const check = (raw: string): string | null => {
    const v = Number(raw);
    const range = `from ${props.min.toLocaleString()} to ${props.max.toLocaleString()}`;
    if (raw.trim() === "" || !Number.isFinite(v)) return `${props.label} must be a number ${range}.`;
    if (props.integer && !Number.isInteger(v)) return `${props.label} must be a whole number ${range}.`;
    if (v < props.min || v > props.max) return `${props.label} must be ${range}; ${raw.trim()} is not.`;
    return null;
  };
  const error = check(text);
  // The value changed from outside (a new chat's settings read again): the field follows,
  // unless it holds what the user is still mending.
  useEffect(() => {
    if (!check(text) && Number(text) !== props.value) setText(String(props.value));
  }, [props.value]);
  // Told once on mount too: a chat kept with a value out of range (before this check) says so.
  useEffect(() => props.onError(error), [error]);
  useEffect(() => () => props.onError(null), []);
  return (
    <div class="field">
      <label for={props.id}>{props.label}</label>
      <input
        id={props.id}
        type="number"
        min={props.min}
        max={props.max}
        step={props.step ?? (props.integer ? 1 : "any")}
        value={text}
        aria-invalid={error ? "true" : undefined}
        aria-describedby={error ? `${props.id}-error` : undefined}
        onInput={(e) => {
          const raw = (e.currentTarget as HTMLInputElement).value;
          setText(raw);
          if (!check(raw)) props.onValid(Number(raw));
        }}
        data-testid={props.id}
      />
      {error && (
        <span class="field-error" id={`${props.id}-error`} role="alert" data-testid={`${props.id}-error`}>
          {error}
        </span>
      )}
    </div>
  );
}

function ChatSettings(props: { settings: Settings; offered: ModelInfo[]; models: { error?: unknown; loading: boolean; reload: () => void }; change: (p: Partial<Settings>) => void; onInvalid: (msg: string | null) => void }) {
  const { settings, offered, models, change } = props;
  const known = offered.some((m) => m.id === settings.model);
  const [open] = useState(() => matchMedia("(min-width: 760px)").matches);
  const errors = useRef<Record<string, string | null>>({});
  const onError = (field: string) => (msg: string | null) => {
    errors.current[field] = msg;
    props.onInvalid(Object.values(errors.current).find((m) => m) ?? null);
  };
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
      <div class="row settings-numbers">
        <NumberSetting id="chat-top-p" label="Top P" value={settings.topP} min={0} max={1} step={0.05} onValid={(v) => change({ topP: v })} onError={onError("topP")} />
        <NumberSetting id="chat-max-tokens" label="Max tokens" value={settings.maxTokens} min={1} max={32768} integer onValid={(v) => change({ maxTokens: v })} onError={onError("maxTokens")} />
      </div>
      <p class="muted small">Settings are kept with each chat; a new chat starts with the last ones used.</p>
    </details>
  );
}

type WindowProps = {
  messages: Msg[];
  stick: { current: boolean };
  busy: boolean;
  editing: { index: number; text: string } | null;
  onEdit: (i: number, text: string | null) => void;
  onResend: (i: number, text: string) => void;
  onRetry: (i: number) => void;
  empty: ComponentChildren;
};

/** Where each message starts, from the heights measured so far (and `guess` for the rest). */
function offsets(messages: Msg[], heights: Map<string, number>, guess: number): number[] {
  const off = new Array<number>(messages.length + 1);
  off[0] = 0;
  for (let i = 0; i < messages.length; i++) off[i + 1] = off[i] + (heights.get(messages[i].id) ?? guess);
  return off;
}

/** The first index whose message ends below `y`. */
function indexAt(off: number[], y: number): number {
  let lo = 0;
  let hi = off.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (off[mid + 1] <= y) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** The chat's messages as a window: only those within OVERSCAN of the view are in the DOM,
 * with a spacer above and below standing for the rest (their measured heights, or a guess
 * until they have been shown). A long chat laid out whole costs the browser a layout of every
 * message on each change (200 ms at 2,000 messages); the window costs what 20 do.
 * The message under the top of the view is the anchor: when heights above it change (a
 * message measured for the first time), the view is moved so that it stays put. */
function MessageWindow(props: WindowProps) {
  const { messages, stick } = props;
  const box = useRef<HTMLDivElement>(null);
  const heights = useRef(new Map<string, number>());
  const [view, setView] = useState({ top: 0, height: typeof window === "undefined" ? 800 : window.innerHeight });
  const [, remeasured] = useState(0);
  // The message under the top of the view and how far into it the view starts.
  const anchor = useRef<{ id: string; delta: number } | null>(null);

  let measured = 0;
  heights.current.forEach((h) => (measured += h));
  const guess = heights.current.size ? Math.round(measured / heights.current.size) : GUESS;
  const off = offsets(messages, heights.current, guess);
  const total = off[messages.length];
  // Where the view is: the last screen while following the end; else where the anchor puts
  // it in these offsets (the scroll position is in the last render's, which a new guess for
  // the messages above moves).
  const at = anchor.current ? messages.findIndex((m) => m.id === anchor.current!.id) : -1;
  const top = stick.current ? Math.max(0, total - view.height) : at >= 0 ? off[at] + anchor.current!.delta : view.top;
  const start = indexAt(off, top - OVERSCAN);
  const end = Math.min(messages.length, indexAt(off, top + view.height + OVERSCAN) + 1);
  const rendered = useRef({ off, start, end, guess });
  rendered.current = { off, start, end, guess };

  const keepAnchor = (el: HTMLDivElement, o: number[]) => {
    const i = indexAt(o, el.scrollTop);
    anchor.current = i < messages.length ? { id: messages[i].id, delta: el.scrollTop - o[i] } : null;
  };

  useLayoutEffect(() => {
    const el = box.current;
    if (!el) return;
    // Measure what was rendered; the spacers stand only for messages not rendered, so they
    // are right as they are and only the view's position needs mending.
    let changed = false;
    el.querySelectorAll<HTMLElement>(":scope > article").forEach((row, j) => {
      const m = messages[start + j];
      const h = row.getBoundingClientRect().height + GAP;
      if (m && heights.current.get(m.id) !== h) {
        heights.current.set(m.id, h);
        changed = true;
      }
    });
    const now = changed ? offsets(messages, heights.current, guess) : off;
    if (stick.current) el.scrollTop = el.scrollHeight;
    else if (anchor.current) {
      const i = messages.findIndex((m) => m.id === anchor.current!.id);
      if (i >= 0) el.scrollTop = now[i] + anchor.current.delta;
    }
    if (el.clientHeight && el.clientHeight !== view.height) setView((v) => ({ ...v, height: el.clientHeight }));
    // Messages measured shorter than guessed may leave the view short of rendered ones.
    if (changed) remeasured((n) => n + 1);
  });

  // A message whose height changes by itself (the window resized, text reflowed) is measured again.
  useEffect(() => {
    const el = box.current;
    if (!el || typeof ResizeObserver === "undefined") return;
    const ro = new ResizeObserver(() => remeasured((n) => n + 1));
    ro.observe(el);
    return () => ro.disconnect();
  }, []);

  return (
    <div
      class="messages"
      ref={box}
      data-testid="messages"
      onScroll={(e) => {
        const el = e.currentTarget as HTMLDivElement;
        stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
        keepAnchor(el, rendered.current.off);
        setView({ top: el.scrollTop, height: el.clientHeight });
      }}
    >
      {messages.length === 0 && <p class="muted">{props.empty}</p>}
      {start > 0 && <div class="msg-spacer" style={{ height: `${off[start]}px` }} aria-hidden="true" />}
      {messages.slice(start, end).map((m, j) => {
        const i = start + j;
        return (
          <MessageRow
            key={m.id}
            m={m}
            pos={i + 1}
            of={messages.length}
            last={i === messages.length - 1}
            busy={props.busy}
            editing={props.editing?.index === i ? props.editing.text : null}
            onEdit={(text) => props.onEdit(i, text)}
            onResend={(text) => props.onResend(i, text)}
            onRetry={() => props.onRetry(i)}
          />
        );
      })}
      {end < messages.length && <div class="msg-spacer" style={{ height: `${total - off[end]}px` }} aria-hidden="true" />}
    </div>
  );
}

type MessageProps = {
  m: Msg;
  pos: number;
  of: number;
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
    return next.m !== p.m || next.pos !== p.pos || next.of !== p.of || next.last !== p.last || next.busy !== p.busy || next.editing !== p.editing;
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
    <article class={`msg ${m.role}${unfinished ? " unfinished" : ""}`} aria-posinset={props.pos} aria-setsize={props.of} data-testid={`msg-${m.role}`} data-status={m.status}>
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
            {m.role === "assistant" && (unfinished || last) && !busy && (
              <button
                type="button"
                class={`small ${unfinished ? "primary" : ""}`}
                onClick={props.onRetry}
                aria-label={unfinished ? `Retry this ${STATUS_TEXT[status!]} answer` : "Regenerate this answer"}
                data-testid={unfinished ? "retry" : "regenerate"}
              >
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
