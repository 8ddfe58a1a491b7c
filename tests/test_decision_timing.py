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


class Tick:
    """A probe that reports the round it ran in."""

    def __init__(self, ctx: Any):
        pass

    def measure(self, ctx: Any) -> dict[str, float]:
        return {"tick": float(ctx.round)}


class OnTick:
    """Adaptive, reading only the ``tick`` probe: N = 1 + tick mod 4 where it ran, else kept."""

    adaptive = True
    reads_probes = frozenset({"tick"})

    def __init__(self, ctx: Any):
        self.last_detail: dict[str, float] = {}

    def decide(self, ctx: ScaleContext) -> int:
        last = ctx.history[-1] if ctx.history else None
        if last is None or last.round != ctx.round or "tick" not in last.probes:
            return ctx.current
        return 1 + int(last.probes["tick"]) % 4


def test_pipelined_scaler_that_names_its_probe_is_asked_ahead_where_the_probe_skips(
        tmp_path: Path) -> None:
    """Where the probe it reads runs, round t+1 waits for the decision on round t's
    measurements; in the other rounds the decision cannot read round t, so the fan-out starts
    during the update, as for a fixed scaler. Either way round t+1 runs what was decided."""
    registry = _registry()
    registry.register(Plugin("tick", "probe", Tick, "Reports its round."))
    registry.register(Plugin("on_tick", "scaler", OnTick, "1 + tick mod 4 where it ran."))
    out = tmp_path / "run"
    engine = Engine.from_plan(CARTPOLE, {
        "run.mode": "pipelined", "run.snapshot_at": 0.5, "scaler.name": "on_tick",
        "actors.count": 2, "actors.max": 4, "stop.max_rounds": 7, "stop.target_return": 1e9,
        "probes": [{"name": "tick", "every": 3}], "sinks": []}, out_dir=out, registry=registry)
    summary = asyncio.run(engine.run())
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert summary["rounds"] == 7

    def index(kind: str, round_: int) -> int:
        return next(i for i, e in enumerate(events)
                    if e["event"] == kind and e["round"] == round_)

    for t in range(1, 7):
        decided, updated = index("ScaleDecided", t), index("LearnerUpdated", t)
        if t % 3 == 0:  # the probe ran: decided on its value, after it
            assert decided > index("ProbeMeasured", t) > updated, t
        else:
            assert decided < updated, t
    decided_n = {e["round"]: e["actors"] for e in events if e["event"] == "ScaleDecided"}
    arrived: dict[int, int] = {}
    for e in events:
        if e["event"] == "BatchArrived":
            arrived[e["round"]] = arrived.get(e["round"], 0) + 1
    assert [decided_n[t] for t in range(1, 7)] == [2, 2, 4, 4, 4, 3]  # tick 3 -> 4, 6 -> 3
    for t in range(2, 8):
        assert arrived[t] == decided_n[t - 1], (t, arrived, decided_n)
