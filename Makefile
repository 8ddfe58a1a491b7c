# `make run` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-all bench bench-quick peers lint clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

run: install
	$(PY) -m kernel run plans/cartpole.toml

test: install
	$(PY) -m pytest -q -m "not slow" tests

test-all: install
	$(PY) -m pytest -q tests

# The peer libraries of perf/compare_peers.py, each in its own venv (idempotent; a peer that
# fails to install is reported and skipped by the comparison, not the end of the benchmarks).
peers:
	-bash perf/peers/setup.sh

# Measures everything (hours, peers included) and renders perf/RESULTS.md from perf/results/.
bench: install peers
	$(PY) perf/run_all.py

# Every benchmark at its smallest (under 15 minutes), into runs/bench-quick/ (results and a
# RESULTS.md), never over the published numbers; peers are used where `make peers` installed them.
bench-quick: install
	$(PY) perf/run_all.py --quick

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs .pytest_cache
