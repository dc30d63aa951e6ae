"""The ``agent`` builtin (category ``ai``): run an agent loop from conch code.

``agent({goal, tools, max_steps, model?})`` has the run's host (:mod:`conch.lang.host`) run an
agent loop: the model is asked for one action at a time, and each tool call runs as a builtin
call of this run (in the server that is the sandbox worker running the program, under the
request's limits). It returns ``{id, status, result, steps, error}``. In the server the run is
recorded as an orchestration task (``origin: "builtin"``), so it appears in
``GET /orchestration/tasks``; the shell records nothing.
"""

from __future__ import annotations

from typing import Any

from conch.lang.builtins.registry import Example, builtin, lookup
from conch.lang.builtins.types import Record
from conch.lang.context import Context, current, using
from conch.lang.errors import ConchError, from_python
from conch.lang.host import require
from conch.lang.values import render

_FIELDS = ("goal", "tools", "max_steps", "model", "agent")


def _spec(spec: dict[str, Any]) -> tuple[str, list[str] | None, int, str | None]:
    """The call's goal, tools (None: the host's default agent's), step budget and model."""
    extra = sorted(set(spec) - set(_FIELDS))
    if extra:
        raise ConchError(
            "ValueError",
            f"agent: unknown field {', '.join(extra)}",
            hint=f"fields: {', '.join(_FIELDS)}",
        )
    goal = spec.get("goal")
    if not isinstance(goal, str) or not goal:
        raise ConchError("TypeError", "agent: `goal` must be a non-empty String")
    tools = spec.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
            raise ConchError("TypeError", "agent: `tools` must be an Array of builtin names")
        unknown = [t for t in tools if lookup(t) is None]
        if unknown:
            raise ConchError("NameError", f"agent: unknown tool {', '.join(map(repr, unknown))}")
        tools = list(tools)
    max_steps = spec.get("max_steps", 10)
    if type(max_steps) is not int or max_steps < 0:
        raise ConchError("TypeError", "agent: `max_steps` must be a non-negative Int")
    model = spec.get("model")
    if model is not None and not isinstance(model, str):
        raise ConchError("TypeError", 'agent: `model` must be a String like "local:NAME"')
    return goal, tools, max_steps, model


class _Tools:
    """The model's tool calls as builtin calls of the run that called ``agent``: in its
    context, whichever thread the host runs its loop on."""

    __slots__ = ("ctx",)

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def __call__(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        b = lookup(name)
        assert b is not None
        try:
            with using(self.ctx):
                value = b.fn(**args)
        except ConchError as exc:
            return {"success": False, "error": {"kind": exc.kind, "message": exc.message}}
        except Exception as exc:
            err = from_python(exc)
            return {"success": False, "error": {"kind": err.kind, "message": err.message}}
        return {"success": True, "result": render(value)}


@builtin(
    "agent",
    category="ai",
    effect="model",
    returns="Record",
    description="Run an agent loop: the model reaches `goal` by calling the `tools` (builtin "
    "names) one JSON action at a time, at most `max_steps` steps. Returns `{id, status, "
    "result, steps, error}`; `status` is `succeeded` or `failed` (`error.kind` LimitError "
    "when the steps run out). Optional `model` (`provider:name`, default: the configured "
    "default model).",
    examples=[
        Example('agent({goal: "Answer at once", tools: ["len"], max_steps: 0}).status', "failed"),
        Example(
            'agent({goal: "Answer at once", tools: [], max_steps: 0}).error.kind', "LimitError"
        ),
    ],
)
def agent(spec: Record) -> dict[str, Any]:
    goal, tools, max_steps, model = _spec(spec)
    ctx = current()
    host = require(ctx.host, "agent", "run an agent")
    return host.run_agent(goal=goal, tools=tools, max_steps=max_steps, model=model,
                          deadline=ctx.deadline, call_tool=_Tools(ctx))
