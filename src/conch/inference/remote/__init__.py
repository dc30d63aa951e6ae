"""Remote model providers behind conch's OpenAI-compatible API.

One module per kind (``ollama``, ``openai_compat`` for OpenAI and every OpenAI-compatible
endpoint, ``anthropic``), one registry (``registry.py``) that routes model strings, probes
providers and caches their model lists; ``errors.py`` is what they raise. Each kind with a
wire format of its own reads that vendor's tables (stop reasons, options) from the inbound
dialect of the same vendor in ``conch.inference.api``. Domain code: no HTTP framework here.
"""
