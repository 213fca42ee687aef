# flashfeed: two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# The CPU build of torch: CI and developer machines have no GPU.
TORCH  ?= torch==2.13.0

.PHONY: help venv demo test test-fast lint format bench clean

help:
	@echo "make demo   - start a local object store, build a sample corpus, run ingest -> warm -> load"
	@echo "make test   - run the test suite (real SeaweedFS, real Ray, real DALI on CPU)"
	@echo "make lint   - ruff + mypy"
	@echo "make clean  - remove the venv and build outputs"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[dev]"
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m flashfeed.demo

test: $(STAMP)
	$(PY) -m pytest -q -ra tests

lint: $(STAMP)
	$(VENV)/bin/ruff check flashfeed ingest cache loader benchmarks tests
	$(VENV)/bin/ruff format --check flashfeed ingest cache loader benchmarks tests
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format flashfeed ingest cache loader benchmarks tests
	$(VENV)/bin/ruff check --fix flashfeed ingest cache loader benchmarks tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
