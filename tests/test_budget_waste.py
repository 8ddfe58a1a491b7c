"""A budget is spent, not wasted: at a budget stop every invocation launched was trained on
(none launched for a round that never ran, none cancelled), the spend is at least 95 % of the
budget, and never above it — in sync and pipelined rounds, with the default cost settings
(the aws cost model and its default ``estimate_margin``).

The budget allocator (``kernel.run_state.StopRules``) sizes every round and every pipelined
fan-out with one estimate of a round's cost; replacing the look-ahead before a pipelined
fan-out with "yes" launches a fan-out that is never trained on, which this test counts.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path

import pytest

from kernel.engine import Engine
from tests.conftest import ROOT

#: About 25 one-actor CartPole rounds here: the last round's worth (less than one smallest
#: round, with the estimate's margin) stays under 5 % of it.
BUDGET = 2.5e-4


def _plan(mode: str) -> dict:
    plan = tomllib.loads((ROOT / "plans" / "cartpole.toml").read_text())
    plan["run"].update(name="budget-waste", mode=mode)
    plan["stop"] = {"max_rounds": 10_000, "budget_usd": BUDGET}
    plan["actors"].update(count=1, min=1, max=1, steps=32, workers=1)
    plan["scaler"] = {"name": "fixed"}
    plan["probes"] = []
    plan["sinks"] = []
    plan["cost"] = {"name": "aws"}  # default prices and estimate_margin
    plan["checkpoint"] = {"enabled": False}
    return plan


@pytest.mark.parametrize("mode", ["sync", "pipelined"])
def test_a_budget_stop_wastes_no_invocation_and_spends_the_budget(
        tmp_path: Path, mode: str) -> None:
    engine = Engine.from_plan(_plan(mode), out_dir=tmp_path / "run")
    summary = asyncio.run(engine.run())
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    used = sum(e["batches"] for e in events if e["event"] == "RoundFinished")
    assert summary["stop_reason"] == "budget", summary
    assert summary["rounds"] >= 5, summary
    # Every invocation launched was trained on: none launched past the last round.
    assert summary["invocations"] == used, (summary["invocations"], used)
    assert summary["invocations_cancelled"] == 0
    assert summary["invocation_errors"] == 0 and summary["lost_batches"] == 0
    # Spent, not stranded, and never overspent.
    assert 0.95 * BUDGET <= summary["cost_usd"] <= BUDGET, summary["cost_usd"] / BUDGET
    charged = sum(e["round_usd"] for e in events if e["event"] == "CostCharged")
    assert charged == pytest.approx(summary["cost_usd"])
