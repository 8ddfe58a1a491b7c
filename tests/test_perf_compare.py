"""The peers comparison's bookkeeping: the verdict on returns and which runs may share a table.

These decide what perf/RESULTS.md claims, so they are tested like library code; the runs
themselves are benchmarks (perf/), never timed here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "perf"))

import compare_peers as cp  # noqa: E402

MACHINE = {"cpu": "AMD EPYC", "cores": 2, "loadavg": [0.1, 0.1, 0.1]}
VERSIONS = {"nitro:torch": "2.13.0+cpu", "sb3:stable-baselines3": "2.9.2"}


def test_mean_difference_is_exact_and_its_interval_covers_zero_for_one_population():
    same = [1000.0, 1500.0, 2000.0, 2500.0, 3000.0]
    diff, lo, hi = cp.mean_difference(same, list(reversed(same)))
    assert diff == 0.0
    assert lo < 0 < hi


def test_mean_difference_separates_populations_far_apart():
    diff, lo, hi = cp.mean_difference([3000.0, 3100.0, 2900.0], [1000.0, 1100.0, 900.0])
    assert diff == pytest.approx(2000.0)
    assert 0 < lo <= diff <= hi


def test_returns_comparison_names_the_verdict_per_peer():
    def runs(values):
        return [{"seed": i, "final_eval_return": v} for i, v in enumerate(values, 1)]

    results = {"hopper": {"nitro": runs([3000.0, 3100.0, 2900.0]),
                          "sb3": runs([1000.0, 1100.0, 900.0]),
                          "rllib": runs([2900.0, 3050.0, 3100.0]),
                          "sb3_1t": runs([1000.0]) + [{"seed": 2, "error": "boom"}]}}
    text = cp.returns_comparison(results, ["nitro", "sb3", "sb3_1t", "rllib"])
    lines = {line.split(":")[0]: line for line in text.splitlines() if line.startswith("- ")}
    assert "Nitro higher" in lines["- nitro − sb3"]
    assert "not distinguishable from zero" in lines["- nitro − rllib"]
    assert "- nitro − sb3_1t" not in lines  # one good seed gives no interval


def test_runs_from_the_same_machine_and_versions_merge():
    stored = {"machine": MACHINE, "versions": VERSIONS}
    assert cp.unmergeable(stored, {**MACHINE, "loadavg": [2.0, 2.0, 2.0]}, VERSIONS) is None
    # an implementation the stored table lacks is new, not a change
    assert cp.unmergeable(stored, MACHINE, {**VERSIONS, "rllib:ray": "2.60.0"}) is None


def test_runs_from_another_cpu_or_versions_do_not_merge():
    stored = {"machine": MACHINE, "versions": VERSIONS}
    why = cp.unmergeable(stored, {**MACHINE, "cpu": "Intel(R) Xeon(R) Processor"}, VERSIONS)
    assert why is not None and "AMD EPYC" in why and "Xeon" in why
    why = cp.unmergeable(stored, MACHINE, {**VERSIONS, "sb3:stable-baselines3": "2.10.0"})
    assert why is not None and "2.9.2 -> 2.10.0" in why


def test_history_of_a_table_stored_before_histories_were_kept():
    stored = {"when": "2026-11-30 03:15:23 UTC", "command": "python perf/compare_peers.py",
              "machine": MACHINE}
    assert cp.run_history(stored) == [{"when": stored["when"], "command": stored["command"],
                                       "loadavg": MACHINE["loadavg"]}]
    kept = [{"when": "a", "command": "b", "loadavg": None}]
    assert cp.run_history({**stored, "history": kept}) == kept
