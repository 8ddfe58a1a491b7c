"""The simulated clock credits a pipelined or async round's sampling that ran while the previous
round trained, and the learner's bill follows it; sync rounds, fan-outs that waited for a
decision and async rounds charging an invocation launched after the previous update began are
credited nothing.

A pipelined fan-out started at a snapshot point ``at`` of round t's update samples while the
rest of that update (a share ``1 - at``) and round t's probes run; AWS would bill the learner
instance for the round's wall time, which is what is left of the sampling after that plus the
update and probes. Under the time model every duration is the model's, so the credit is exact
and the same on any machine.
"""

from __future__ import annotations

import asyncio
import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from kernel.engine import Engine
from kernel.fleet import async_head_start
from kernel.roles import Receipt
from tests.conftest import ROOT, resume_to_end, run_stopped_after
from tests.test_cost import MODEL

CARTPOLE = str(ROOT / "plans" / "cartpole.toml")
GPU_USD_PER_S = 3.06 / 3600
#: plans/cartpole.toml: 4 envs x 128 steps an invocation, two actors a round
ACTOR_S = (MODEL["model_actor_ms"] + MODEL["model_actor_ms_per_step"] * 512) / 1000
UPDATE_S = MODEL["model_learner_s"] + MODEL["model_learner_s_per_step"] * 1024
TIMED = {"run.seed": 3, "stop.max_rounds": 5, "stop.target_return": 1e9, "actors.count": 2,
         "actors.simulate": True, "probes": [], "sinks": [], "checkpoint.enabled": False,
         "cost.learner": "gpu", **{f"cost.{k}": v for k, v in MODEL.items()}}


def _rounds(out: Path) -> list[dict[str, Any]]:
    """Each round's simulated seconds, dollars and credited overlap."""
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    finished = [e for e in events if e["event"] == "RoundFinished"]
    rows, clock, spent = [], 0.0, 0.0
    for e in finished:
        rows.append({"round": e["round"], "sim_s": e["sim_time_s"] - clock,
                     "usd": e["cost_usd"] - spent, "overlap_s": e["overlap_s"]})
        clock, spent = e["sim_time_s"], e["cost_usd"]
    return rows


def _run(tmp_path: Path, name: str, overrides: dict[str, Any]) -> list[dict[str, Any]]:
    out = tmp_path / name
    asyncio.run(Engine.from_plan(CARTPOLE, {**TIMED, **overrides}, out_dir=out).run())
    return _rounds(out)


@pytest.mark.parametrize("snapshot_at,head_start", [(0.9, 0.1), (0.0, 1.0)],
                         ids=["at-90-percent", "at-once"])
def test_a_fan_out_started_ahead_hides_its_sampling_behind_the_update(
        tmp_path: Path, snapshot_at: float, head_start: float) -> None:
    """Every round after the first is credited ``min(sampling, head start x update)``, its
    simulated time is the rest, and its learner bill is lower than the same round's in sync
    mode by exactly that many seconds at the learner's price (the invocations cost the same)."""
    sync = _run(tmp_path, "sync", {"run.mode": "sync"})
    piped = _run(tmp_path, "pipelined", {"run.mode": "pipelined",
                                         "run.snapshot_at": snapshot_at})
    assert len(sync) == len(piped) == 5
    assert all(r["overlap_s"] == 0.0 for r in sync)
    assert piped[0]["overlap_s"] == 0.0  # nothing trained before round 1
    hidden = min(ACTOR_S, head_start * UPDATE_S)
    assert 0 < hidden < ACTOR_S  # the sampling is partly hidden in both cases
    for s, p in zip(sync[1:], piped[1:], strict=True):
        assert p["overlap_s"] == pytest.approx(hidden, rel=1e-9), p
        assert s["sim_s"] == pytest.approx(ACTOR_S + UPDATE_S, rel=1e-9)
        assert p["sim_s"] == pytest.approx(ACTOR_S - hidden + UPDATE_S, rel=1e-9)
        assert s["usd"] - p["usd"] == pytest.approx(hidden * GPU_USD_PER_S, rel=1e-6)


def test_a_fan_out_that_waited_for_its_decision_hides_nothing(tmp_path: Path) -> None:
    """nitro reads the Hessian probe, here every other round: the round after a probed one
    launches only once the probe and the decision are done, so it is credited nothing; the
    others start ahead and hide their sampling behind the update and the probe-free rest."""
    rounds = _run(tmp_path, "nitro", {
        "run.mode": "pipelined", "run.snapshot_at": 0.5, "scaler.name": "nitro",
        "actors.max": 4, "stop.max_rounds": 6,
        "probes": [{"name": "hessian", "every": 2, "samples": 256, "max_steps": 10}]})
    events = [json.loads(x) for x in (tmp_path / "nitro" / "events.jsonl").read_text()
              .splitlines()]
    probed = {e["round"] for e in events if e["event"] == "ProbeMeasured"
              and e["probe"] == "hessian"}
    assert probed and len(probed) < 6, probed
    for r in rounds[1:]:
        if r["round"] - 1 in probed:
            assert r["overlap_s"] == 0.0, (r, probed)
        else:
            assert r["overlap_s"] > 0.0, (r, probed)


def test_measured_pipelined_rounds_are_credited_and_sync_rounds_are_not(tmp_path: Path
                                                                        ) -> None:
    """With measured durations (the default clock) too: the credit is at most the round's
    simulated sampling, so a pipelined round is never clocked below its update."""
    measured = {k: v for k, v in TIMED.items() if not k.startswith("cost.model_")}
    measured["cost.time_model"] = "measured"
    for mode, credited in (("sync", False), ("pipelined", True)):
        out = tmp_path / mode
        engine = Engine.from_plan(CARTPOLE, {**measured, "run.mode": mode,
                                             "run.snapshot_at": 0.5}, out_dir=out)
        asyncio.run(engine.run())
        history = engine.state.history
        assert len(history) == 5
        assert history[0].overlap_s == 0.0
        for record in history[1:]:
            assert (record.overlap_s > 0.0) is credited, (mode, record)
            assert record.head_start == (0.5 if credited else None)
            assert record.sim_time_s >= record.learner_s - 1e-12


IMPALA = str(ROOT / "plans" / "cartpole-impala.toml")
ASYNC = {"stop.max_rounds": 10, "stop.target_return": 1e9, "probes": [], "sinks": [],
         "actors.simulate": True, "checkpoint.enabled": False, "cost.learner": "gpu"}


def test_async_rounds_hide_sampling_that_was_out_before_the_previous_update(
        tmp_path: Path) -> None:
    """Under the time model an async round is credited the whole previous update,
    ``min(sampling, update(t-1))``, when every invocation it charges was already out as that
    update began (most rounds of a steady fleet); otherwise nothing. Each duration is the
    model's, so the credit is exact."""
    engine = Engine.from_plan(IMPALA, {**ASYNC, **{f"cost.{k}": v for k, v in MODEL.items()}},
                              out_dir=tmp_path / "async")
    asyncio.run(engine.run())
    history = engine.state.history
    assert len(history) == 10
    assert history[0].head_start is None and history[0].overlap_s == 0.0

    def update_s(steps: int) -> float:
        return MODEL["model_learner_s"] + MODEL["model_learner_s_per_step"] * steps

    credited = 0
    for previous, record in pairwise(history):
        actor_s = record.sim_time_s + record.overlap_s - update_s(record.env_steps)
        assert actor_s >= max(record.actor_durations_ms, default=0.0) / 1000 - 1e-9  # (+ a cold start)
        if record.head_start is None:
            assert record.overlap_s == 0.0
            continue
        assert record.head_start == 1.0
        assert record.overlap_s == pytest.approx(min(actor_s, update_s(previous.env_steps)),
                                                 rel=1e-9)
        assert record.overlap_s > 0.0
        credited += 1
    assert credited >= 5, [r.head_start for r in history]


def test_measured_async_rounds_are_credited_at_most_the_previous_training(
        tmp_path: Path) -> None:
    """With measured durations: the credit never exceeds what the previous round trained,
    and a round is never clocked below its own update."""
    engine = Engine.from_plan(IMPALA, ASYNC, out_dir=tmp_path / "async")
    asyncio.run(engine.run())
    history = engine.state.history
    assert history[0].overlap_s == 0.0
    for previous, record in pairwise(history):
        assert record.head_start in (None, 1.0)
        trained = previous.learner_s + previous.probe_s - previous.eval_s
        assert 0.0 <= record.overlap_s <= trained + 1e-12
        assert (record.overlap_s > 0.0) is (record.head_start == 1.0)
        assert record.sim_time_s >= record.learner_s - 1e-12
    assert any(r.head_start == 1.0 for r in history)


def test_an_async_round_is_credited_only_if_all_it_charges_was_out_before_the_update(
        ) -> None:
    def receipt(rid: str) -> Receipt:
        return Receipt(request_id=rid, ok=True)

    assert async_head_start(None, [receipt("a")]) is None  # no update before it
    assert async_head_start({"a", "b"}, [receipt("a"), receipt("b")]) == 1.0
    assert async_head_start({"a"}, [receipt("a"), receipt("c")]) is None  # c came later
    assert async_head_start({"a"}, []) == 1.0  # nothing sampled: the credit is capped at 0


def test_a_resumed_pipelined_run_is_credited_as_the_uninterrupted_one(tmp_path: Path) -> None:
    """The head start of a fan-out in flight at a checkpoint, and the model's seconds of the
    round it overlapped, are kept: stopped after round 4 of 6 and resumed, every round is
    clocked and billed as in the run that was never stopped."""
    from tests.test_resume import EXACT

    plan = {**TIMED, **EXACT, "run.mode": "pipelined", "run.snapshot_at": 0.5,
            "checkpoint.enabled": True}
    asyncio.run(Engine.from_plan(CARTPOLE, plan, out_dir=tmp_path / "straight").run())
    expected = _rounds(tmp_path / "straight")

    out = tmp_path / "stopped"
    assert run_stopped_after(Engine.from_plan(CARTPOLE, plan, out_dir=out), 4)["rounds"] == 4
    resume_to_end(out)
    got = _rounds(out)
    assert [r["round"] for r in got] == list(range(1, 7))
    assert all(r["overlap_s"] > 0 for r in expected[1:])
    for a, b in zip(got, expected, strict=True):
        assert a == pytest.approx(b, rel=1e-9), (a, b)


def test_a_timed_snapshot_follows_the_time_model_and_replays(tmp_path: Path) -> None:
    """With ``run.snapshot_at`` unset the next fan-out starts as late as lets its batches arrive
    as the update ends. Under the time model that point is timed by the model's sampling and
    update (here 0.276 s against 1.1024 s: at = 1 - 1.2 x 0.276 / 1.1024), not by this
    machine's, so every round after the second has the same head start, and a seeded run
    replays round by round."""
    slow_learner = {"cost.model_learner_s": 1.0}
    update_s = 1.0 + MODEL["model_learner_s_per_step"] * 1024
    at = 1.0 - 1.2 * ACTOR_S / update_s
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        engine = Engine.from_plan(CARTPOLE, {**TIMED, **slow_learner, "run.mode": "pipelined",
                                             "stop.max_rounds": 6}, out_dir=out)
        asyncio.run(engine.run())
        runs.append(engine.state.history)
    first, second = runs
    # Round 2's fan-out was decided before any round was charged: it started at once.
    assert first[1].head_start == 1.0
    for record in first[2:]:
        assert record.head_start == pytest.approx(1.0 - at, rel=1e-9)
        assert record.overlap_s == pytest.approx(min(ACTOR_S, (1.0 - at) * update_s),
                                                 rel=1e-9)
    for a, b in zip(first, second, strict=True):
        assert (a.head_start, a.env_steps, a.episode_return_mean, a.cost_usd) == (
            b.head_start, b.env_steps, b.episode_return_mean, b.cost_usd)
