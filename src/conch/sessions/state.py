"""The saved bindings of a session: one JSON document per binding under ``state/``, changed all
at once by a manifest.

A binding arrives as an opaque JSON-able document ``{name, type, value, ...}`` (making one
from a conch value, and a value from one, is the language's job). Layout::

    state/manifest.0, manifest.1   two slots; each a header line
                                   ``conch-state 1 VERSION LENGTH CRC32`` and then JSON
                                   ``{"version", "bindings": {NAME: {slot, type, bytes, crc}}}``
    state/bindings/STEM.0.json     a binding's document, in one of its two slots (STEM: the
    state/bindings/STEM.1.json     binding's name when it is a plain identifier, else ~ and
                                   a digest of it)

Atomic. The state is what the valid manifest with the highest version says; save N writes
manifest slot N % 2, the slot holding N - 2. A changed binding is written into the slot of
its two that the current manifest does not point at, then manifest N is written, and its
last byte is the moment the session's state changes, from every old binding to every new
one. A server killed in the middle leaves manifest N torn (its length or CRC does not match:
it is passed over) and manifest N - 1 whole, and N - 1 points only at binding slots this save
did not touch: the state of the last completed save, never a mix of two runs. Removed
bindings' files go after the manifest; a crash before leaves files no manifest names, which
the next :meth:`SessionState.load` (the resume, by the server holding the session) removes.
Each binding's length and CRC are in the manifest, so a damaged document is named as damaged
(``Snapshot.damaged``), never read as another value.

Why slots rather than a temporary file renamed into place: once a binding has been saved
twice, a save creates no file and renames none, and both cost far more than writing a few
bytes into a file that exists. On ext4 (the usual Linux file system) creating a file takes a
journal handle and ``rename`` over an existing file starts writing the renamed file's data out
(``auto_da_alloc``): measured here, about 370 µs and 150 µs at the median, against about 6 µs
to overwrite a small file in place. A save that changes one small binding is two such
overwrites, well under a millisecond (docs/sessions.md has the figures).

No fsync. What must survive is the server process dying (SIGKILL, an OOM kill, a crash):
what it wrote is then in the kernel's page cache, which outlives the process and reaches the
disk in its own time, and a write cut short is caught by the length and CRC. Only a power cut
or a kernel crash could lose a recent save, and a session would then resume from an earlier
completed save (the database row might count a run more). An fsync per save would cost
milliseconds on most disks, more than the run it follows.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

BINDINGS = "bindings"
MANIFESTS = ("manifest.0", "manifest.1")
_MAGIC = b"conch-state 1 "
_HEADER_MAX = 80
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW


def _file_stem(name: str) -> str:
    if _PLAIN.fullmatch(name):
        return name
    return "~" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _overwrite(path: Path, data: bytes) -> None:
    """Write ``data`` as the whole of ``path``, in place (made if missing)."""
    fd = os.open(path, _WRITE, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _read_exact(path: Path, n: int) -> bytes:
    fd = os.open(path, _READ)
    try:
        chunks = []
        left = n
        while left > 0:
            got = os.read(fd, left)
            if not got:
                break
            chunks.append(got)
            left -= len(got)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _parse_header(head: bytes) -> tuple[int, int, int, int] | None:
    """``(version, body length, crc, header length)`` of a manifest slot, or None."""
    end = head.find(b"\n")
    if end < 0 or not head.startswith(_MAGIC):
        return None
    try:
        version, length, crc = head[len(_MAGIC) : end].split(b" ")
        return int(version), int(length), int(crc, 16), end + 1
    except ValueError:
        return None


@dataclass
class Snapshot:
    """What :meth:`SessionState.load` found: the bindings by name (in the order they were
    first saved; each a document, or its JSON bytes when loaded ``raw``), the manifest's
    version, and the bindings whose document could not be read (``[{name, reason}]``: named,
    never dropped silently)."""

    version: int
    bindings: dict[str, Any]
    damaged: list[dict[str, str]] = field(default_factory=list)


class SessionState:
    """The saved bindings under one session's ``state/`` directory (see the module doc).

    One writer at a time: the server holding the session's lease. Any server may read the
    summary (:meth:`bindings`, :meth:`size_bytes`, :meth:`version`)."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)
        self.bindings_dir = self.dir / BINDINGS
        self._lock = threading.Lock()
        self._made = False  # the directories exist (made by an earlier save here)
        # The current manifest, and the headers of both slots it was read (or written) with:
        # while the headers read back the same, nobody else saved since.
        self._cached: tuple[tuple[bytes, bytes], dict[str, Any], int] | None = None

    # -- the manifest -----------------------------------------------------------------------

    def _headers(self) -> tuple[bytes, bytes]:
        out = []
        for name in MANIFESTS:
            try:
                head = _read_exact(self.dir / name, _HEADER_MAX)
            except FileNotFoundError:
                head = b""
            out.append(head[: head.find(b"\n") + 1])
        return out[0], out[1]

    def _manifest(self) -> tuple[dict[str, Any], int]:
        """The current manifest (``version`` 0 and no bindings before the first save) and the
        bytes its slot takes."""
        heads = self._headers()
        if self._cached is not None and self._cached[0] == heads:
            return self._cached[1], self._cached[2]
        best: tuple[dict[str, Any], int] | None = None
        for name, head in zip(MANIFESTS, heads, strict=True):
            parsed = _parse_header(head)
            if parsed is None or (best is not None and parsed[0] <= best[0]["version"]):
                continue
            version, length, crc, hlen = parsed
            try:
                data = _read_exact(self.dir / name, hlen + length)
            except FileNotFoundError:
                continue
            body = data[hlen:]
            if len(body) != length or zlib.crc32(body) != crc:
                continue  # torn: a save was cut short writing it
            manifest = orjson.loads(body)
            if manifest.get("version") == version:
                best = (manifest, len(data))
        if best is None:
            best = ({"version": 0, "bindings": {}}, 0)
        self._cached = (heads, best[0], best[1])
        return best

    def version(self) -> int:
        """The version of the last completed save (0: never saved)."""
        with self._lock:
            return int(self._manifest()[0]["version"])

    def bindings(self) -> list[dict[str, str]]:
        """``[{name, type}]`` of the saved bindings, read from the manifest alone."""
        with self._lock:
            return [
                {"name": name, "type": meta["type"]}
                for name, meta in self._manifest()[0]["bindings"].items()
            ]

    def size_bytes(self) -> int:
        """Bytes the saved state takes: its current documents and manifest."""
        with self._lock:
            manifest, size = self._manifest()
            return size + sum(int(meta["bytes"]) for meta in manifest["bindings"].values())

    def previews(self, max_doc_bytes: int) -> list[dict[str, Any]]:
        """``[{name, type, kind, mutable, bytes, preview, length}]`` of the saved bindings, in
        the order they were first saved: each document read (never collected: any server may
        call this) and turned into a short text by :mod:`conch.sessions.preview`. A document
        over ``max_doc_bytes`` is not read: its ``preview`` is None and ``no_preview`` says
        why, as it does for one that cannot be read."""
        from conch.sessions.preview import preview

        with self._lock:
            manifest, _ = self._manifest()
            metas = list(manifest["bindings"].items())
        out: list[dict[str, Any]] = []
        for name, meta in metas:
            size = int(meta["bytes"])
            entry: dict[str, Any] = {"name": name, "type": meta["type"], "bytes": size,
                                     "preview": None, "length": None}
            if size > max_doc_bytes:
                entry["no_preview"] = (f"its saved value takes {size} bytes, over the "
                                       f"{max_doc_bytes} read for a preview")
                out.append(entry)
                continue
            path = self.bindings_dir / f"{_file_stem(name)}.{meta['slot']}.json"
            try:
                data = _read_exact(path, size)
            except OSError as exc:
                entry["no_preview"] = f"its saved document: {exc.strerror}"
                out.append(entry)
                continue
            if len(data) != size or zlib.crc32(data) != meta["crc"]:
                # Saved again since the manifest was read, or damaged: say so, guess nothing.
                entry["no_preview"] = "its saved document changed while it was read"
                out.append(entry)
                continue
            doc = orjson.loads(data)
            entry["kind"] = doc.get("kind")
            entry["mutable"] = doc.get("mutable")
            entry.update(preview(doc))
            out.append(entry)
        return out

    # -- loading ----------------------------------------------------------------------------

    def load(self, *, raw: bool = False, collect: bool = True) -> Snapshot:
        """Every saved binding, for a resume. ``raw``: each as the JSON bytes it was saved as
        (checked, not parsed: for a worker that parses them itself). ``collect``: remove the
        files of bindings no manifest names any more (only the lease holder may: a save may
        be under way anywhere else)."""
        with self._lock:
            manifest, _ = self._manifest()
            out: dict[str, Any] = {}
            damaged: list[dict[str, str]] = []
            for name, meta in manifest["bindings"].items():
                path = self.bindings_dir / f"{_file_stem(name)}.{meta['slot']}.json"
                try:
                    data = _read_exact(path, meta["bytes"])
                except OSError as exc:
                    damaged.append({"name": name, "reason": f"its saved document: {exc.strerror}"})
                    continue
                if len(data) != meta["bytes"] or zlib.crc32(data) != meta["crc"]:
                    damaged.append(
                        {"name": name, "reason": "its saved document does not match its checksum"}
                    )
                    continue
                out[name] = data if raw else orjson.loads(data)
            if collect:
                self._collect(manifest)
            return Snapshot(int(manifest["version"]), out, damaged)

    def _collect(self, manifest: dict[str, Any]) -> None:
        keep = {_file_stem(name) for name in manifest["bindings"]}
        with contextlib.suppress(FileNotFoundError), os.scandir(self.bindings_dir) as it:
            for e in it:
                if e.name.rsplit(".", 2)[0] not in keep:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(e.path)

    # -- saving -----------------------------------------------------------------------------

    def save(self, changed: Iterable[Mapping[str, Any]] = (), removed: Iterable[str] = ()) -> int:
        """Save the bindings a run changed (documents ``{name, type, value}``) and forget those
        it removed (a name in both is saved), all at once; returns the new version (the old
        one when there was nothing to do). ``ValueError`` for a document without a string
        name and type, or one that is not JSON-able (nothing is saved then)."""
        docs: dict[str, tuple[bytes, str]] = {}
        for doc in changed:
            name, kind = doc.get("name"), doc.get("type")
            if not isinstance(name, str) or not name or not isinstance(kind, str):
                raise ValueError("a binding document needs a string name and type")
            try:
                docs[name] = (orjson.dumps(doc), kind)
            except TypeError as exc:
                raise ValueError(f"binding {name!r} is not JSON-able: {exc}") from None
        with self._lock:
            manifest, _ = self._manifest()
            current: dict[str, Any] = manifest["bindings"]
            gone = [n for n in dict.fromkeys(removed) if n in current and n not in docs]
            if not docs and not gone:
                return int(manifest["version"])
            version = int(manifest["version"]) + 1
            entries = {n: meta for n, meta in current.items() if n not in gone}
            if docs and not self._made:
                self.bindings_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            for name, (data, kind) in docs.items():
                old = entries.get(name)
                slot = 1 - old["slot"] if old is not None else 0
                _overwrite(self.bindings_dir / f"{_file_stem(name)}.{slot}.json", data)
                entries[name] = {
                    "slot": slot,
                    "type": kind,
                    "bytes": len(data),
                    "crc": zlib.crc32(data),
                }
            new = {"version": version, "bindings": entries}
            body = orjson.dumps(new)
            head = _MAGIC + b"%d %d %08x\n" % (version, len(body), zlib.crc32(body))
            if not self._made:
                self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            _overwrite(self.dir / MANIFESTS[version % 2], head + body)
            self._made = bool(docs) or self._made
            for name in gone:
                for slot in (0, 1):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.bindings_dir / f"{_file_stem(name)}.{slot}.json")
            heads = self._cached[0] if self._cached is not None else (b"", b"")
            mine = (head, heads[1]) if version % 2 == 0 else (heads[0], head)
            self._cached = (mine, new, len(head) + len(body))
            return version

    def replace(self, docs: Iterable[Mapping[str, Any]]) -> int:
        """Save exactly ``docs``: every binding not among them is forgotten."""
        docs = list(docs)
        with self._lock:
            names = list(self._manifest()[0]["bindings"])
        keep = {d.get("name") for d in docs}
        return self.save(docs, [n for n in names if n not in keep])
