"""Wire models of the inference server: OpenAI-compatible requests and responses.

Kept apart from the serving logic (as vLLM's ``entrypoints/openai/protocol.py`` is) so the
OpenAPI document is generated from exactly what is validated and returned. Domain code (the
serving layer) takes these models in, so they live in ``conch.inference``, not ``conch.web``. Requests ignore
unknown fields, as OpenAI clients send fields a local server has no use for.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- errors --------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


# -- chat ----------------------------------------------------------------------------------
class TextContentPart(_Request):
    type: Literal["text"]
    text: str


class ImageURL(_Request):
    url: str = Field(description="A data: URL (base64), a file:// URL inside the data directory, "
                                 "or an http(s) URL (only with allow_network).")
    detail: Literal["auto", "low", "high"] | None = Field(
        default=None, description="'auto' and 'high': the projector's own resolution; 'low' is refused.")


class ImageContentPart(_Request):
    type: Literal["image_url"]
    image_url: ImageURL
    # Set by the Anthropic and Ollama translations: their request field the image came from
    # (named in errors instead of this part's).
    source_param: SkipJsonSchema[str | None] = None


ContentPart = Annotated[TextContentPart | ImageContentPart, Field(discriminator="type")]


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class StreamOptions(_Request):
    include_usage: bool = False


class JSONSchemaSpec(_Request):
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormatText(_Request):
    type: Literal["text"]


class ResponseFormatJSONObject(_Request):
    type: Literal["json_object"]


class ResponseFormatJSONSchema(_Request):
    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJSONObject | ResponseFormatJSONSchema,
    Field(discriminator="type"),
]


class FunctionDefinition(_Request):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_Request):
    model: str = Field(min_length=1, description="A local model id, or `local:<id>`.")
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0, le=2, description="Default 0.7.")
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1, description="Default: up to the context length.")
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(default=None)
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=16)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    keep_alive: float | str | None = Field(
        default=None,
        description="How long the model stays loaded after this request (seconds or '5m'); "
        "0 unloads at once, negative keeps it loaded.",
    )
    logprobs: bool = Field(default=False, description="Return each output token's log-probability.")
    top_logprobs: int | None = Field(default=None, ge=0, le=20, description="With logprobs: the k likeliest alternatives.")
    logit_bias: dict[str, float] | None = Field(default=None, description="Token id (as a string) -> bias, -100..100.")
    # Knowingly ignored: they change nothing a local model does.
    metadata: dict[str, Any] | None = Field(default=None, description="Accepted and ignored.")
    service_tier: str | None = Field(default=None, description="Accepted and ignored.")
    store: bool | None = Field(default=None, description="Accepted and ignored (nothing is stored).")
    # llama.cpp sampling beyond OpenAI's fields, as llama-server accepts them (Ollama's options map here).
    top_k: int | None = Field(default=None, ge=0, description="llama.cpp extension.")
    min_p: float | None = Field(default=None, ge=0, le=1, description="llama.cpp extension.")
    typical_p: float | None = Field(default=None, gt=0, le=1, description="llama.cpp extension.")
    repeat_penalty: float | None = Field(default=None, ge=0, description="llama.cpp extension.")
    repeat_last_n: int | None = Field(default=None, ge=-1, description="llama.cpp extension (-1: the whole context).")
    # OpenAI fields conch does not implement: declared so a request using them is refused
    # with a 400 naming the field instead of being silently served without them.
    audio: Any = Field(default=None, description="Not supported (400).")
    modalities: Any = Field(default=None, description="Only [\"text\"] is supported.")
    prediction: Any = Field(default=None, description="Not supported (400).")
    web_search_options: Any = Field(default=None, description="Not supported (400).")
    reasoning_effort: Any = Field(default=None, description="Not supported (400).")
    verbosity: Any = Field(default=None, description="Not supported (400).")
    functions: Any = Field(default=None, description="Deprecated by OpenAI; use tools (400).")
    function_call: Any = Field(default=None, description="Deprecated by OpenAI; use tool_choice (400).")


# Declared on the request above only to be refused by name.
UNSUPPORTED_CHAT_FIELDS = ("audio", "prediction", "web_search_options", "reasoning_effort", "verbosity",
                           "functions", "function_call")


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobEntry] | None
    refusal: list[TokenLogprobEntry] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None
    refusal: str | None = None


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str | None = None


class ToolCallDeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallDeltaFunction | None = None


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChoiceDelta
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


# -- embeddings ------------------------------------------------------------------------------
class EmbeddingRequest(_Request):
    # Optional, unlike OpenAI's: without it the default embedding model (all-minilm-l6-v2) answers.
    model: str | None = Field(default=None, min_length=1)
    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="Text, texts, tokens, or arrays of tokens."
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    keep_alive: float | str | None = None


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


# -- models ----------------------------------------------------------------------------------
class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    capabilities: list[Literal["chat", "embeddings", "tools", "vision"]] = Field(
        default_factory=list,
        description='What the model can serve; [] for a source-format model that must be converted first. '
                    '"tools": a chat model whose chat template takes tools; "vision": a chat model with a '
                    'projector (mmproj), which reads images (docs/inference.md).')


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class ModelPlacement(BaseModel):
    """Where a loaded model runs (docs/gpu.md)."""

    device: str = Field(description='"cpu", or the GPU backend and the GPUs\' names')
    offload: Literal["full", "partial", "none"]
    n_gpu_layers: int = Field(description="layers on the GPU")
    n_layers: int | None
    vram_bytes: int | None = Field(description="GPU memory the model took when it loaded")
    note: str = Field(description="why it runs where it runs (the load's log line)")


class ModelFootprint(BaseModel):
    """The memory a model takes loaded (docs/inference.md, "Many models under a memory budget")."""

    bytes: int = Field(description="what the memory budget counts for it: measured_bytes once known, "
                                   "else estimated_bytes")
    estimated_bytes: int = Field(description="estimated from its file before loading: weights + KV cache "
                                             "at its context + compute buffers")
    measured_bytes: int | None = Field(description="what llama.cpp allocated for it when it loaded (and for "
                                                   "contexts it opened later); null until it has loaded "
                                                   "with these settings")
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    gpu_bytes: int | None = Field(default=None, description="of measured_bytes, on a GPU (while loaded)")
    n_ctx: int | None = Field(default=None, description="tokens one request may hold")
    kv_cells: int | None = Field(default=None, description="KV cache cells of the context, all sequences together")


class ModelDetails(Model):
    status: Literal["ready", "downloading", "converting", "failed"]
    format: Literal["gguf", "safetensors", "onnx"]
    path: str
    size_bytes: int
    sha256: str | None
    architecture: str | None
    context_length: int | None
    quantization: str | None
    capabilities: list[Literal["chat", "embeddings", "tools", "vision"]]
    source: str | None
    revision: str | None
    files: list[str]
    converted_from: str | None
    progress: float | None
    loaded: bool
    placement: ModelPlacement | None = Field(default=None, description="where it runs, while loaded")
    footprint: ModelFootprint | None = Field(
        default=None, description="its memory, loaded or as loading it would take (null for a model that "
                                  "cannot serve: a source format, or not ready)")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="its model_overrides (the load settings set for it; the others "
                                          "are the server's)")
    expires_at: str | None = Field(default=None, description="while loaded: when keep_alive unloads it "
                                                             "(ISO 8601; null: kept loaded)")


class ModelDeleted(BaseModel):
    id: str
    object: Literal["model"] = "model"
    deleted: bool


# -- providers, storage, health ----------------------------------------------------------------
class Provider(BaseModel):
    id: str
    status: Literal["available", "unavailable"]
    url: str | None = None


class ProviderValidation(BaseModel):
    provider: str
    valid: bool
    latency_ms: int
    models_available: int
    error: str | None = Field(default=None, description="Why it is not valid (absent when it is).")


class StorageStats(BaseModel):
    total_size_bytes: int
    model_count: int
    cache_size_bytes: int
    storage_path: str


class CleanupResult(BaseModel):
    freed_bytes: int
    removed: list[str]


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class GpuStatus(BaseModel):
    index: int
    name: str
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    process_used_bytes: int | None = Field(description="this server's share of memory_used_bytes")
    source: str = Field(description="where the memory figures come from: nvml, nvidia-smi or llama.cpp")


class DeviceStatus(BaseModel):
    device: str = Field(description='"cpu", or the GPU backend and the GPUs\' names')
    backend: str = Field(description="the GPU backend llama.cpp was built with, or cpu")
    gpu_offload: bool
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    gpus: list[GpuStatus]


class MemoryStatus(BaseModel):
    """The models' memory budget (memory_budget_mb) and what the loaded models take of it."""

    budget_bytes: int
    used_bytes: int
    free_bytes: int
    basis: str = Field(description="where the budget came from: the setting, or the free memory at start")


class Status(BaseModel):
    status: Literal["running"] = "running"
    version: str
    uptime_seconds: int
    providers: dict[str, Literal["connected", "configured"]]
    models_loaded: int
    requests_served: int
    device: DeviceStatus | None = None
    memory: MemoryStatus | None = None

