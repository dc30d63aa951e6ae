"""Request and response bodies of the agent and code-execution server (docs/agent-server.md).

Request models are strict (a number is not a string) and ignore unknown fields; response
models exist for the OpenAPI document — handlers write the JSON themselves. The run envelope
is :mod:`conch.sandbox.envelope`, the one shape the worker, the pool and the routes share. Routes parse
their bodies with :func:`parse_body` and document them with :func:`request_body`.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class RunLimits(_Request):
    """Per-request limits. Each may only lower the server's configured limit; a larger
    value is ignored."""

    wall_time_s: float | None = Field(default=None, gt=0, description="wall-clock seconds")
    steps: int | None = Field(default=None, ge=1, description="evaluation steps")
    recursion: int | None = Field(default=None, ge=1, description="call depth")
    output_bytes: int | None = Field(default=None, ge=0, description="printed and result bytes")
    collection_size: int | None = Field(default=None, ge=0, description="elements of an Array")

    def requested(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


def _session_field() -> Any:
    return Field(
        default=None,
        min_length=1,
        max_length=64,
        description="a session's id (POST /api/v1/sessions): the run sees and makes its "
        "bindings, in its workspace, after its earlier runs; the answer adds `unsaved`",
    )


class ExecuteRequest(_Request):
    command: str = Field(description="a conch command, e.g. `ls | where(fn(f) => f.size > 1kb)`")
    limits: RunLimits | None = None
    session: str | None = _session_field()


class EvalRequest(_Request):
    code: str = Field(description="a conch program: an expression or statements")
    limits: RunLimits | None = None
    session: str | None = _session_field()


class CallRequest(_Request):
    args: list[Any] = Field(
        default_factory=list,
        description="positional arguments; a Function parameter takes conch source "
        'such as "fn(x) => x * 2"',
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="arguments by name")
    limits: RunLimits | None = None
    session: str | None = _session_field()


class PipelineRequest(_Request):
    input: Any = Field(default=None, description="the value entering the first step")
    steps: list[str] = Field(
        description='pipeline stage expressions, e.g. ["map(fn(x) => x * 2)", "sum"]'
    )
    limits: RunLimits | None = None
    session: str | None = _session_field()


class AnalyseRequest(_Request):
    code: str = Field(max_length=200_000, description="a conch program, as it is being edited")
    line: int | None = Field(default=None, ge=1, description="the cursor's 1-based line")
    column: int | None = Field(default=None, ge=1,
                               description="the cursor's 1-based column (code points)")


class AnalysedProblem(BaseModel):
    """A diagnostic; positions 1-based, the end exclusive, columns in code points."""

    kind: str  # SyntaxError, NameError, TypeError
    message: str
    hint: str | None = None
    severity: str  # error | warning
    line: int
    column: int
    end_line: int
    end_column: int


class Completion(BaseModel):
    label: str
    kind: str  # function, variable, keyword, field, property
    detail: str = ""
    documentation: str = ""
    insert_text: str | None = None


class Signature(BaseModel):
    label: str
    documentation: str
    parameters: list[str]
    active_parameter: int


class Analysis(BaseModel):
    """What the language's front end finds without running anything: the problems, and at
    the cursor (when given) the completions, the hover text and the call's signature."""

    diagnostics: list[AnalysedProblem]
    completions: list[Completion] = Field(default_factory=list)
    hover: str | None = None
    signature: Signature | None = None


class RequestErrorInfo(BaseModel):
    kind: str = Field(description='"RequestError" (or "NameError" for an unknown builtin)')
    message: str
    hint: str | None = None


class RequestErrorBody(BaseModel):
    success: bool = False
    error: RequestErrorInfo


class SandboxLayer(BaseModel):
    active: bool
    detail: str


class SandboxReport(BaseModel):
    mode: str  # strict | best-effort | off
    layers: dict[str, SandboxLayer]  # landlock, seccomp, user, limits


class Health(BaseModel):
    status: str = "healthy"
    version: str
    uptime_seconds: int
    sandbox: SandboxReport | None = None  # with ?detail=true


class BuiltinSummary(BaseModel):
    name: str
    description: str
    category: str


class Parameter(BaseModel):
    name: str
    type: str
    required: bool
    default: Any = None
    variadic: bool = False


class BuiltinDetail(BuiltinSummary):
    signature: str
    examples: list[str]
    parameters: list[Parameter]
    returns: str
    effect: str
    aliases: list[str]


class TypeInfo(BaseModel):
    name: str
    description: str
    json_: dict[str, Any] = Field(alias="json")
    properties: dict[str, str]


ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": RequestErrorBody, "description": "Malformed request"},
    413: {"model": RequestErrorBody, "description": "Body too large"},
}

UNKNOWN_BUILTIN: dict[int | str, dict[str, Any]] = {
    404: {"model": RequestErrorBody, "description": "No such builtin"}
}

REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    ExecuteRequest,
    EvalRequest,
    CallRequest,
    PipelineRequest,
)


def request_body(model: type[BaseModel], *, inline: bool = False) -> dict[str, Any]:
    """The OpenAPI request body of a route that parses its body itself (``openapi_extra``):
    a ``$ref`` to a model of :data:`REQUEST_MODELS`, or with ``inline`` the model's own schema."""
    schema = model.model_json_schema() if inline else {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


M = TypeVar("M", bound=BaseModel)


async def parse_body(request: Request, model: type[M]) -> M:
    """The body as ``model``, parsed as JSON whatever the Content-Type says (``curl -d``
    sends a form type); any problem is a ``400 RequestError`` naming the field."""
    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None
