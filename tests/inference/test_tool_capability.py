"""Which local models are listed with the ``tools`` capability: a chat model whose chat template
refers to tools (``gguf_info.template_uses_tools``), in ``/v1/models`` and Ollama's ``/api/show``."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from conch.inference.api import ollama as o
from conch.inference.models.gguf_info import read_gguf_info, template_uses_tools
from conch.inference.models.store import ModelRecord

# The bundled SmolLM2-135M-Instruct's template (tokenizer.chat_template): plain ChatML, no tools.
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Qwen2.5-style: tools listed in the system turn, calls as <tool_call> tags, results as the tool role.
QWEN = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}"
    "{{- tool | tojson }}{%- endfor %}{{- '</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if message.role == \"tool\" %}{{- '<tool_response>' }}"
    "{%- elif message.tool_calls %}{%- for tool_call in message.tool_calls %}{{- '<tool_call>' }}"
    "{%- endfor %}{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content }}"
    "{%- endif %}{%- endfor %}"
)


@pytest.mark.parametrize(
    ("template", "tools"),
    [
        (None, False),
        ("", False),
        (SMOLLM2, False),
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", False),
        ("A toolbox of {{ messages|length }} toolsmiths", False),  # words that merely contain "tool"
        (QWEN, True),
        ("{% if tools %}{{ tools|tojson }}{% endif %}", True),  # the `tools` variable
        ("{% if message['tool_calls'] %}call{% endif %}", True),  # an assistant message's calls
        ("{{ '<tool_call>' }}", True),  # the Hermes tag
        ("{% if message['role'] == 'tool' %}result{% endif %}", True),  # the tool role
    ],
)
def test_template_uses_tools(template: str | None, tools: bool) -> None:
    assert template_uses_tools(template) is tools


def _tiny_gguf(path: Path, arch: str, template: str | None) -> Path:
    """A metadata-only GGUF (no tensors): all that registering a model reads."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(2048)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


def test_gguf_capabilities_follow_the_template(tmp_path: Path, smollm2_path: Path) -> None:
    assert read_gguf_info(smollm2_path).capabilities == ["chat", "embeddings"]  # the bundled model: no tools
    assert read_gguf_info(_tiny_gguf(tmp_path / "q.gguf", "llama", QWEN)).capabilities == ["chat", "embeddings", "tools"]
    assert read_gguf_info(_tiny_gguf(tmp_path / "s.gguf", "llama", SMOLLM2)).capabilities == ["chat", "embeddings"]
    assert read_gguf_info(_tiny_gguf(tmp_path / "n.gguf", "llama", None)).capabilities == ["chat", "embeddings"]
    # An encoder cannot chat, so it takes no tools whatever its metadata says.
    assert read_gguf_info(_tiny_gguf(tmp_path / "b.gguf", "bert", QWEN)).capabilities == ["embeddings"]


def test_ollama_show_lists_tools_as_the_record_does() -> None:
    plain = ModelRecord(id="smol", path="/x/smol.gguf", capabilities=["chat", "embeddings"])
    tooled = ModelRecord(id="qwen", path="/x/qwen.gguf", capabilities=["chat", "embeddings", "tools"])
    embedder = ModelRecord(id="bge", path="/x/bge.gguf", capabilities=["embeddings"])
    assert o.capabilities(plain) == ["completion", "embedding"]
    assert o.capabilities(tooled) == ["completion", "tools", "embedding"]
    assert o.capabilities(tooled, fim=True) == ["completion", "tools", "insert", "embedding"]
    assert o.capabilities(embedder) == ["embedding"]
