"""Approval policies: which tool calls of an agent task run, wait for a person, or are refused.

A policy is ``{"default": RULE, "effects": {EFFECT: RULE}, "tools": {BUILTIN: RULE}}`` with
``RULE`` one of ``allow``, ``ask``, ``deny`` and ``EFFECT`` one of the builtins' effects
(``pure read write network process model``); every part is optional. A call's rule is its
builtin's entry in ``tools``, else its effect's entry in ``effects``, else ``default``, else
``allow`` (the behaviour of a server without a policy). Effects and builtin names are kept
apart because they overlap (``write`` is both).

Policies stack: the server's (``approvals`` in the configuration), the agent's, then the
task's (or the workflow step's) — a later one overrides the same entries of an earlier one
and keeps the rest. A task records the resolved policy when it is created, so changing the
configuration or the agent later does not change a task already under way.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conch.lang.context import EFFECTS
from conch.orchestration.errors import Invalid

Rule = Literal["allow", "ask", "deny"]
Effect = Literal["pure", "read", "write", "network", "process", "model"]
assert set(Effect.__args__) == set(EFFECTS)  # type: ignore[attr-defined]

# Effects that a call may safely be run again for: it was running when its server died and
# no one can say whether it finished.
REPEATABLE = frozenset({"pure", "read"})


class ApprovalPolicy(BaseModel):
    """What happens to an agent's tool calls: ``allow`` (run), ``ask`` (wait for a person's
    approval) or ``deny`` (refused; the model sees an error). ``tools`` (builtin names) wins
    over ``effects``, which wins over ``default``."""

    model_config = ConfigDict(extra="forbid")

    default: Rule | None = None
    effects: dict[Effect, Rule] = Field(default_factory=dict)
    tools: dict[str, Rule] = Field(default_factory=dict)


def parse_policy(data: Any, where: str = "approvals") -> dict[str, Any]:
    """A policy from JSON-like data (``None``: the empty policy), checked; raises
    :class:`Invalid` naming the entry at fault."""
    if data is None:
        return {}
    if isinstance(data, ApprovalPolicy):
        policy = data
    else:
        try:
            policy = ApprovalPolicy.model_validate(data)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            place = ".".join([where, *(str(p) for p in err["loc"])])
            raise Invalid(f"{place}: {err['msg']}", where=place) from None
    from conch.lang.builtins.registry import lookup

    for name in policy.tools:
        if lookup(name) is None:
            raise Invalid(f"{where}.tools: unknown builtin {name!r}", where=f"{where}.tools.{name}")
    return policy.model_dump(exclude_none=True, exclude_defaults=True)


def merge(*policies: dict[str, Any] | None) -> dict[str, Any]:
    """Stack policies, later ones overriding the same entries of earlier ones."""
    out: dict[str, Any] = {}
    for policy in policies:
        if not policy:
            continue
        if policy.get("default") is not None:
            out["default"] = policy["default"]
        for part in ("effects", "tools"):
            if policy.get(part):
                out[part] = {**out.get(part, {}), **policy[part]}
    return out


def decide(policy: dict[str, Any] | None, tool: str, effect: str) -> tuple[str, str]:
    """``(rule, why)`` for one call of ``tool`` (whose effect is ``effect``)."""
    policy = policy or {}
    rule = (policy.get("tools") or {}).get(tool)
    if rule is not None:
        return rule, f"the approval policy says {rule!r} for the tool {tool!r}"
    rule = (policy.get("effects") or {}).get(effect)
    if rule is not None:
        return rule, f"the approval policy says {rule!r} for the effect {effect!r} (of {tool!r})"
    rule = policy.get("default")
    if rule is not None:
        return rule, f"the approval policy's default is {rule!r}"
    return "allow", "no approval policy applies"


# -- edited arguments ---------------------------------------------------------------------


def _fits(schema: dict[str, Any], value: Any) -> bool:
    """Whether ``value`` fits a parameter's JSON Schema (the subset builtins declare)."""
    if "anyOf" in schema:
        return any(_fits(s, value) for s in schema["anyOf"])
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind is None:
        return True
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
        "null": lambda v: v is None,
    }
    kinds = kind if isinstance(kind, list) else [kind]
    if not any(checks.get(k, lambda _v: True)(value) for k in kinds):
        return False
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return all(_fits(schema["items"], v) for v in value)
    return True


def check_call_args(tool: str, args: Any) -> tuple[str, str] | None:
    """``(where, message)`` when ``args`` (a person's edit of a call) do not fit the
    builtin's declared parameters, else None."""
    from conch.lang.builtins.registry import lookup
    from conch.lang.schema import parameters_schema

    if not isinstance(args, dict):
        return "args", "args: an object of parameter values by name is required"
    b = lookup(tool)
    if b is None:
        return "args", f"args: unknown tool {tool!r}"
    schema = parameters_schema(b)
    props: dict[str, Any] = schema.get("properties", {})
    for key in args:
        if key not in props:
            known = ", ".join(sorted(props)) or "none"
            return (
                f"args.{key}",
                f"args.{key}: {tool} has no parameter {key!r} (parameters: {known})",
            )
    for key in schema.get("required", []):
        if key not in args:
            return f"args.{key}", f"args.{key}: {tool} needs {key!r}"
    for key, value in args.items():
        if not _fits(props[key], value):
            expected = props[key].get("type") or "a value of its declared type"
            return (
                f"args.{key}",
                f"args.{key}: {value!r} does not fit {tool}'s parameter ({expected})",
            )
    return None
