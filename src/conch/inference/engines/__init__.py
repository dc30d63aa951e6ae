"""Model runtimes behind one seam (``base.Engine``); ``load.load_engine`` picks one per format.

Nothing is imported here: ``conch.inference`` maps llama.cpp's libraries through
``engines/llama/native.py`` before anything can import numpy, so the packages on that path
stay empty.
"""
