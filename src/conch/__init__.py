"""conch: a typed, pipeline-oriented shell language, an agent and code-execution server,
and a local OpenAI-compatible model inference server."""

__version__ = "0.1.0"
