"""The builtins of conch, one module per category; :mod:`.registry` holds them all."""

from conch.lang.builtins.registry import REGISTRY, Builtin, Example, all_builtins, builtin, lookup

__all__ = ["REGISTRY", "Builtin", "Example", "all_builtins", "builtin", "lookup"]
