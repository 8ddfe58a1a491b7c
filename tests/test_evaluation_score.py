"""The probe that drives ``stop.target_return`` is the one its descriptor marks as evaluating
the policy, and its score is the value the descriptor names: no probe name or value name is
special to the kernel."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kernel.engine import Engine
from kernel.registry import Plugin, Registry, default_registry
from kernel.roles import PluginContext, ProbeContext
from tests.conftest import ROOT

CARTPOLE = str(ROOT / "plans" / "cartpole.toml")


class Constant:
    """Reports the same values every round (what it measures is beside the point here)."""

    values: dict[str, float] = {}

    def __init__(self, ctx: PluginContext):
        self.every = int(ctx.config["every"])

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        return dict(self.values)


class WinRate(Constant):
    values = {"win_rate": 0.75, "eval_return": -1.0}


class Loud(Constant):
    values = {"eval_return": 1e9}


def _registry() -> Registry:
    registry = Registry()
    for plugin in default_registry().all():
        registry.register(plugin)
    registry.register(Plugin("winrate", "probe", WinRate, "Win rate of the policy.",
                             evaluation=True, score="win_rate"))
    registry.register(Plugin("loud", "probe", Loud, "Not an evaluation."))
    return registry


def _run(tmp_path: Path, probe: str, target: float) -> dict[str, Any]:
    engine = Engine.from_plan(CARTPOLE, {
        "stop.max_rounds": 3, "stop.target_return": target, "probes": [{"name": probe}],
        "sinks": []}, out_dir=tmp_path / probe, registry=_registry())
    return asyncio.run(engine.run())


def test_an_evaluation_probe_drives_the_target_by_the_score_it_names(tmp_path: Path) -> None:
    summary = _run(tmp_path, "winrate", target=0.5)
    assert summary["stop_reason"] == "target_return" and summary["rounds"] == 1
    assert summary["best_eval_return"] == summary["final_eval_return"] == pytest.approx(0.75)


def test_a_probe_not_marked_as_evaluation_never_stops_the_run(tmp_path: Path) -> None:
    summary = _run(tmp_path, "loud", target=1.0)
    assert summary["stop_reason"] == "max_rounds" and summary["rounds"] == 3
    assert summary["best_eval_return"] is None
