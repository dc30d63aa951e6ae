import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError } from "../api";
import {
  type Binding,
  bytes,
  deleteFile,
  downloadFile,
  type FileEntry,
  listFiles,
  type SessionInfo,
  type Unsaved,
  uploadFile,
} from "../sessions";
import { ErrorBox, Head } from "./common";

/** A session's variables: each saved binding with its type and a preview of its saved value
 * (`GET /sessions/:id?preview=true`: read from the saved state, nothing is run), and the
 * bindings the last run could not save (its answer's `unsaved`). */
export function VariablesPanel({ info, unsaved }: { info: SessionInfo; unsaved?: Unsaved[] }) {
  const vars = info.bindings;
  return (
    <section class="pane session-panel" aria-labelledby="vars-title" data-testid="variables">
      <h2 id="vars-title">
        Variables <span class="muted small">({vars.length})</span>
      </h2>
      {vars.length === 0 ? (
        <p class="muted small">No variables yet: what a run binds (let, let mut, fn) is kept here for the next run.</p>
      ) : (
        <div class="table-wrap vars-wrap" role="region" aria-label="Variables of this session" tabIndex={0}>
          <table class="data vars">
            <Head cols={["Name", "Type", "Value"]} />
            <tbody>
              {vars.map((b) => (
                <VarRow key={b.name} b={b} />
              ))}
            </tbody>
          </table>
        </div>
      )}
      {unsaved && unsaved.length > 0 && (
        <div class="notice small" role="status" data-testid="unsaved">
          <strong>Not saved by the last run</strong> (kept while this session stays warm, gone if it is paused):
          <ul>
            {unsaved.map((u) => (
              <li key={u.name}>
                <code>{u.name}</code>: {u.reason}
              </li>
            ))}
          </ul>
        </div>
      )}
    </section>
  );
}

function VarRow({ b }: { b: Binding }) {
  const size = b.length != null ? ` · ${b.length.toLocaleString()} ${b.type === "String" ? "chars" : b.type === "Record" ? "fields" : "items"}` : "";
  return (
    <tr data-var={b.name}>
      <td>
        <code>{b.name}</code>
        {b.mutable ? <span class="muted small"> mut</span> : null}
      </td>
      <td>
        <span class="badge">{b.type}</span>
        <span class="muted small">{size}</span>
      </td>
      <td class="clip var-preview" title={b.preview ?? b.no_preview ?? ""}>
        {b.preview != null ? <code>{b.preview}</code> : <span class="muted small">{b.no_preview ?? "no preview"}</span>}
      </td>
    </tr>
  );
}

/** A session's files: the listing of one directory, upload by drop or by picker, download,
 * delete, and the disk in use against the session's quota. */
export function FilesPanel({ info, onChange, onGone }: { info: SessionInfo; onChange: () => void; onGone?: () => void }) {
  const id = info.id;
  const [dir, setDir] = useState("");
  const [entries, setEntries] = useState<FileEntry[]>(info.files);
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState<string | null>(null);
  const [over, setOver] = useState(false);
  const picker = useRef<HTMLInputElement>(null);

  // The root comes with the session's record; a directory below it is listed on its own.
  useEffect(() => {
    if (!dir) return setEntries(info.files);
    const ctl = new AbortController();
    listFiles(id, dir, ctl.signal).then(setEntries, (e) => {
      if ((e as Error).name === "AbortError") return;
      setError(e);
      setDir("");
    });
    return () => ctl.abort();
  }, [id, dir, info]);

  const fail = (e: unknown) => {
    setError(e);
    if (e instanceof ApiError && e.status === 404 && e.message.includes("session")) onGone?.();
  };

  const upload = async (files: FileList | File[] | null) => {
    if (!files || !files.length) return;
    setError(null);
    for (const f of Array.from(files)) {
      setBusy(`uploading ${f.name} (${bytes(f.size)})…`);
      try {
        await uploadFile(id, dir ? `${dir}/${f.name}` : f.name, f);
      } catch (e) {
        fail(e);
        break;
      }
    }
    setBusy(null);
    onChange();
  };

  const remove = async (e: FileEntry) => {
    // A directory goes with everything in it: asked first.
    if (e.type === "dir" && !confirm(`Delete the directory ${e.name} and everything in it?`)) return;
    setError(null);
    try {
      await deleteFile(id, e.name, e.type === "dir");
    } catch (err) {
      fail(err);
    }
    onChange();
  };

  const download = async (e: FileEntry) => {
    setError(null);
    try {
      await downloadFile(id, e.name);
    } catch (err) {
      fail(err);
    }
  };

  const used = info.workspace_bytes;
  const quota = info.disk_quota_bytes;
  const is413 = error instanceof ApiError && error.status === 413;
  const parent = dir.includes("/") ? dir.slice(0, dir.lastIndexOf("/")) : "";

  return (
    <section
      class={`pane session-panel files-panel${over ? " drop-over" : ""}`}
      aria-labelledby="files-title"
      data-testid="files"
      onDragOver={(e) => {
        if (!e.dataTransfer?.types.includes("Files")) return;
        e.preventDefault();
        setOver(true);
      }}
      onDragLeave={() => setOver(false)}
      onDrop={(e) => {
        e.preventDefault();
        setOver(false);
        void upload(e.dataTransfer?.files ?? null);
      }}
    >
      <h2 id="files-title">
        Files <span class="muted small">{dir ? `/${dir}` : "/"}</span>
      </h2>
      <div class="quota small" data-testid="quota">
        {quota ? (
          <>
            <meter min={0} max={quota} value={used} high={quota * 0.9} aria-label="Disk used by this session's files" />{" "}
            {bytes(used)} of {bytes(quota)} used
            {info.upload_max_bytes ? <span class="muted">(one upload at most {bytes(info.upload_max_bytes)})</span> : null}
          </>
        ) : (
          <>{bytes(used)} used</>
        )}
      </div>
      <div class="dropzone" data-testid="dropzone">
        <span class="muted small">Drop files here, or</span>{" "}
        <button type="button" class="small" onClick={() => picker.current?.click()} disabled={!!busy}>
          Choose files…
        </button>
        <input
          ref={picker}
          type="file"
          multiple
          class="sr-only"
          tabIndex={-1}
          aria-label="Upload files to this session"
          data-testid="file-input"
          onChange={(e) => {
            const input = e.currentTarget as HTMLInputElement;
            void upload(input.files).then(() => (input.value = ""));
          }}
        />
      </div>
      {busy && (
        <div class="muted small" role="status">
          {busy}
        </div>
      )}
      {error != null && (
        <div data-testid="files-error">
          <ErrorBox error={error} />
          {is413 && <p class="small">Nothing was written. Delete files to make room, or upload a smaller file.</p>}
          <button type="button" class="small" onClick={() => setError(null)}>
            Dismiss
          </button>
        </div>
      )}
      {entries.length === 0 && !dir ? (
        <p class="muted small">No files yet. Programs in this session read and write here (cat, write, ls).</p>
      ) : (
        <ul class="file-list">
          {dir && (
            <li>
              <button type="button" class="link" onClick={() => setDir(parent)}>
                ../
              </button>
            </li>
          )}
          {entries.map((e) => (
            <li key={e.name} data-file={e.name}>
              {e.type === "dir" ? (
                <button type="button" class="link file-name" onClick={() => setDir(e.name)}>
                  {e.name.split("/").pop()}/
                </button>
              ) : (
                <span class="file-name">
                  <code>{e.name.split("/").pop()}</code>
                </span>
              )}
              <span class="muted small num">{e.type === "dir" ? "" : bytes(e.size)}</span>
              <span class="file-actions">
                {e.type === "file" && (
                  <button type="button" class="small" onClick={() => download(e)} aria-label={`Download ${e.name}`}>
                    Download
                  </button>
                )}
                <button type="button" class="small danger" onClick={() => remove(e)} aria-label={`Delete ${e.name}`}>
                  Delete
                </button>
              </span>
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}
