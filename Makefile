# `make run` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-all bench peers lint clean

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

bench: install peers
	$(PY) perf/run_all.py

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs .pytest_cache
