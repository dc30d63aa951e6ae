import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, getJSON, isAbort, streamEvents } from "../api";
import { Failure, useLoad } from "../components/common";
import { Markdown } from "../components/Markdown";
import { inferenceBase } from "../config";

type Msg = { role: "user" | "assistant" | "system"; content: string; stats?: string; error?: string; stopped?: boolean };

export function Chat() {
  const models = useLoad<{ data: { id: string; owned_by: string }[] }>((s) => getJSON(`${inferenceBase}/v1/models`, s));
  const [model, setModel] = useState("");
  const [system, setSystem] = useState("You are a helpful assistant.");
  const [temperature, setTemperature] = useState(0.7);
  const [maxTokens, setMaxTokens] = useState(256);
  const [messages, setMessages] = useState<Msg[]>([]);
  const [input, setInput] = useState("");
  const [busy, setBusy] = useState(false);
  const abort = useRef<AbortController | null>(null);
  const log = useRef<HTMLDivElement>(null);

  useEffect(() => {
    const list = models.data?.data ?? [];
    if (!model && list.length) setModel((list.find((m) => m.owned_by === "local") ?? list[0]).id);
  }, [models.data]);

  useEffect(() => {
    log.current?.scrollTo({ top: log.current.scrollHeight });
  }, [messages]);

  if (models.error) return <Failure what="Chat (the inference server)" error={models.error} />;

  const sendMessage = async () => {
    const text = input.trim();
    if (!text || busy || !model) return;
    const history: Msg[] = [...messages.filter((m) => !m.error), { role: "user", content: text }];
    const answer: Msg = { role: "assistant", content: "" };
    setMessages([...history, answer]);
    setInput("");
    setBusy(true);
    const ctl = new AbortController();
    abort.current = ctl;
    const t0 = performance.now();
    let first: number | null = null;
    let chunks = 0;
    let usage: { completion_tokens: number } | null = null;
    const update = (patch: Partial<Msg>) => {
      Object.assign(answer, patch);
      setMessages((ms) => ms.map((m) => (m === answer ? answer : m)).slice());
    };
    const rate = () => {
      const n = usage?.completion_tokens ?? chunks;
      const secs = first == null ? 0 : (performance.now() - first) / 1000;
      return `${n} tokens · ${secs > 0 ? (n / secs).toFixed(1) : "—"} tokens/s · first token ${first == null ? "—" : Math.round(first - t0)} ms`;
    };
    try {
      await streamEvents(
        `${inferenceBase}/v1/chat/completions`,
        {
          method: "POST",
          signal: ctl.signal,
          body: JSON.stringify({
            model,
            messages: [
              ...(system.trim() ? [{ role: "system", content: system }] : []),
              ...history.map((m) => ({ role: m.role, content: m.content })),
            ],
            temperature,
            max_tokens: maxTokens,
            stream: true,
            stream_options: { include_usage: true },
          }),
        },
        (ev) => {
          if (ev.data === "[DONE]") return;
          const chunk = JSON.parse(ev.data);
          if (chunk.error) throw new ApiError(chunk.error.status ?? 500, chunk.error.message, chunk.error.code);
          if (chunk.usage) usage = chunk.usage;
          const delta = chunk.choices?.[0]?.delta?.content;
          if (delta) {
            if (first == null) first = performance.now();
            chunks++;
            update({ content: answer.content + delta, stats: rate() });
          }
        },
      );
      update({ stats: rate() });
    } catch (e) {
      if (isAbort(e)) update({ stopped: true, stats: `${rate()} · stopped` });
      else update({ error: (e as Error).message });
    } finally {
      setBusy(false);
      abort.current = null;
    }
  };

  const list = models.data?.data ?? [];
  return (
    <div class="chat">
      <aside class="pane chat-settings" aria-label="Chat settings">
        <label>
          Model
          <select value={model} onChange={(e) => setModel((e.currentTarget as HTMLSelectElement).value)} data-testid="model-picker">
            {list.map((m) => (
              <option key={m.id} value={m.id}>
                {m.id} {m.owned_by !== "local" ? `(${m.owned_by})` : ""}
              </option>
            ))}
          </select>
        </label>
        <label>
          System prompt
          <textarea rows={4} value={system} onInput={(e) => setSystem((e.currentTarget as HTMLTextAreaElement).value)} />
        </label>
        <label>
          Temperature <output>{temperature.toFixed(2)}</output>
          <input type="range" min={0} max={2} step={0.05} value={temperature} onInput={(e) => setTemperature(Number((e.currentTarget as HTMLInputElement).value))} />
        </label>
        <label>
          Max tokens
          <input type="number" min={1} max={32768} value={maxTokens} onInput={(e) => setMaxTokens(Number((e.currentTarget as HTMLInputElement).value) || 1)} />
        </label>
        <button type="button" onClick={() => setMessages([])} disabled={busy}>
          New chat
        </button>
      </aside>
      <section class="pane chat-main" aria-label="Conversation">
        <div class="messages" ref={log} aria-live="polite" data-testid="messages">
          {messages.length === 0 && <p class="muted">Ask the model something. Enter sends, Shift+Enter adds a line.</p>}
          {messages.map((m, i) => (
            <article key={i} class={`msg ${m.role}`} data-testid={`msg-${m.role}`}>
              <header class="muted small">{m.role}</header>
              {m.role === "assistant" ? <Markdown text={m.content} /> : <p class="plain">{m.content}</p>}
              {m.error && <div class="error-box">{m.error}</div>}
              {m.stats && (
                <footer class="muted small" data-testid="chat-stats">
                  {m.stats}
                </footer>
              )}
            </article>
          ))}
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
            <button type="button" class="danger" onClick={() => abort.current?.abort()} data-testid="stop">
              Stop
            </button>
          ) : (
            <button type="submit" class="primary" disabled={!model} data-testid="send">
              Send
            </button>
          )}
        </form>
      </section>
    </div>
  );
}
