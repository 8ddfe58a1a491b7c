"""A probe's ``max_share``: a due measurement is skipped where it would take the probe past
that share of the run's simulated time, and a skipped one is a round without the probe in
every respect (the scaler keeps N, a pipelined fan-out is asked ahead)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from kernel.engine import Engine
from kernel.schema import PlanError
from tests.conftest import ROOT

CARTPOLE = str(ROOT / "plans" / "cartpole.toml")
#: A time model whose Hessian probe costs 0.3 s whatever its work: a round of two actors of
#: 4 envs x 64 steps is ~0.4 s, so probing every round would take ~40 % of the run's time.
PROBE_S = 0.3
MODEL = {"time_model": "model", "model_actor_ms": 20.0, "model_actor_ms_per_step": 0.5,
         "model_learner_s": 0.1, "model_learner_s_per_step": 1e-4, "model_probe_s": PROBE_S,
         "model_probe_s_per_sample_step": 0.0}


def _run(out: Path, mode: str, max_share: float | None, rounds: int = 12,
         scaler: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    probe: dict[str, Any] = {"name": "hessian", "every": 1, "samples": 64, "max_steps": 10}
    if max_share is not None:
        probe["max_share"] = max_share
    overrides = {"run.mode": mode, "run.seed": 4, "stop.max_rounds": rounds,
                 "stop.target_return": 1e9, "actors.count": 2, "actors.max": 4,
                 "actors.steps": 64, "actors.simulate": True, "sinks": [],
                 "checkpoint.enabled": False, "scaler": scaler or {"name": "fixed"},
                 "probes": [probe], **{f"cost.{k}": v for k, v in MODEL.items()}}
    summary = asyncio.run(Engine.from_plan(CARTPOLE, overrides, out_dir=out).run())
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return summary, events


def _probed_rounds(events: list[dict[str, Any]]) -> list[int]:
    return [e["round"] for e in events if e["event"] == "ProbeMeasured"
            and e["probe"] == "hessian"]


def _shares(events: list[dict[str, Any]]) -> list[tuple[int, float, float]]:
    """(round, probe seconds so far, simulated seconds so far) after each round."""
    probed, spent, out = set(_probed_rounds(events)), 0.0, []
    for e in events:
        if e["event"] == "RoundFinished":
            spent += PROBE_S if e["round"] in probed else 0.0
            out.append((e["round"], spent, e["sim_time_s"]))
    return out


def test_a_capped_probe_never_takes_more_than_its_share_and_uses_it(tmp_path: Path) -> None:
    """Uncapped, the probe runs every round and takes ~40 % of the clock; capped at 20 %, the
    first measurement runs (nothing to judge by yet), every later one only where it keeps the
    share within 20 % of the time before its round, so after every round the share is at most
    20 %, and each one skipped would have passed it."""
    _, free = _run(tmp_path / "free", "sync", None)
    assert _probed_rounds(free) == list(range(1, 13))
    assert _shares(free)[-1][1] / _shares(free)[-1][2] > 0.3

    summary, capped = _run(tmp_path / "capped", "sync", 0.2)
    assert summary["rounds"] == 12
    probed = _probed_rounds(capped)
    assert probed[0] == 1 and 3 <= len(probed) <= 6, probed
    assert summary["probes_skipped"] == 12 - len(probed)
    shares = _shares(capped)
    for t, spent, clock in shares[1:]:
        assert spent <= 0.2 * clock + 1e-9, (t, spent, clock)
    before = {t: (spent, clock) for t, spent, clock in shares}
    for t in range(2, 13):
        spent, clock = before[t - 1]
        would = (spent + PROBE_S) / (clock + PROBE_S)
        assert (would <= 0.2 + 1e-12) == (t in probed), (t, would)
    # Not a cap that starves the probe: it ends within one measurement of its share.
    spent, clock = before[12]
    assert spent + PROBE_S > 0.2 * clock
    # Skipped probes are neither measured nor billed: the modelled clock counts only those run.
    assert summary["sim_time_s"] < _shares(free)[-1][2]


def test_a_pipelined_round_whose_probe_is_skipped_keeps_n_and_launches_ahead(
        tmp_path: Path) -> None:
    """The nitro scaler reads only the Hessian probe: in a round where the cap skips it, the
    decision cannot depend on the round, so the next fan-out is asked ahead (decided before
    the update), and N is kept; where it runs, the decision waits for its value."""
    summary, events = _run(tmp_path / "run", "pipelined", 0.2,
                           scaler={"name": "nitro", "rule": "anchored", "min_history": 1})
    probed = set(_probed_rounds(events))
    assert summary["rounds"] == 12 and 3 <= len(probed) <= 6, probed

    def index(kind: str, round_: int) -> int:
        return next(i for i, e in enumerate(events)
                    if e["event"] == kind and e["round"] == round_)

    decided = {e["round"]: e for e in events if e["event"] == "ScaleDecided"}
    for t in range(1, 12):
        if t in probed:
            assert index("ScaleDecided", t) > index("ProbeMeasured", t) > index(
                "LearnerUpdated", t), t
        else:
            assert index("ScaleDecided", t) < index("LearnerUpdated", t), t
            assert decided[t]["actors"] == decided[t]["previous"], decided[t]


def test_max_share_is_checked_and_the_anchored_rule_caps_the_probe_it_adds() -> None:
    from kernel.plan import load_plan

    with pytest.raises(PlanError, match="max_share"):
        load_plan(CARTPOLE, {"probes": [{"name": "hessian", "max_share": 1.5}]})
    plan = load_plan(CARTPOLE, {"scaler": {"name": "nitro", "rule": "anchored"},
                                "probes": []})
    hessian = next(p for p in plan["probes"] if p["name"] == "hessian")
    assert (hessian["every"], hessian["max_share"]) == (4, 0.1)
    # A probe the plan writes out is the plan's to cap: nothing is added to it.
    plan = load_plan(CARTPOLE, {"scaler": {"name": "nitro"},
                                "probes": [{"name": "hessian", "every": 2}]})
    assert plan["probes"][0]["max_share"] is None


def test_what_a_probe_was_charged_survives_a_checkpoint(tmp_path: Path) -> None:
    """A resumed run judges its probe's share by the same charged seconds."""
    from kernel.roles import ProbeRun, RoundRecord

    run = ProbeRun(name="hessian", seconds=0.4, values={"lanczos_steps": 9.0}, charged_s=0.1)
    record = RoundRecord(round=3, actors=2, env_steps=128, batches=2, round_s=1.0,
                         learner_s=0.2, probe_s=0.4, actor_durations_ms=[], cold_starts=0,
                         eval_return=None, episode_return_mean=None, probes={},
                         probe_runs=[run])
    from kernel.checkpoint import _plain

    restored = RoundRecord.from_plain(json.loads(json.dumps(_plain(record))))
    assert restored.probe_runs[0].charged_s == 0.1
