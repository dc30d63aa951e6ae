"""Request and response bodies of the agent and code-execution server (SPEC §2.1, §2.2, §2.6).

Request models are strict (a number is not a string) and ignore unknown fields; response
models exist for the OpenAPI document — handlers write the JSON themselves.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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


class ExecuteRequest(_Request):
    command: str = Field(description="a conch command, e.g. `ls | where(fn(f) => f.size > 1kb)`")
    limits: RunLimits | None = None


class EvalRequest(_Request):
    code: str = Field(description="a conch program: an expression or statements")
    limits: RunLimits | None = None


class CallRequest(_Request):
    args: list[Any] = Field(
        default_factory=list,
        description="positional arguments; a Function parameter takes conch source "
        'such as "fn(x) => x * 2"',
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="arguments by name")
    limits: RunLimits | None = None


class PipelineRequest(_Request):
    input: Any = Field(default=None, description="the value entering the first step")
    steps: list[str] = Field(
        description='pipeline stage expressions, e.g. ["map(fn(x) => x * 2)", "sum"]'
    )
    limits: RunLimits | None = None


class ErrorInfo(BaseModel):
    kind: str
    message: str
    line: int | None = None
    column: int | None = None
    hint: str | None = None


class Envelope(BaseModel):
    success: bool
    result: str | None = Field(description="string rendering of the value")
    type: str | None = Field(description="conch type name of the value")
    value: Any = Field(description="the value as JSON")
    output: list[str] = Field(description="lines printed by the program")
    error: ErrorInfo | None
    elapsed_ms: int


class StepTiming(BaseModel):
    step: int = Field(description="1-based index of the step")
    type: str
    elapsed_ms: int


class PipelineEnvelope(Envelope):
    steps: list[StepTiming]


class RequestErrorInfo(BaseModel):
    kind: str = Field(description='"RequestError" (or "NameError" for an unknown builtin)')
    message: str
    hint: str | None = None


class RequestErrorBody(BaseModel):
    success: bool = False
    error: RequestErrorInfo


class Health(BaseModel):
    status: str = "healthy"
    version: str
    uptime_seconds: int


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
