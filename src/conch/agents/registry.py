"""The names the ``agent`` builtin imports from here (``conch.lang.builtins.agent``); the
agents live in :mod:`conch.orchestration.agents`. This package goes when the language
reaches its host through a port instead of importing orchestration."""

from conch.orchestration.agents import DEFAULT_PROMPT, default_tools, qualified_model

__all__ = ["DEFAULT_PROMPT", "default_tools", "qualified_model"]
