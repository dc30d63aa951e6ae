"""The llama.cpp engine (GGUF models): chat, completion and embeddings."""

from conch.inference.engines.llama.engine import LlamaEngine

__all__ = ["LlamaEngine"]
