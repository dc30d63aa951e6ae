"""Chat templates: the Jinja template a GGUF file carries, rendered in a sandbox.

The template (``tokenizer.chat_template`` in the GGUF metadata, ChatML when absent) turns
plain role/content messages into the prompt text the model was tuned on; tools and tool
traffic arrive already written as text (``conch.inference.engines.tool_calls``).
"""

from __future__ import annotations

import json
from typing import Any

from conch.inference.engines.base import EngineError

DEFAULT_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str, eos_token: str) -> None:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise EngineError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(
            loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
            extensions=["jinja2.ext.loopcontrols"],
        )
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
        self._template = env.from_string(source)
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        return str(
            self._template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        )
