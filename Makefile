# flashfeed: two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# The CPU build of torch: CI and developer machines have no GPU.
TORCH  ?= torch==2.13.0

# Peers of the benchmark suite live in their own environment (benchmarks/requirements.txt),
# layered over the product's: the product's dependencies never change for a benchmark.
BENCH_VENV  ?= .bench-venv
BENCH_PY    := $(BENCH_VENV)/bin/python
BENCH_STAMP := $(BENCH_VENV)/.installed

.PHONY: help venv demo test test-fast lint format bench bench-quick bench-venv bench-corpus clean system-tools

help:
	@echo "make demo   - start a local object store, build a sample corpus, run ingest -> warm -> load"
	@echo "make test   - run the test suite (real SeaweedFS, real Ray, real DALI on CPU)"
	@echo "make lint   - ruff + mypy"
	@echo "make bench  - every benchmark vs peers and limits -> benchmarks/results, BENCHMARKS.md"
	@echo "make bench-quick - the same at smoke-check sizes (about 7 minutes on 2 cores)"
	@echo "make clean  - remove the venv and build outputs"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[dev]"
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# Programs the monitoring tests drive (a terminal, a Prometheus server, a browser): installed
# with apt when missing and running as root; never fails the build (the tests then skip,
# saying what is missing).
SYSTEM_TOOLS := tmux prometheus chromium

system-tools:
	@missing=""; for tool in $(SYSTEM_TOOLS); do \
		command -v "$$tool" >/dev/null 2>&1 || missing="$$missing $$tool"; \
	done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing$$missing (apt-get)"; \
		( apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq $$missing ) >/dev/null 2>&1 \
			|| echo "could not install$$missing: the tests that need them will skip"; \
	fi; true

test: $(STAMP) system-tools
	$(PY) -m pytest -q -ra tests

lint: $(STAMP)
	$(VENV)/bin/ruff check flashfeed ingest cache loader monitor benchmarks examples tests
	$(VENV)/bin/ruff format --check flashfeed ingest cache loader monitor benchmarks examples tests
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format flashfeed ingest cache loader monitor benchmarks examples tests
	$(VENV)/bin/ruff check --fix flashfeed ingest cache loader monitor benchmarks examples tests

$(BENCH_STAMP): benchmarks/requirements.txt $(STAMP)
	@test -x $(BENCH_PY) || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PY) -m pip install -q -r benchmarks/requirements.txt
	$(PY) -c 'import sysconfig; print("import site; site.addsitedir(%r)" % sysconfig.get_paths()["purelib"])' \
		> "$$($(BENCH_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/flashfeed-product.pth"
	@touch $(BENCH_STAMP)

bench-venv: $(BENCH_STAMP)

# The benchmark corpus is cut from real photographs in two Debian wallpaper packages
# (benchmarks/harness/corpus.py): installed with apt when missing and running as root.
PHOTO_PACKAGES := mate-backgrounds plasma-workspace-wallpapers

bench-corpus:
	@if [ ! -d /usr/share/backgrounds/mate/nature ] && [ "$$(id -u)" = 0 ] \
		&& command -v apt-get >/dev/null 2>&1; then \
		echo "installing $(PHOTO_PACKAGES) (apt-get): the benchmark's photographs"; \
		( apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq $(PHOTO_PACKAGES) ) >/dev/null 2>&1 \
			|| echo "could not install $(PHOTO_PACKAGES): the image stages will say what is missing"; \
	fi; true

bench: $(BENCH_STAMP) bench-corpus
	$(PY) -m benchmarks.suite --peer-python $(BENCH_PY)

bench-quick: $(BENCH_STAMP) bench-corpus
	$(PY) -m benchmarks.suite --quick --peer-python $(BENCH_PY)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
