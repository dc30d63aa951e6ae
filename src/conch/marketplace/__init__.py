"""The agent marketplace: publish immutable agent versions, search them, install them.

Domain code only (no web imports): :mod:`.records` validates and digests manifests,
:mod:`.versions` resolves npm-style ranges, :mod:`.service` stores, searches and installs,
:mod:`.federation` talks to an upstream conch server, :mod:`.catalogue` is the curated set a
fresh server starts with.
"""

from conch.marketplace.errors import MarketplaceError
from conch.marketplace.service import AgentSink, InstalledAgent, MarketplaceService

__all__ = ["AgentSink", "InstalledAgent", "MarketplaceError", "MarketplaceService"]
