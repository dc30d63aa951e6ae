"""conch.inference"""

# llama.cpp's libraries load before anything here can import numpy (see native.py).
from conch.inference.engines.llama.native import load_llama_first as _load_llama_first

_load_llama_first()
