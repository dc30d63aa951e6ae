"""The orchestration agents: the built-in ``default``, registered ones and marketplace ones.

An agent is a system prompt, the builtins it may call (its capabilities) and a model. The
built-in ``default`` is computed from the builtin registry (every ``pure`` and ``read``
builtin) and the server's default model, so it follows the installed builtins; the others
live in the database (``orch_agents``), where the marketplace installs its agents.
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
    }


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

    def list(self) -> list[AgentSpec]:
        with self.db.read() as conn:
            rows = conn.execute(sa.select(t.agents).order_by(t.agents.c.id)).all()
        return [self._default(), *(self._spec(r) for r in rows if r.id != DEFAULT_AGENT)]

    def get(self, id: str) -> AgentSpec | None:
        if id == DEFAULT_AGENT:
            return self._default()
        with self.db.read() as conn:
            row = conn.execute(sa.select(t.agents).where(t.agents.c.id == id)).first()
        return self._spec(row) if row is not None else None

    def register(self, spec: AgentSpec) -> None:
        """Insert or replace. The built-in ``default`` cannot be replaced."""
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
            conn.execute(sa.delete(t.agents).where(t.agents.c.id == spec.id))
            conn.execute(sa.insert(t.agents).values(**row))

    def remove(self, id: str) -> bool:
        if id == DEFAULT_AGENT:
            raise ValueError("the built-in agent 'default' cannot be removed")
        with self.db.tx() as conn:
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
