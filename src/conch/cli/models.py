"""``conch models``: run the inference server and manage the model store.

``list``, ``show`` and ``rm`` talk to the store directly (the database and files), so they
work whether or not a server is running.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from conch.cli.serving import ModelsPortOpt, inference_app, uvicorn_options

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

app = typer.Typer(help="The model inference server and the local model store.", no_args_is_help=True)


def _settings() -> object:
    from conch.config import load_settings

    return load_settings()


def _store() -> object:
    from conch.inference.models.store import ModelStore

    return ModelStore(_settings())  # type: ignore[arg-type]


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1; another address needs an admin key).")] = None,
    port: ModelsPortOpt = None,
) -> None:
    """Run the OpenAI-compatible inference server."""
    import uvicorn

    from conch.config import load_settings

    settings = load_settings(models_host=host, models_port=port)
    app_ = inference_app(settings)
    typer.echo(f"conch inference server on http://{settings.models_host}:{settings.models_port}/v1")
    uvicorn.run(app_, **uvicorn_options(settings, settings.models_host, settings.models_port))


@app.command("list")
def list_(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the models in the store."""
    from conch.inference.models.bundled import ensure_bundled_model
    from conch.inference.models.store import ModelStore

    store = _store()
    assert isinstance(store, ModelStore)
    ensure_bundled_model(store)
    records = store.list()
    if as_json:
        typer.echo(json.dumps([r.model_dump(mode="json", exclude={"extra"}) for r in records], indent=2))
        return
    from rich.console import Console

    rows = [
        {"ID": r.id, "STATUS": r.status, "FORMAT": r.format, "QUANT": r.quantization or "-",
         "ARCH": r.architecture or "-", "CTX": str(r.context_length or "-"), "SIZE": _human(r.size_bytes),
         "CAPABILITIES": ",".join(r.capabilities)}
        for r in records
    ]
    console = Console()
    table = _fitting_table(console, rows)
    if table is not None:
        console.print(table)
        return
    # Not even the ids fit inside a table's borders: one per line, whole (the terminal wraps them).
    width = max((len(r.id) for r in records), default=0)
    for r in records:
        typer.echo(f"{r.id:<{width}}  {r.status}")


# The order `models list` gives up columns in when the terminal is narrow: an id is what a
# person copies into the next command, so it is shown whole and everything else yields to it.
_DROPPED_FIRST = ("ARCH", "FORMAT", "CTX", "CAPABILITIES", "QUANT", "SIZE", "STATUS")


def _fitting_table(console: Console, rows: list[dict[str, str]]) -> Table | None:
    """The models table with as many columns as fit the console unwrapped and untruncated, or
    None when even the ID column alone does not."""
    from rich.table import Table

    shown = ["ID", "STATUS", "FORMAT", "QUANT", "ARCH", "CTX", "SIZE", "CAPABILITIES"]
    dropping = iter(_DROPPED_FIRST)
    while True:
        table = Table()
        for name in shown:
            # Rich shrinks columns to fit the width (cutting ids to "smollm2…"); it never has to
            # when the table's natural width fits, which is what the columns are chosen for.
            table.add_column(name, no_wrap=name == "ID")
        for row in rows:
            table.add_row(*(row[name] for name in shown))
        # Measured without the console's limit, which would cap the natural width at it.
        if console.measure(table, options=console.options.update(max_width=10**6)).maximum <= console.width:
            return table
        dropped = next(dropping, None)
        if dropped is None:
            return None
        shown.remove(dropped)


@app.command()
def show(
    model_id: Annotated[str, typer.Argument(help="Model id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show one model's details."""
    from conch.inference.models.store import ModelStore

    store = _store()
    assert isinstance(store, ModelStore)
    record = store.find(model_id)
    if record is None:
        typer.echo(f"error: no model '{model_id}' in the store", err=True)
        raise typer.Exit(1)
    data = record.model_dump(mode="json", exclude={"extra"})
    if record.format == "gguf":
        data["placement"] = _placement(record.id)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    width = max(len(k) for k in data)
    for key, value in data.items():
        if key == "size_bytes":
            value = f"{value} ({_human(int(value))})"
        elif key == "placement":
            value = _placement_line(value)
        elif isinstance(value, list):
            value = ", ".join(map(str, value)) or "-"
        typer.echo(f"{key:<{width}}  {'-' if value is None else value}")


def _placement(model_id: str) -> dict[str, object]:
    """Where the model runs: asked of the local inference server when it has the model loaded,
    else what loading it here would do (the settings and the llama.cpp build)."""
    import httpx

    from conch.config import load_settings
    from conch.inference.engines.llama import device
    from conch.inference.engines.llama.offload import runtime_options

    settings = load_settings()
    host = "127.0.0.1" if settings.models_host in ("0.0.0.0", "::") else settings.models_host
    try:
        r = httpx.get(f"http://{host}:{settings.models_port}/v1/models/{model_id}", timeout=1.0)
        where = r.json().get("placement") if r.status_code == 200 else None
        if where:
            return {"loaded": True, **where}
    except (httpx.HTTPError, ValueError):
        pass
    opts = runtime_options(settings, model_id)
    info = device.device_info()
    if not opts.on_gpu:
        why = "n_gpu_layers = 0" if opts.gpu_backend else "no GPU backend in this llama.cpp build"
        return {"loaded": False, "device": "cpu", "n_gpu_layers": 0, "note": f"would run on the CPU ({why})"}
    layers = "every layer" if opts.n_gpu_layers < 0 else f"{opts.n_gpu_layers} layers"
    return {"loaded": False, "device": info.device, "n_gpu_layers": opts.n_gpu_layers,
            "note": f"would offload {layers} to {info.device}, as many as fit"}


def _placement_line(where: dict[str, object]) -> str:
    if not where.get("loaded"):
        return f"not loaded; {where.get('note')}"
    vram = where.get("vram_bytes")
    mem = f", {_human(int(vram))} of GPU memory" if isinstance(vram, int) and vram else ""
    if where.get("offload") == "none":
        return f"loaded on the CPU ({where.get('note')})"
    return (f"loaded on {where.get('device')}: {where.get('n_gpu_layers')} of {where.get('n_layers')} "
            f"layers on the GPU{mem}")


def _server_url() -> str:
    from conch.config import load_settings

    settings = load_settings()
    host = "127.0.0.1" if settings.models_host in ("0.0.0.0", "::") else settings.models_host
    return f"http://{host}:{settings.models_port}"


@app.command()
def ps(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """The models the local inference server has loaded, their memory, and the memory budget."""
    import httpx

    url = _server_url()
    try:
        with httpx.Client(base_url=url, timeout=10.0) as client:
            loaded = client.get("/api/ps").raise_for_status().json()["models"]
            memory = client.get("/v1/status").raise_for_status().json().get("memory")
            for entry in loaded:
                r = client.get(f"/v1/models/{entry['model']}")
                entry["footprint"] = r.json().get("footprint") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        typer.echo(f"error: no inference server answers at {url} ({exc}); start one with `conch models serve`",
                   err=True)
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps({"models": loaded, "memory": memory}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for name in ("NAME", "SIZE", "ESTIMATED", "MEASURED", "PROCESSOR", "CONTEXT", "UNTIL"):
        table.add_column(name, no_wrap=name == "NAME")
    for entry in loaded:
        fp = entry.get("footprint") or {}
        measured = fp.get("measured_bytes")
        table.add_row(
            entry["name"], _human(int(entry["size"])),
            _human(int(fp["estimated_bytes"])) if fp.get("estimated_bytes") is not None else "-",
            _human(int(measured)) if measured is not None else "-",
            _processor(int(entry["size"]), int(entry.get("size_vram") or 0)),
            str(entry.get("context_length") or "-"), _until(str(entry.get("expires_at") or "")),
        )
    console = Console()
    if loaded:
        console.print(table)
    else:
        typer.echo("no models loaded (a model loads on its first request)")
    if memory:
        typer.echo(f"memory budget: {_human(int(memory['used_bytes']))} of {_human(int(memory['budget_bytes']))} "
                   f"in use, {_human(int(memory['free_bytes']))} free ({memory['basis']})")


def _processor(size: int, vram: int) -> str:
    """Where the model's memory is, as `ollama ps` says it."""
    if vram <= 0 or size <= 0:
        return "100% CPU"
    gpu = min(100, round(100 * vram / size))
    return "100% GPU" if gpu >= 100 else f"{100 - gpu}%/{gpu}% CPU/GPU"


def _until(expires_at: str) -> str:
    from datetime import UTC, datetime

    if not expires_at or expires_at.startswith("9999"):
        return "forever"
    try:
        when = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    except ValueError:
        return expires_at
    left = (when - datetime.now(UTC)).total_seconds()
    if left < 60:
        return "less than a minute from now" if left > 0 else "now"
    minutes = round(left / 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''} from now"


@app.command()
def rm(model_id: Annotated[str, typer.Argument(help="Model id.")]) -> None:
    """Remove a model from the store (its files under the models directory, never a linked file)."""
    from conch.inference.models.store import ModelStore

    store = _store()
    assert isinstance(store, ModelStore)
    record = store.find(model_id)
    if record is None:
        typer.echo(f"error: no model '{model_id}' in the store", err=True)
        raise typer.Exit(1)
    mid = record.id
    if record.status in ("downloading", "converting"):
        typer.echo(f"error: model '{model_id}' is {record.status}", err=True)
        raise typer.Exit(1)
    store.delete(mid)
    typer.echo(f"deleted {mid}")


@app.command()
def setup() -> None:
    """Register the default models (the bundled SmolLM2 chat model)."""
    from conch.inference.models.bundled import BUNDLED_ID, ensure_bundled_model
    from conch.inference.models.store import ModelStore

    store = _store()
    assert isinstance(store, ModelStore)
    record = ensure_bundled_model(store)
    if record is not None:
        typer.echo(f"ready: {record.id} ({record.path})")
    elif store.get(BUNDLED_ID) is None:
        typer.echo("the store already has a chat model; the bundled model was not registered")


def _register_acquire_commands() -> None:
    """``pull``, ``convert`` and the full ``setup`` come from the download/convert module."""
    try:
        from conch.cli import models_acquire
    except ImportError:
        return
    models_acquire.register(app)


_register_acquire_commands()
