"""``conch models pull``, ``convert`` and ``setup``: acquire models into the local store.

These talk to the store directly (no server needed) and show rich progress bars.
:func:`register` adds them to the ``conch models`` typer app; its ``setup`` replaces a plainer
one registered before it, doing that one's work (the bundled chat model) too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

import typer

from conch.inference.models.acquire import DEFAULT_EMBEDDING_ID, DEFAULT_EMBEDDING_PACKAGE


def _acquirer() -> Any:
    from conch.config import load_settings
    from conch.inference.models.acquire import Acquirer
    from conch.inference.models.store import ModelStore

    settings = load_settings()
    store = ModelStore(settings)
    acq = Acquirer(settings, store)
    acq.recover()
    return acq


class _Bars:
    """A rich progress display fed with ``{status, completed, total}`` reports."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            transient=False,
        )
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> _Bars:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)  # type: ignore[arg-type]

    def __call__(self, event: dict[str, Any]) -> None:
        status = str(event.get("status", ""))
        total = int(event.get("total") or 0) or None
        task = self.tasks.get(status)
        if task is None:
            task = self.tasks[status] = self.progress.add_task(status, total=total)
        self.progress.update(task, completed=int(event.get("completed") or 0), total=total)


def _fail(exc: Exception) -> NoReturn:
    from conch.inference.models.sources import ModelOpError

    message = exc.message if isinstance(exc, ModelOpError) else str(exc)
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def _with_bars(work: Callable[[_Bars], Any]) -> Any:
    """Run ``work`` with progress bars; any failure ends the command with its message."""
    try:
        with _Bars() as bars:
            return work(bars)
    except Exception as exc:
        _fail(exc)


def _report(record: Any, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(record.model_dump(mode="json"), indent=2))
    else:
        _summary(record)


def _summary(record: Any) -> None:
    data = record.model_dump(mode="json", exclude={"extra"})
    keys = ("id", "status", "format", "quantization", "architecture", "size_bytes", "revision",
            "converted_from", "path")
    for k in keys:
        if data.get(k) is not None:
            typer.echo(f"{k:<15} {data[k]}")


def pull(
    model_id: Annotated[str, typer.Argument(help="Id the model gets in the store.")],
    source: Annotated[str, typer.Option("--source", "-s", help="huggingface | url | pypi | ollama | file")],
    revision: Annotated[str | None, typer.Option(help="Branch/tag/commit, version or tag.")] = None,
    files: Annotated[list[str] | None, typer.Option("--files", help="Glob picking files, e.g. '*Q4_K_M.gguf'.")] = None,
    repo: Annotated[str | None, typer.Option(help="huggingface: owner/name (default: the id).")] = None,
    url: Annotated[str | None, typer.Option(help="url: the file's address.")] = None,
    package: Annotated[str | None, typer.Option(help="pypi: the package name.")] = None,
    name: Annotated[str | None, typer.Option(help="ollama: name[:tag].")] = None,
    path: Annotated[str | None, typer.Option(help="file: a path on this machine.")] = None,
    registry: Annotated[str | None, typer.Option(help="ollama: registry URL.")] = None,
    sha256: Annotated[str | None, typer.Option(help="Expected sha256 of the file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the model record as JSON.")] = False,
) -> None:
    """Download a model from a source into the store."""
    from pathlib import Path

    from conch.inference.models.acquire import DownloadSpec

    if path is not None:
        path = str(Path(path).expanduser().resolve())
    spec = DownloadSpec(source=source, revision=revision, files=files or None, repo=repo, url=url,
                        package=package, name=name, path=path, registry=registry, sha256=sha256)
    acq = _acquirer()
    _report(_with_bars(lambda bars: acq.download(model_id, spec, bars)), as_json)


def convert(
    model_id: Annotated[str, typer.Argument(help="The model to convert.")],
    to: Annotated[str, typer.Option("--to", help="Target format: gguf or onnx.")] = "gguf",
    quantization: Annotated[str | None, typer.Option("--quantization", "-q", help="f16, q8_0, q4_k_m, ...")] = None,
    output_id: Annotated[str | None, typer.Option("--output-id", help="Id of the new model.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the model record as JSON.")] = False,
) -> None:
    """Convert a model (safetensors -> gguf/onnx) or re-quantize a gguf model."""
    acq = _acquirer()
    _report(_with_bars(lambda bars: acq.convert(model_id, to, quantization, output_id, bars)), as_json)


def setup() -> None:
    """Make the default models ready: the bundled SmolLM2 chat model and the MiniLM embedder."""
    from conch.inference.models.bundled import BUNDLED_ID, ensure_bundled_model

    acq = _acquirer()
    store = acq.store
    record = ensure_bundled_model(store)
    if record is not None:
        typer.echo(f"ready: {record.id}")
    elif store.get(BUNDLED_ID) is None:
        typer.echo("the store already has a chat model; the bundled model was not registered")
    emb = _with_bars(lambda bars: ensure_default_embedding_model(acq, bars))
    typer.echo(f"ready: {emb.id}")


def ensure_default_embedding_model(acq: Any, progress: Any = None) -> Any:
    """Pull MiniLM from the package index and convert it to GGUF f16, unless already done."""
    store = acq.store
    existing = store.get(DEFAULT_EMBEDDING_ID)
    if existing is not None and existing.status == "ready":
        return existing
    from conch.inference.models.acquire import DownloadSpec

    src = store.get(DEFAULT_EMBEDDING_PACKAGE)
    if src is None or src.status != "ready":
        acq.download(DEFAULT_EMBEDDING_PACKAGE,
                     DownloadSpec(source="pypi", package=DEFAULT_EMBEDDING_PACKAGE), progress)
    return acq.convert(DEFAULT_EMBEDDING_PACKAGE, "gguf", "f16", DEFAULT_EMBEDDING_ID, progress)


def register(app: typer.Typer) -> None:
    """Add ``pull``, ``convert`` and ``setup`` to the ``conch models`` app."""
    ours = {"pull", "convert", "setup"}
    app.registered_commands[:] = [
        c for c in app.registered_commands
        if (c.name or (c.callback.__name__ if c.callback else "")) not in ours
    ]
    app.command("pull")(pull)
    app.command("convert")(convert)
    app.command("setup")(setup)
