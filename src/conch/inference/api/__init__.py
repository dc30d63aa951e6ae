"""Wire models: what the inference server validates and returns."""
