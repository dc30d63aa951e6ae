"""Installed agents become orchestration agents: the :class:`AgentSink` over the agent
registry (``source = "marketplace"``, the installed version kept with it)."""

from __future__ import annotations

from conch.marketplace.errors import conflict
from conch.marketplace.service import InstalledAgent
from conch.orchestration.agents import AgentRegistry, AgentSpec


class RegistrySink:
    def __init__(self, registry: AgentRegistry) -> None:
        self.registry = registry

    def register(self, agent: InstalledAgent) -> None:
        spec = AgentSpec(
            id=agent.name,
            description=agent.description,
            system_prompt=agent.system_prompt,
            tools=list(agent.tools),
            model=agent.model,
            source="marketplace",
            version=agent.version,
        )
        try:
            self.registry.register(spec)
        except ValueError as exc:  # a reserved or invalid id
            raise conflict(f"cannot install {agent.name!r} as an agent: {exc}", "name") from None

    def remove(self, name: str) -> bool:
        try:
            return self.registry.remove(name)
        except ValueError:
            return False

    def is_busy(self, name: str) -> bool:
        return self.registry.is_busy(name)
