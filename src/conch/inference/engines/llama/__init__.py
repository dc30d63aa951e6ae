"""The llama.cpp engine (GGUF models): chat, completion and embeddings (``engine.LlamaEngine``).

Nothing is imported here: ``native.py`` must load llama.cpp's libraries before numpy, and
importing the engine would import numpy first.
"""
