"""The inference server's wire formats, pure (no I/O, no HTTP framework).

``openai.py`` holds the OpenAI API's request and response models (the OpenAPI document is
generated from them, as vLLM's ``protocol.py``). The other vendors' APIs are translations
onto OpenAI chat: ``anthropic.py`` (Messages), ``responses.py`` (OpenAI Responses),
``ollama.py`` (``/api/*``) and ``completions.py`` (legacy completions); ``dialect.py`` is
what they share (:class:`~conch.inference.api.dialect.TranslationError`) and ``stream.py``
the walk over a chat stream their stream translators share. A vendor's tables (stop
reasons, options) live in its module and the remote provider of the same vendor
(``conch.inference.remote``) reads them from there.
"""
