"""Workflow and task definitions: shapes, DAG validation and ``${…}`` interpolation.

Unknown fields are refused (a field that is accepted is honoured). Validation errors are
:class:`Invalid` with the place they concern (``steps[2].depends_on``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from conch.orchestration.approvals import ApprovalPolicy
from conch.orchestration.errors import Invalid

STEP_ID_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
REF_RE = re.compile(r"\$\{\s*([^}]*?)\s*\}")
MAX_RETRIES = 20


class TaskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    goal: str = Field(min_length=1)
    tools: list[str] | None = None
    max_steps: int = Field(default=10, ge=1, le=1000)
    agent: str | None = None
    model: str | None = None
    # Over the server's and the agent's policy (conch.orchestration.approvals).
    approvals: ApprovalPolicy | None = None
    # A call waiting for a person longer than this is rejected (default: the server's).
    approval_timeout_s: float | None = Field(default=None, gt=0)
    # The thread it continues: it starts from the conversation of the thread's last task.
    thread_id: str | None = Field(default=None, min_length=1, max_length=200)
    # The tool-call protocol: the model API's tools (native), JSON actions (json), or
    # native when the model supports tools (auto, the default).
    protocol: Literal["native", "json", "auto"] | None = None
    # The session its tool calls run in (POST /api/v1/sessions); a thread's tasks share one
    # by default.
    session: str | None = Field(default=None, min_length=1, max_length=64)


class StepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    run: str | None = None
    task: TaskRequest | None = None
    depends_on: list[str] = Field(default_factory=list)
    retries: int = Field(default=0, ge=0, le=MAX_RETRIES)
    timeout_s: float | None = Field(default=None, gt=0)
    # First retry waits this long, each next one twice as long (capped at 60 s).
    backoff_s: float = Field(default=1.0, ge=0, le=60)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not STEP_ID_RE.match(value):
            raise ValueError(
                "a step id starts with a letter or '_' and holds letters, digits, '_' or '-'"
            )
        return value


class WorkflowRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="workflow", min_length=1, max_length=200)
    inputs: dict[str, Any] = Field(default_factory=dict)
    steps: list[StepSpec] = Field(min_length=1, max_length=10_000)


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def parse_workflow(data: Any) -> WorkflowRequest:
    try:
        return WorkflowRequest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        raise Invalid(f"{_where(err['loc'])}: {err['msg']}", where=_where(err["loc"])) from None


@dataclass
class Plan:
    """A validated workflow: steps in order, with their dependencies both ways."""

    name: str
    inputs: dict[str, Any]
    steps: dict[str, StepSpec]
    order: list[str]
    deps: dict[str, list[str]]
    dependents: dict[str, list[str]] = field(default_factory=dict)
    ancestors: dict[str, list[str]] = field(default_factory=dict)

    def descendants(self, step_id: str) -> list[str]:
        seen: list[str] = []
        stack = list(self.dependents.get(step_id, []))
        while stack:
            s = stack.pop()
            if s not in seen:
                seen.append(s)
                stack.extend(self.dependents.get(s, []))
        return seen

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "inputs": self.inputs,
            # As submitted: the fields given (defaults are not filled in), in the given order.
            "steps": [self.steps[s].model_dump(exclude_unset=True) for s in self.steps],
        }


def plan(req: WorkflowRequest) -> Plan:
    """Check the DAG: unique ids, exactly one of run/task, known dependencies, no cycle,
    references only to ancestors. Raises :class:`Invalid`."""
    steps: dict[str, StepSpec] = {}
    for i, step in enumerate(req.steps):
        if step.id in steps:
            raise Invalid(f"steps[{i}].id: duplicate step id {step.id!r}", where=f"steps[{i}].id")
        if (step.run is None) == (step.task is None):
            raise Invalid(
                f"steps[{i}]: a step has exactly one of 'run' (conch code) or 'task' (an agent task)",
                where=f"steps[{i}]",
            )
        steps[step.id] = step
    for i, step in enumerate(req.steps):
        for dep in step.depends_on:
            if dep not in steps:
                raise Invalid(
                    f"steps[{i}].depends_on: unknown step id {dep!r}",
                    where=f"steps[{i}].depends_on",
                )
            if dep == step.id:
                raise Invalid(
                    f"steps[{i}].depends_on: step {step.id!r} depends on itself",
                    where=f"steps[{i}].depends_on",
                )
    deps = {s: list(dict.fromkeys(steps[s].depends_on)) for s in steps}
    order = _topological(deps, list(steps))
    dependents: dict[str, list[str]] = {s: [] for s in steps}
    for s, ds in deps.items():
        for d in ds:
            dependents[d].append(s)
    ancestors: dict[str, list[str]] = {}
    for s in order:
        acc: dict[str, None] = {}
        for d in deps[s]:
            acc.update(dict.fromkeys(ancestors[d]))
            acc[d] = None
        ancestors[s] = list(acc)
    out = Plan(req.name, req.inputs, steps, order, deps, dependents, ancestors)
    for i, step in enumerate(req.steps):
        if step.task is not None:
            for ref in REF_RE.findall(step.task.goal):
                _check_ref(ref, step.id, out, f"steps[{i}].task.goal")
    return out


def _topological(deps: dict[str, list[str]], ids: list[str]) -> list[str]:
    state: dict[str, int] = {}
    order: list[str] = []
    for root in ids:
        if root in state:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = []
        while stack:
            node, i = stack.pop()
            if i == 0:
                if state.get(node) == 2:
                    continue
                state[node] = 1
                path.append(node)
            children = deps[node]
            if i < len(children):
                stack.append((node, i + 1))
                child = children[i]
                if state.get(child) == 1:
                    cycle = [*path[path.index(child) :], child]
                    raise Invalid(f"steps: dependency cycle {' -> '.join(cycle)}", where="steps")
                if state.get(child) != 2:
                    stack.append((child, 0))
                continue
            state[node] = 2
            path.pop()
            order.append(node)
    return order


def _check_ref(ref: str, step_id: str, p: Plan, where: str) -> None:
    parts = ref.split(".")
    if parts[0] == "inputs":
        return
    if parts[0] == "steps" and len(parts) >= 2:
        if parts[1] not in p.steps:
            raise Invalid(f"{where}: ${{{ref}}} names an unknown step {parts[1]!r}", where=where)
        if parts[1] not in p.ancestors[step_id]:
            raise Invalid(
                f"{where}: ${{{ref}}} uses step {parts[1]!r}, which {step_id!r} does not depend on",
                where=where,
            )
        return
    raise Invalid(f"{where}: ${{{ref}}} must start with 'inputs.' or 'steps.'", where=where)


def lookup_path(scope: dict[str, Any], ref: str) -> Any:
    value: Any = scope
    for part in ref.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit():
            value = value[int(part)]
        else:
            raise KeyError(f"${{{ref}}}: no {part!r}")
    return value


def interpolate(text: str, scope: dict[str, Any]) -> str:
    """Replace every ``${path}`` with the value it names (strings as they are, other values
    as compact JSON)."""

    def sub(m: re.Match[str]) -> str:
        value = lookup_path(scope, m.group(1))
        if isinstance(value, str):
            return value
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    return REF_RE.sub(sub, text)
