"""The orchestration agents: the built-in ``default``, registered ones and marketplace ones.

An agent is a system prompt, the builtins it may call (its capabilities) and a model. The
built-in ``default`` is computed from the builtin registry (every ``pure`` and ``read``
builtin) and the server's default model, so it follows the installed builtins; the others
live in the database (``orch_agents``), where the marketplace installs its agents.

Tenants. A registered agent belongs to the tenant that registered it (``tenant``; ``None``:
the admin's). Readers that pass a ``tenant`` see the built-in agent, that tenant's agents and
the marketplace's (installed by the admin, for every tenant); ``None`` sees every agent.
Agent ids are one namespace: an id another tenant uses cannot be registered
(:class:`AgentTaken`), and only the admin replaces or removes a marketplace agent.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from conch.orchestration import tables as t
from conch.orchestration.store.base import Database

DEFAULT_AGENT = "default"
DEFAULT_PROMPT = (
    "You are a careful assistant that reaches a goal by calling tools. Call one tool at a "
    "time, read its result, and give the final answer as soon as you know it."
)
ID_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
SOURCES = ("builtin", "registered", "marketplace")


@dataclass
class AgentSpec:
    id: str
    description: str
    system_prompt: str
    tools: list[str]
    model: str
    source: str  # "builtin" | "registered" | "marketplace"
    version: str | None = None
    # Approval policy of its tasks' tool calls (conch.orchestration.approvals).
    approvals: dict[str, Any] | None = None
    tenant: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("extra")
        return out


def qualified_model(model: str) -> str:
    """``<provider>:<model_name>``: a bare model name is a local one."""
    return model if ":" in model else f"local:{model}"


def agent_record(spec: AgentSpec, busy: set[str]) -> dict[str, Any]:
    """An agent as the API shows it (``busy``: the agents with a pending or running task)."""
    return {
        "id": spec.id,
        "status": "busy" if spec.id in busy else "idle",
        "capabilities": list(spec.tools),
        "model": qualified_model(spec.model),
        "description": spec.description,
        "system_prompt": spec.system_prompt,
        "source": spec.source,
        "version": spec.version,
        "approvals": spec.approvals or {},
        "tenant": spec.tenant,
    }


class AgentTaken(ValueError):
    """The agent id is another tenant's (or the marketplace's, for a tenant)."""


def _seen(tenant: str | None) -> Any:
    """The agent rows ``tenant`` sees (``None``: all)."""
    a = t.agents
    if tenant is None:
        return sa.true()
    return sa.or_(a.c.tenant == tenant, a.c.source == "marketplace")


def default_tools() -> list[str]:
    """The builtins the ``default`` agent may call: every pure or read builtin."""
    from conch.lang.builtins.registry import all_builtins

    return sorted({b.name for b in all_builtins() if b.effect in ("pure", "read")})


class AgentRegistry:
    """Agents by id; the database is the source of truth (several servers may share it)."""

    def __init__(self, db: Database, default_model: str) -> None:
        self.db = db
        self.default_model = qualified_model(default_model)

    def _default(self) -> AgentSpec:
        return AgentSpec(
            id=DEFAULT_AGENT,
            description="The built-in agent: every pure and read builtin, the server's default model.",
            system_prompt=DEFAULT_PROMPT,
            tools=default_tools(),
            model=self.default_model,
            source="builtin",
        )

    @staticmethod
    def _spec(row: Any) -> AgentSpec:
        """The agent of an ``orch_agents`` row (its columns are AgentSpec's fields, and
        ``created_at``)."""
        fields = row._asdict()
        del fields["created_at"]
        return AgentSpec(**fields)

    def list(self, tenant: str | None = None) -> list[AgentSpec]:
        """The agents ``tenant`` sees (``None``: every agent)."""
        with self.db.read() as conn:
            rows = conn.execute(
                sa.select(t.agents).where(_seen(tenant)).order_by(t.agents.c.id)
            ).all()
        return [self._default(), *(self._spec(r) for r in rows if r.id != DEFAULT_AGENT)]

    def get(self, id: str, tenant: str | None = None) -> AgentSpec | None:
        """The agent, if ``tenant`` (``None``: any) sees it."""
        if id == DEFAULT_AGENT:
            return self._default()
        with self.db.read() as conn:
            row = conn.execute(
                sa.select(t.agents).where(t.agents.c.id == id, _seen(tenant))
            ).first()
        return self._spec(row) if row is not None else None

    def register(self, spec: AgentSpec, tenant: str | None = None) -> None:
        """Insert or replace. The built-in ``default`` cannot be replaced. ``tenant``: the
        registering tenant, who may replace only its own agents (:class:`AgentTaken`);
        ``None`` (the admin) replaces any, which keeps its tenant."""
        if spec.id == DEFAULT_AGENT:
            raise ValueError("the agent id 'default' is reserved for the built-in agent")
        if not ID_RE.match(spec.id):
            raise ValueError(
                f"invalid agent id {spec.id!r}: use lowercase letters, digits, '-', '_' or '.'"
            )
        if spec.source not in SOURCES:
            raise ValueError(f"invalid agent source {spec.source!r}")
        row = {**spec.to_dict(), "model": qualified_model(spec.model), "created_at": time.time()}
        with self.db.tx() as conn:
            old = conn.execute(
                sa.select(t.agents.c.tenant, t.agents.c.source).where(t.agents.c.id == spec.id)
            ).first()
            if old is not None:
                if tenant is not None and (old.tenant != tenant or old.source == "marketplace"):
                    raise AgentTaken(f"the agent id {spec.id!r} is taken; choose another")
                if tenant is None and spec.source == old.source:
                    row["tenant"] = old.tenant
            conn.execute(sa.delete(t.agents).where(t.agents.c.id == spec.id))
            conn.execute(sa.insert(t.agents).values(**row))

    def remove(self, id: str, tenant: str | None = None) -> bool:
        """Remove an agent ``tenant`` (``None``: the admin) may remove; False when it sees
        none of that id."""
        if id == DEFAULT_AGENT:
            raise ValueError("the built-in agent 'default' cannot be removed")
        with self.db.tx() as conn:
            old = conn.execute(
                sa.select(t.agents.c.tenant, t.agents.c.source).where(
                    t.agents.c.id == id, _seen(tenant)
                )
            ).first()
            if old is None:
                return False
            if tenant is not None and old.tenant != tenant:
                raise ValueError(f"the agent {id!r} is installed from the marketplace: the "
                                 "admin uninstalls it")
            return conn.execute(sa.delete(t.agents).where(t.agents.c.id == id)).rowcount > 0

    def busy_ids(self) -> set[str]:
        with self.db.read() as conn:
            rows = conn.execute(
                sa.select(t.tasks.c.agent)
                .where(t.tasks.c.status.in_(("pending", "running")))
                .distinct()
            ).all()
        return {r.agent for r in rows}

    def is_busy(self, id: str) -> bool:
        """A task of this agent is pending or running."""
        with self.db.read() as conn:
            row = conn.execute(
                sa.select(t.tasks.c.id)
                .where(t.tasks.c.agent == id, t.tasks.c.status.in_(("pending", "running")))
                .limit(1)
            ).first()
        return row is not None
