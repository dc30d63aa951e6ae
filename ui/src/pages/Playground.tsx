import type { EditorView } from "@codemirror/view";
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { ApiError, getJSON, getJSONOnce, isAbort, streamEvents } from "../api";
import { ErrorView, Failure, type RunError, useLoad } from "../components/common";
import { FilesPanel, VariablesPanel } from "../components/SessionPanels";
import { Table, tableColumns } from "../components/Table";
import { Tree } from "../components/Tree";
import { createEditor, setBuiltins, setErrorMark } from "../editor";
import { link } from "../router";
import { createSession, describeSession, isGone, playgroundSession, type SessionInfo, shortId, type Unsaved } from "../sessions";

type Builtin = { name: string; description: string; category: string };
type BuiltinDetail = Builtin & { signature: string; examples: string[]; parameters: any[]; returns: string; effect: string; aliases: string[] };
type Run = {
  running: boolean;
  lines: string[]; // every data event, in order
  progress: string | null;
  complete: { result: string; type?: string; elapsed_ms: number } | null;
  error: RunError | null;
  ms: number | null; // time from Run to complete, measured here
};

const SAMPLE = `# Ctrl+Enter runs the program. Try the builtin reference on the right.
let files = [
  {name: "notes.txt", size: 1200, kind: "text"},
  {name: "photo.png", size: 48000, kind: "image"},
  {name: "data.csv", size: 5300, kind: "table"},
]
print("largest first:")
files | sort_by("size", desc=true)
`;

const STORE = "conch.playground.source";

function parse(text: string): unknown {
  const c = text.charCodeAt(0);
  // {, [ or " start JSON renderings of Records, Arrays and nested strings; numbers stay text
  // because a String element "42" renders the same as the Int 42.
  if (c === 123 || c === 91) {
    try {
      return JSON.parse(text);
    } catch {
      /* a String that only looks like JSON */
    }
  }
  return text;
}

export function Playground() {
  const host = useRef<HTMLDivElement>(null);
  const view = useRef<EditorView | null>(null);
  const source = useRef(localStorage.getItem(STORE) ?? SAMPLE);
  const [run, setRun] = useState<Run | null>(null);
  const abort = useRef<AbortController | null>(null);
  const builtins = useLoad<Builtin[]>((s) => getJSONOnce("/api/v1/builtins", s));
  const sess = usePlaygroundSession();

  useEffect(() => {
    if (builtins.data) setBuiltins(builtins.data);
  }, [builtins.data]);

  const start = async () => {
    abort.current?.abort();
    const ctl = new AbortController();
    abort.current = ctl;
    const code = view.current?.state.doc.toString() ?? source.current;
    view.current?.dispatch({ effects: setErrorMark.of(null) });
    const t0 = performance.now();
    const lines: string[] = [];
    let state: Run = { running: true, lines, progress: null, complete: null, error: null, ms: null };
    setRun(state);
    // In a session (made on the first run) unless stateless is chosen.
    let session: string | null = null;
    if (!sess.stateless) {
      try {
        session = sess.id ?? (await sess.create());
      } catch (e) {
        setRun({ ...state, running: false, error: { message: `could not start a session: ${(e as Error).message}`, kind: (e as ApiError).kind || "RequestError" } });
        return;
      }
    }
    // Elements can arrive by the thousand: repaint at most once a frame.
    let scheduled = false;
    const paint = () => {
      if (scheduled) return;
      scheduled = true;
      requestAnimationFrame(() => {
        scheduled = false;
        setRun({ ...state });
      });
    };
    try {
      await streamEvents(
        "/api/v1/stream/eval",
        { method: "POST", body: JSON.stringify(session ? { code, session } : { code }), signal: ctl.signal },
        (ev) => {
          const data = JSON.parse(ev.data);
          if (ev.event === "data") {
            lines.push(String(data.result));
          } else if (ev.event === "progress") {
            state = { ...state, progress: `${data.step}/${data.total} ${data.message ?? ""}` };
          } else if (ev.event === "complete") {
            performance.mark("conch:run-complete");
            if (session) sess.ran(data.unsaved ?? []);
            state = { ...state, complete: data, running: false, ms: performance.now() - t0 };
          } else if (ev.event === "error") {
            if (session) sess.ran(data.unsaved ?? []);
            state = { ...state, error: data, running: false, ms: performance.now() - t0 };
            if (data.line) view.current?.dispatch({ effects: setErrorMark.of({ line: data.line, column: data.column ?? 1 }) });
          }
          paint();
        },
      );
      state = { ...state, running: false };
    } catch (e) {
      if (session && isGone(e)) {
        sess.lost(session);
        state = { ...state, running: false, error: { message: `the session ${session} no longer exists (it expired or was deleted): start a new session to run again`, kind: "NotFound" } };
      } else if (!isAbort(e)) state = { ...state, running: false, error: { message: (e as Error).message, kind: (e as ApiError).kind || "RequestError" } };
      else state = { ...state, running: false, error: { message: "stopped", kind: "CancelledError" } };
    }
    setRun({ ...state });
  };

  const startRef = useRef(start);
  startRef.current = start;

  useEffect(() => {
    if (!host.current) return;
    view.current = createEditor(
      host.current,
      source.current,
      () => startRef.current(),
      (s) => {
        source.current = s;
        localStorage.setItem(STORE, s);
      },
    );
    return () => view.current?.destroy();
  }, []);

  const load = (code: string) => {
    const v = view.current;
    if (!v) return;
    v.dispatch({ changes: { from: 0, to: v.state.doc.length, insert: code } });
    v.focus();
  };

  if (builtins.error) return <Failure what="The playground" error={builtins.error} />;

  return (
    <div class="playground">
      <section class="pane editor-pane" aria-label="Editor">
        <div class="toolbar">
          <button type="button" class="primary" onClick={start} disabled={run?.running} data-testid="run">
            Run <kbd>Ctrl+Enter</kbd>
          </button>
          {run?.running && (
            <button type="button" onClick={() => abort.current?.abort()}>
              Stop
            </button>
          )}
          <span class="muted" aria-live="polite">
            {run?.running ? `running… ${run.lines.length} received ${run.progress ?? ""}` : ""}
          </span>
          <SessionControls sess={sess} running={!!run?.running} />
        </div>
        <div ref={host} class="editor" data-testid="editor" />
        <Result run={run} source={source.current} />
        <SessionArea sess={sess} />
      </section>
      <Reference builtins={builtins.data ?? []} onLoad={load} />
    </div>
  );
}

function Result({ run, source }: { run: Run | null; source: string }) {
  useEffect(() => {
    // For benchmarks/studio.py: the result is on screen (effects run after the paint).
    if (run && !run.running) performance.mark("conch:result-rendered");
  }, [run]);
  const view = useMemo(() => {
    if (!run || run.running) return null;
    const c = run.complete;
    const streamed = c && (c.type === "Array" || c.type === "Range") && /^\d+$/.test(c.result);
    const n = streamed ? Math.min(Number(c!.result), run.lines.length) : 0;
    // Print lines come before a streamed value's elements (the count says how many).
    const output = run.lines.slice(0, run.lines.length - n);
    const items = streamed ? run.lines.slice(run.lines.length - n).map(parse) : null;
    return { output, items };
  }, [run]);

  if (!run) return <div class="result muted">Run a program to see its value here.</div>;
  if (run.running) {
    const tail = run.lines.slice(-200);
    return (
      <div class="result" data-testid="result">
        <pre class="output live" data-testid="output">
          {tail.join("\n")}
        </pre>
      </div>
    );
  }
  const c = run.complete;
  return (
    <div class="result" data-testid="result">
      {view && view.output.length > 0 && (
        <pre class="output" data-testid="output">
          {view.output.join("\n")}
        </pre>
      )}
      {run.error && <ErrorView error={run.error} source={source} />}
      {c && (
        <div class="value">
          <div class="value-meta muted">
            <span class="badge" data-testid="result-type">
              {view?.items ? (tableColumns(view.items) ? "Table" : c.type) : c.type}
            </span>{" "}
            {view?.items ? `${view.items.length} items · ` : ""}
            {c.elapsed_ms} ms on the server
            {run.ms != null ? ` · ${Math.round(run.ms)} ms here` : ""}
          </div>
          <Value items={view?.items ?? null} result={c.result} type={c.type} />
        </div>
      )}
    </div>
  );
}

function Value({ items, result, type }: { items: unknown[] | null; result: string; type?: string }) {
  if (items) {
    const cols = tableColumns(items);
    if (cols) return <Table rows={items as Record<string, unknown>[]} columns={cols} />;
    return <Tree value={items} />;
  }
  if (type === "Record" || type === "Array" || type === "Table" || type === "Error") {
    const v = parse(result);
    if (typeof v === "object") {
      const cols = Array.isArray(v) ? tableColumns(v) : null;
      return cols ? <Table rows={v as Record<string, unknown>[]} columns={cols} /> : <Tree value={v} />;
    }
  }
  return <pre class="scalar">{result}</pre>;
}

function Reference({ builtins, onLoad }: { builtins: Builtin[]; onLoad: (code: string) => void }) {
  const [q, setQ] = useState("");
  const [open, setOpen] = useState<string | null>(null);
  const shown = useMemo(() => {
    const s = q.trim().toLowerCase();
    return builtins.filter((b) => !s || b.name.includes(s) || b.category.includes(s) || b.description.toLowerCase().includes(s));
  }, [builtins, q]);
  return (
    <aside class="pane reference" aria-label="Builtin reference">
      <input
        type="search"
        placeholder={`Search ${builtins.length} builtins`}
        aria-label="Search builtins"
        value={q}
        onInput={(e) => setQ((e.currentTarget as HTMLInputElement).value)}
      />
      <ul class="builtin-list">
        {shown.slice(0, 300).map((b) => (
          <li key={b.name}>
            <button type="button" class="link" aria-expanded={open === b.name} onClick={() => setOpen(open === b.name ? null : b.name)}>
              <code>{b.name}</code> <span class="muted small">{b.category}</span>
            </button>
            {open === b.name && <BuiltinInfo name={b.name} onLoad={onLoad} />}
          </li>
        ))}
      </ul>
    </aside>
  );
}

function BuiltinInfo({ name, onLoad }: { name: string; onLoad: (code: string) => void }) {
  const d = useLoad<BuiltinDetail>((s) => getJSON(`/api/v1/builtins/${encodeURIComponent(name)}`, s), [name]);
  if (d.error) return <Failure what="This builtin" error={d.error} />;
  if (!d.data) return <div class="muted small">loading…</div>;
  const b = d.data;
  return (
    <div class="builtin-info">
      <code class="sig">{b.signature}</code>
      <p>{b.description}</p>
      <div class="muted small">
        effect: {b.effect}
        {b.aliases?.length ? ` · aliases: ${b.aliases.join(", ")}` : ""}
      </div>
      {b.examples.length > 0 && <div class="small">Examples (click to load):</div>}
      {b.examples.map((ex, i) => (
        <button key={i} type="button" class="example" onClick={() => onLoad(ex)} title="Load into the editor">
          <code>{ex}</code>
        </button>
      ))}
    </div>
  );
}

// -- the playground's session ------------------------------------------------------------------

type PlaygroundSession = ReturnType<typeof usePlaygroundSession>;

/** The playground's session: its id kept in this browser (local storage, as the editor's text
 * is), made on the first run; its record (variables with previews, files, quota) read again
 * after every run; a session found gone (expired, deleted) is said so, and a new one is one
 * click away. */
function usePlaygroundSession() {
  const [id, setId] = useState<string | null>(playgroundSession.id);
  const [stateless, setStateless] = useState(playgroundSession.stateless);
  const [info, setInfo] = useState<SessionInfo | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [gone, setGone] = useState<string | null>(null);
  const [unsaved, setUnsaved] = useState<Unsaved[]>([]);
  const [tick, setTick] = useState(0);

  useEffect(() => {
    setError(null);
    if (!id || stateless) return setInfo(null);
    const ctl = new AbortController();
    describeSession(id, ctl.signal).then(
      (i) => (setInfo(i), setGone(null)),
      (e) => {
        if (isAbort(e)) return;
        setInfo(null);
        if (isGone(e)) setGone(id);
        else setError(e);
      },
    );
    return () => ctl.abort();
  }, [id, stateless, tick]);

  const use = (next: string | null) => {
    playgroundSession.set(next);
    setId(next);
    setUnsaved([]);
    setGone(null);
  };
  const create = async () => {
    const s = await createSession();
    use(s.id);
    return s.id;
  };
  return {
    id,
    stateless,
    info,
    error,
    gone,
    unsaved,
    create,
    reload: () => setTick((t) => t + 1),
    ran(u: Unsaved[]) {
      setUnsaved(u);
      setTick((t) => t + 1);
    },
    lost(which: string) {
      if (which === id) setGone(which);
    },
    fresh: async () => {
      try {
        await create();
      } catch (e) {
        setError(e);
      }
    },
    setStateless(on: boolean) {
      playgroundSession.setStateless(on);
      setStateless(on);
    },
  };
}

function SessionControls({ sess, running }: { sess: PlaygroundSession; running: boolean }) {
  return (
    <span class="session-controls">
      <label class="inline small">
        <input type="checkbox" checked={!sess.stateless} onChange={(e) => sess.setStateless(!(e.currentTarget as HTMLInputElement).checked)} data-testid="keep-state" />
        Keep state in a session
      </label>
      {!sess.stateless && sess.id && (
        <a class="small mono" href={link("sessions", sess.id)} title={`Session ${sess.id}`} data-testid="session-link">
          {shortId(sess.id)}
        </a>
      )}
      {!sess.stateless && (
        <button type="button" class="small" onClick={sess.fresh} disabled={running} data-testid="new-session">
          New session
        </button>
      )}
    </span>
  );
}

function SessionArea({ sess }: { sess: PlaygroundSession }) {
  if (sess.stateless)
    return (
      <p class="muted small" data-testid="stateless">
        Stateless: each run starts afresh in the shared workspace, as the API does without <code>session</code>.
      </p>
    );
  return (
    <div class="session-area">
      {sess.gone && (
        <div class="error-box" role="alert" data-testid="session-gone">
          <strong>This playground's session no longer exists</strong> (<code>{sess.gone}</code>: it expired after its time to live, or was deleted),
          and its variables and files with it.{" "}
          <button type="button" class="small primary" onClick={sess.fresh}>
            Start a new session
          </button>
        </div>
      )}
      {sess.error != null && (
        <div class="error-box" role="alert">
          {(sess.error as Error).message}{" "}
          <button type="button" class="small" onClick={sess.reload}>
            Try again
          </button>
        </div>
      )}
      {!sess.id && !sess.gone && (
        <p class="muted small" data-testid="no-session">
          A session is made on the first run: what a run binds is kept for the next, with a workspace of its own.{" "}
          <button type="button" class="small" onClick={sess.fresh}>
            Start one now
          </button>
        </p>
      )}
      {sess.info && !sess.gone && (
        <div class="session-panels">
          <VariablesPanel info={sess.info} unsaved={sess.unsaved} />
          <FilesPanel info={sess.info} onChange={sess.reload} onGone={() => sess.lost(sess.info!.id)} />
        </div>
      )}
    </div>
  );
}
