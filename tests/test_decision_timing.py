"""The scaler's decision after round t governs round t+1's fan-out, in every mode."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from kernel.engine import Engine
from kernel.registry import Plugin, Registry, default_registry
from kernel.roles import ScaleContext
from tests.conftest import ROOT

CARTPOLE = str(ROOT / "plans" / "cartpole.toml")


class Cycle:
    """Reads the round just finished (adaptive): N = 1 + round mod 3."""

    adaptive = True

    def __init__(self, ctx: Any):
        self.last_detail: dict[str, float] = {}

    def decide(self, ctx: ScaleContext) -> int:
        return 1 + ctx.round % 3


class AheadCycle(Cycle):
    """The same rule, declared as reading no measurements: it may be asked ahead."""

    adaptive = False


def _registry() -> Registry:
    registry = Registry()
    for plugin in default_registry().all():
        registry.register(plugin)
    registry.register(Plugin("cycle", "scaler", Cycle, "1 + round mod 3, adaptive."))
    registry.register(Plugin("ahead_cycle", "scaler", AheadCycle, "1 + round mod 3."))
    return registry


@pytest.mark.parametrize("mode,scaler", [("sync", "cycle"), ("pipelined", "cycle"),
                                         ("pipelined", "ahead_cycle")])
def test_round_t_plus_1_runs_what_was_decided_after_round_t(tmp_path: Path, mode: str,
                                                             scaler: str) -> None:
    out = tmp_path / "run"
    engine = Engine.from_plan(CARTPOLE, {
        "run.mode": mode, "run.snapshot_at": 0.5, "scaler.name": scaler, "actors.count": 2,
        "actors.max": 4, "stop.max_rounds": 6, "stop.target_return": 1e9, "probes": [],
        "sinks": []}, out_dir=out, registry=_registry())
    summary = asyncio.run(engine.run())
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    decided = {e["round"]: e["actors"] for e in events if e["event"] == "ScaleDecided"}
    arrived: dict[int, int] = {}
    for e in events:
        if e["event"] == "BatchArrived":
            arrived[e["round"]] = arrived.get(e["round"], 0) + 1
    assert summary["rounds"] == 6
    # Round 1 runs actors.count; every later round exactly what was decided after the one
    # before it (1 + (t - 1) mod 3), in its fan-out and in the batches it trained on.
    assert summary["actors_per_round"][0] == 2
    for t in range(2, 7):
        assert decided[t - 1] == 1 + (t - 1) % 3
        assert arrived[t] == decided[t - 1], (t, arrived, decided)
    launched = sum(1 for e in events if e["event"] == "InvocationFinished")
    assert launched == summary["invocations"] == sum(arrived.values())
