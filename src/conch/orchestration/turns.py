"""What the agent loop trades with the model and the tools: a model's reply, a tool call's
result, and the ways a turn ends early.

Shared by the loop (:mod:`.loop`), its two tool-call protocols (:mod:`.protocols`), the
model client (:mod:`.models`) and the checkpoint reader (:mod:`.checkpoints`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

# The kinds of a failed or cancelled task's ``error`` (``{kind, message, ...}``), and what
# each means (docs/orchestration.md, "Task errors"). A step's ``error`` is a tool call's:
# the builtin's own kind (``FileNotFoundError``, ...), ``NameError``/``TypeError`` for a
# call that was not run, ``PermissionError`` (denied), ``RejectedError`` (a person).
TASK_ERRORS = {
    "LimitError": "no final answer within max_steps model turns",
    "StuckError": "the model repeated a tool call that failed the same way (same tool, "
    "arguments and error) and was stopped early: `call`, `count` and `error` say which",
    "ProviderError": "the model server failed, stayed away for longer than model_retry_s, "
    "or its replies were not actions even after a corrective retry",
    "InterruptedError": "the server running the task stopped and the task cannot be "
    "resumed (`reason: interrupted`)",
    "CancelledError": "the task was cancelled",
    "InternalError": "a bug in the agent server",
}


class ModelError(Exception):
    """The model could not be reached or answered with something that is not a completion."""


class ModelUnavailable(ModelError):
    """The model server, or the provider behind it, is not up: no connection, or an answer
    that says so (502, 503, 504). Worth asking again a little later."""


class ToolsUnsupported(ModelError):
    """The model server refused a request carrying ``tools``: the model has no tool support
    (the JSON-action protocol is used for it from then on)."""


class Interrupt(Exception):
    """Raised by a call function: these calls wait for a person's decision, and the loop
    stops here (to be resumed from the task's checkpoint once they are decided)."""

    def __init__(self, pending: list[dict[str, Any]]) -> None:
        super().__init__(f"{len(pending)} tool call(s) wait for approval")
        self.pending = pending


@dataclass
class Reply:
    text: str
    usage: dict[str, int] = field(default_factory=dict)
    # Native protocol: the reply's tool calls ``{id, name, arguments}`` (arguments as the
    # model wrote them: a JSON string), in order; None for a reply without any.
    tool_calls: list[dict[str, str]] | None = None


@dataclass
class ToolResult:
    """What the model is told a tool call came to. ``args``: the arguments the call ran
    with, when they are not the model's (a person edited them)."""

    observation: str
    error: dict[str, Any] | None = None
    args: dict[str, Any] | None = None


def call_id(index: int, k: int | None = None) -> str:
    """The id of a tool call of step ``index``: ``call_{index}`` for the one call of a step,
    ``call_{index}_{k}`` for the ``k``-th of several calls in one model turn (native)."""
    return f"call_{index}" if k is None else f"call_{index}_{k}"


# (messages, the protocol's constraint: a JSON Schema of an action, or the API's ``tools``)
ChatFn = Callable[[list[dict[str, Any]], Any], Awaitable[Reply]]
ToolFn = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
# A tool call of step ``index``: (index, tool, args, call id) -> what the model is told.
CallFn = Callable[[int, str, dict[str, Any], str], Awaitable[ToolResult]]
StepFn = Callable[[dict[str, Any]], Awaitable[None]]


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"… [truncated, {len(text) - limit} more characters]"


def observation_of(envelope: dict[str, Any], limit: int) -> tuple[str, dict[str, Any] | None]:
    """The text the model sees for a tool's result envelope, and the error if it failed."""
    if envelope.get("success"):
        result = envelope.get("result")
        return truncate("" if result is None else str(result), limit), None
    err = envelope.get("error") or {}
    error = {"kind": err.get("kind", "Error"), "message": err.get("message", "")}
    return truncate(f"{error['kind']}: {error['message']}", limit), error


def add_usage(total: dict[str, int], usage: dict[str, int]) -> None:
    """Add a reply's token counts to ``total`` (only the counts the API defines)."""
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = usage.get(key)
        if isinstance(value, int):
            total[key] = total.get(key, 0) + value
