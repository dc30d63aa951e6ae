"""Model lifecycle: the store of models on disk, getting them (sources, conversion), the
bundled model, and what a model file says about itself."""
