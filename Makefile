# `make run` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-all bench bench-quick boost boost-quick peers lint clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

run: install
	$(PY) -m kernel run plans/cartpole.toml

# The suite in TEST_JOBS processes (pytest-xdist), each test file whole on one of them so a
# module's expensive fixtures are built once. Most tests wait on real processes and servers,
# so two jobs halve its wall time on two cores; TEST_JOBS=1 runs it in one process.
TEST_JOBS ?= 2

test: install
	$(PY) -m pytest -q -m "not slow" -n $(TEST_JOBS) --dist loadfile tests

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

# The boosting experiment (docs/boosting.md): the paper's protocol and the equal-budget one on
# Hopper, Walker2d and Humanoid, resumable (rerun to continue), then perf/RESULTS.md. Many hours
# per seed on two cores; pass a smaller scale with BOOST_ARGS, e.g. BOOST_ARGS="--tasks Hopper-v5
# --seeds 1-3 --jobs 2".
boost: install
	$(PY) perf/boost.py --protocol paper $(BOOST_ARGS)
	$(PY) perf/boost.py --protocol budget $(BOOST_ARGS)
	$(PY) perf/render_results.py

# Both protocols at CI size (CartPole, one seed, a few rounds; a few minutes), results under
# runs/boost/, never over the published ones.
boost-quick: install
	$(PY) perf/boost.py --quick --protocol paper
	$(PY) perf/boost.py --quick --protocol budget

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs .pytest_cache
