"""Scalers on hand-made histories (0/0 and NaN included), the budget cap, and an engine run
whose bill must stay inside its budget."""

from __future__ import annotations

import asyncio
import json
import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernel.roles import PluginContext, RoundRecord, ScaleContext
from plugins.scalers import (
    DecayOnlyScaler,
    FixedScaler,
    GnsScaler,
    GrowScaler,
    HydrozoaScaler,
    KungfuScaler,
    MaxScaler,
    MinScaler,
    NitroScaler,
    NoBoostScaler,
    PrototypeScaler,
    RandomScaler,
    RewardSlopeScaler,
    ScheduleScaler,
    budget_cap,
)

PLAN = {"actors": {"count": 3, "min": 1, "max": 16}}


def make(cls: type, **config: Any) -> Any:
    return cls(PluginContext(name="s", config={"name": "s", **config}, plan=PLAN, run_id="t",
                             run_dir=None, seed=0, bus=None))


def rec(round_: int, *, actors: int = 2, probes: dict[str, float] | None = None,
        eval_return: float | None = None, cost_usd: float = 0.0) -> RoundRecord:
    return RoundRecord(round=round_, actors=actors, env_steps=0, batches=actors, round_s=1.0,
                       learner_s=0.1, probe_s=0.1, actor_durations_ms=[100.0] * actors,
                       cold_starts=0, eval_return=eval_return, episode_return_mean=None,
                       probes=probes or {}, cost_usd=cost_usd)


def sctx(history: list[RoundRecord], *, current: int = 2, n_min: int = 1, n_max: int = 16,
         budget_left: float | None = None, per_actor: float | None = None,
         seed: int = 0, affordable: int | None = None) -> ScaleContext:
    return ScaleContext(round=history[-1].round if history else 0, current=current,
                        n_min=n_min, n_max=n_max, history=history,
                        budget_left_usd=budget_left, cost_per_actor_usd=per_actor,
                        rng=np.random.default_rng(seed), affordable=affordable)


def run(scaler: Any, rhos: list[float | None], key: str = "hessian_ratio",
        current: int = 2, **kw: Any) -> list[int]:
    """Feed rounds 1.. one by one, as the coordinator does; return the decisions."""
    history: list[RoundRecord] = []
    out = []
    for t, rho in enumerate(rhos, start=1):
        history.append(rec(t, actors=current, probes={} if rho is None else {key: rho}))
        current = scaler.decide(sctx(history, current=current, **kw))
        out.append(current)
    return out


# ---- nitro -----------------------------------------------------------------------------------


def test_nitro_by_hand() -> None:
    # decay 0.5, window 3, N_max 16, N_min 1. x_t = rho_t * 0.5^t, floor_t = max(16*0.5^t, 1).
    # t=1: x=1, window [1] (0/0 -> score 1): 16.   t=2: x=0.5, [1, .5] -> 0, floor 4: 4.
    # t=3: x=1, [1, .5, 1] -> 1: 16.               t=4: x=.25, [.5, 1, .25] -> 0, floor 1: 1.
    # t=5: NaN -> keep 1.  t=6: missing -> keep 1.  t=7: x=.5, [.5,1,.25]... -> see below.
    scaler = make(NitroScaler, rule="window", decay=0.5, window=3)
    got = run(scaler, [2.0, 2.0, 8.0, 4.0, math.nan, None])
    assert got == [16, 4, 16, 1, 1, 1]
    assert scaler.last_detail["skipped"] == 1.0
    # The window still holds [1, .5, .25] from t = 2..4 (NaN and missing were skipped).
    assert list(scaler.window) == [0.5, 1.0, 0.25]


def test_nitro_score_in_between_and_detail() -> None:
    scaler = make(NitroScaler, rule="window", decay=1.0, window=6)
    history = [rec(1, probes={"hessian_ratio": 0.0})]
    scaler.decide(sctx(history, n_min=1, n_max=10))
    history.append(rec(2, probes={"hessian_ratio": 4.0}))
    scaler.decide(sctx(history, n_min=1, n_max=10))
    history.append(rec(3, probes={"hessian_ratio": 1.0}))
    n = scaler.decide(sctx(history, n_min=1, n_max=10))
    # decay 1: the floor is N_max itself, so N = N_max whatever the score (score = 0.25 here).
    assert n == 10 and scaler.last_detail["score"] == pytest.approx(0.25)


def test_nitro_constant_signal_follows_the_decaying_floor() -> None:
    # Constant rho: each decayed value is the window's minimum (score 0): N = ceil(floor_t).
    scaler = make(NitroScaler, rule="window")
    got = run(scaler, [3.0] * 30)
    want = [max(1, math.ceil(16 * 0.96**t - 1e-9)) for t in range(1, 31)]
    assert got == want
    assert got[0] == 16 and got[-1] == 5


def test_nitro_all_equal_window_uses_flat_score() -> None:
    scaler = make(NitroScaler, rule="window", decay=1.0, flat_score=0.5)
    got = run(scaler, [2.0, 2.0, 2.0], n_min=1, n_max=8)
    assert got == [8, 8, 8]  # decay 1: floor = N_max
    assert scaler.last_detail["score"] == 0.5


def test_nitro_prototype_compat_replays_the_paper_rule_by_hand() -> None:
    # N in [8, 64], decay 0.96, window 6. Per round t: R = rho * 0.96^t enters W, s = (R -
    # min W) / (max W - min W) (1 for one value), floor = clip(64 * 0.96^(t*t), 8, 64),
    # N = int(clip(64 s, floor, 64)), then the raw rho enters W as well.
    # t=1 rho=10: R=9.6, W=[9.6] -> s=1 -> 64.                           W=[9.6, 10]
    # t=2 rho=20: R=18.432 is W's max -> s=1 -> 64.                       W=[.., 18.432, 20]
    # t=3 rho=5: R=4.42368 is W's min -> s=0; floor 64*.96^9 = 44.322 -> 44.  W gets 5 (full)
    # t=4 rho=50: R=42.467328 (9.6 drops out) is W's max -> s=1 -> 64.   W gets 50, 10 drops
    # t=5 rho=20: R=16.307453952, W=[20, 4.42368, 5, 42.467328, 50, 16.307...] (18.432 out):
    #     s = 11.883773952 / 45.57632 = .26074, 64 s = 16.69 < floor 64*.96^25 = 23.065 -> 23.
    #     W gets 20 (the first 20 drops out): [4.42368, 5, 42.467328, 50, 16.307..., 20]
    # t=6 rho=30: R=23.48273369 (4.42368 out), min 5, max 50: s = 18.48273369 / 45 = .41073,
    #     64 s = 26.29 > floor 64*.96^36 = 14.72 -> 26.                  W gets 30, 5 drops
    # t=7 rho=NaN: skipped, N stays 26, W unchanged.
    # t=8 rho=1: R = .96^8 = .72139 is W's min -> s=0; floor 64*.96^64 = 4.69 -> 8.
    scaler = make(NitroScaler, prototype_compat=True)
    rhos = [10.0, 20.0, 5.0, 50.0, 20.0, 30.0, math.nan, 1.0]
    got = run(scaler, rhos, key="hessian_ratio_prototype", current=16, n_min=8, n_max=64)
    assert got == [64, 64, 44, 64, 23, 26, 26, 8]
    # The same by its own name, and from the eigenvalues when the probe gives only those:
    # with lambda_min = -0.99, -(lambda_max + .01) / (lambda_min - .01) = lambda_max + .01.
    proto = make(PrototypeScaler)
    assert run(proto, rhos, key="hessian_ratio_prototype", current=16, n_min=8,
               n_max=64) == got
    eigen = [{"lambda_max": rho - 0.01, "lambda_min": -0.99,
              "hessian_ratio": 123.0}  # the regularised ratio is not the prototype's
             for rho in rhos]
    assert run_probes(make(PrototypeScaler), eigen, current=16, n_min=8, n_max=64) == got


def run_probes(scaler: Any, probes: list[dict[str, float]], current: int, **kw: Any
               ) -> list[int]:
    """Like ``run``, with every probe value of each round given."""
    history: list[RoundRecord] = []
    out = []
    for t, values in enumerate(probes, start=1):
        history.append(rec(t, actors=current, probes=values))
        current = scaler.decide(sctx(history, current=current, **kw))
        out.append(current)
    return out


def test_nitro_prototype_window_without_spread_scores_flat() -> None:
    # rho = 0 twice: W = [0, 0, 0] at t = 2 holds more than one value and no spread (0/0, the
    # prototype crashed): score = flat_score, so N = 64 (1.0) or the floor 54.36 -> 54 (0.0).
    assert run(make(NitroScaler, prototype_compat=True), [0.0, 0.0],
               key="hessian_ratio_prototype", n_min=8, n_max=64) == [64, 64]
    flat0 = make(NitroScaler, prototype_compat=True, flat_score=0.0)
    assert run(flat0, [0.0, 0.0], key="hessian_ratio_prototype", n_min=8, n_max=64) == [64, 54]
    assert flat0.last_detail["score"] == 0.0


def test_nitro_guards_nan_and_infinite_signals() -> None:
    scaler = make(NitroScaler, rule="window", decay=1.0, window=3)
    got = run(scaler, [1.0, math.inf, -math.inf, math.nan, 2.0], current=5, n_min=1, n_max=8)
    # inf, -inf and NaN are skipped (N kept); the window holds only finite values.
    assert got == [8, 8, 8, 8, 8]
    assert list(scaler.window) == [1.0, 2.0]
    # A spread wider than floats hold: (x - lo) / (hi - lo) would be inf / inf.
    huge = make(NitroScaler, rule="window", decay=1.0, window=3,
                 flat_score=0.25)
    huge.window.extend([-1.7e308, 1.7e308])
    huge.window.append(1.7e308)
    assert huge.score(1.7e308) == 0.25
    assert all(math.isfinite(v) for v in scaler.last_detail.values())


def test_adaptive_scalers_clip_to_the_allocators_answer() -> None:
    # The kernel's budget allocator answers `affordable` from the cost model's one estimate;
    # the scalers only clip to it (and record it), never compute their own.
    scaler = make(NitroScaler, rule="window")  # the window's first value boosts to N_max
    history = [rec(1, actors=2, probes={"hessian_ratio": 1.0}, cost_usd=0.375)]
    ctx = sctx(history, budget_left=0.5, per_actor=0.125, affordable=3)
    assert budget_cap(ctx) == 3
    assert scaler.decide(ctx) == 3
    assert scaler.last_detail["budget_cap"] == 3.0 and scaler.last_detail["wanted"] == 16.0
    # Nothing affordable: N_min (the allocator then stops the run).
    assert scaler.decide(sctx(history, budget_left=0.1, per_actor=0.125, affordable=0)) == 1
    assert budget_cap(sctx(history, budget_left=None, per_actor=0.125)) is None
    # Baselines that must keep their count are not clipped by the scaler itself.
    assert make(FixedScaler).decide(sctx(history, affordable=1)) == 3


def test_nitro_anchored_by_hand() -> None:
    # window 3 -> EMA weight 0.5; base 4, gain 2; two values before the first boost.
    # x = log rho. t=1: x=1, too few values: 4; mean 1.   t=2: x=1, still too few: 4.
    # t=3: x=3, sd 0 (floored) -> z huge -> score 1: 8; mean 2, var 0.5 * (0 + 0.5 * 4) = 1.
    # t=4: x=1.5, z = -0.5: 4 * 2^-0.5 = 2.83 -> 3; mean 1.75, var 0.5 * (1 + 0.5 * .25).
    # t=5: NaN keeps 3.   t=6: x = 1.75 - 2 * 0.75, z = -2 -> clipped to -1: 2.
    scaler = make(NitroScaler, rule="anchored", window=3, base=4, gain=2.0, min_history=2)
    rhos = [math.e, math.e, math.e ** 3, math.e ** 1.5, math.nan, math.e ** 0.25]
    assert run(scaler, rhos) == [4, 4, 8, 3, 3, 2]
    assert scaler.mean == pytest.approx(1.75 + 0.5 * (0.25 - 1.75))
    assert scaler.last_detail["z"] == pytest.approx(-2.0)
    assert scaler.last_detail["score"] == -1.0


def test_nitro_anchored_stays_within_gain_of_base_and_defaults_to_the_plan_count() -> None:
    scaler = make(NitroScaler, rule="anchored")  # base = PLAN's actors.count = 3, gain 2
    assert scaler.base == 3
    rng = np.random.default_rng(5)
    decisions = run(scaler, list(np.exp(rng.normal(0, 3, 200))), current=3)
    assert min(decisions) >= 2 and max(decisions) <= 6  # round(3 / 2), 3 * 2
    assert len(set(decisions)) > 2  # it moves


def test_nitro_anchored_skips_non_positive_rho_and_restores_its_state() -> None:
    scaler = make(NitroScaler, rule="anchored", min_history=1)
    assert run(scaler, [0.0, -1.0], current=5) == [5, 5]  # log undefined: keep N
    assert scaler.seen == 0
    run(scaler, [2.0, 4.0, 8.0])
    again = make(NitroScaler, rule="anchored", min_history=1)
    again.load_state(json.loads(json.dumps(scaler.state())))
    assert (again.mean, again.var, again.seen) == (scaler.mean, scaler.var, scaler.seen)
    assert run(again, [3.0]) == run(scaler, [3.0])
    old = make(NitroScaler, rule="anchored")
    old.load_state({"window": [1.0, 2.0]})  # a checkpoint from before the rule
    assert old.seen == 0


def test_the_hessian_probe_the_anchored_rule_adds_measures_every_4th_round() -> None:
    from kernel.plan import load_plan

    root = Path(__file__).resolve().parents[1]
    sets = ["probes=[]", "scaler.name=nitro"]
    anchored = load_plan(root / "plans" / "cartpole.toml", sets)
    window = load_plan(root / "plans" / "cartpole.toml", [*sets, 'scaler.rule="window"'])
    hessian = [p for p in anchored["probes"] if p["name"] == "hessian"]
    assert len(hessian) == 1 and hessian[0]["every"] == 4
    assert [p["every"] for p in window["probes"] if p["name"] == "hessian"] == [1]


# ---- baselines -------------------------------------------------------------------------------


def test_fixed_min_max() -> None:
    history = [rec(1)]
    assert make(FixedScaler).decide(sctx(history)) == 3
    assert make(FixedScaler, count=5).decide(sctx(history)) == 5
    assert make(MinScaler).decide(sctx(history, n_min=2)) == 2
    assert make(MaxScaler).decide(sctx(history, n_max=9)) == 9
    # Fixed ignores the budget: the engine's budget rule stops the run instead.
    assert make(FixedScaler).decide(sctx(history, budget_left=0.0, per_actor=1.0)) == 3


def test_random_is_seeded_uniform_and_in_bounds() -> None:
    scaler = make(RandomScaler)
    history = [rec(1)]
    ctx = sctx(history, n_min=2, n_max=6, seed=4)
    draws = [scaler.decide(ctx) for _ in range(300)]
    assert set(draws) == {2, 3, 4, 5, 6}
    again = sctx(history, n_min=2, n_max=6, seed=4)
    assert [scaler.decide(again) for _ in range(300)] == draws


def test_gns_boosts_on_a_jump() -> None:
    history: list[RoundRecord] = []
    decisions = []
    for t, g in enumerate([10.0, 11.0, 9.0, 10.0, 30.0, math.nan, 10.5], start=1):
        history.append(rec(t, probes={"gns": g}))
        decisions.append(make(GnsScaler).decide(sctx(history, current=7)))
    # Too little history -> N_min; the jump to 30 -> N_max; NaN -> keep current; 10.5 -> N_min.
    assert decisions == [1, 1, 1, 1, 16, 7, 1]


def test_gns_constant_history_guard() -> None:
    scaler = make(GnsScaler)
    history = [rec(t, probes={"gns": 5.0}) for t in range(1, 6)]
    assert scaler.decide(sctx(history)) == 1 and scaler.last_detail["z"] == 0.0
    history.append(rec(6, probes={"gns": 6.0}))
    assert scaler.decide(sctx(history)) == 16 and scaler.last_detail["z"] == math.inf


def test_schedules() -> None:
    up = make(ScheduleScaler, direction="ascend", step=2, every=3)
    # Round r + 1 runs step (r // every): rounds 1-3 -> 1, 4-6 -> 3, 7-9 -> 5 ...
    assert [up.decide(sctx([rec(r)])) for r in range(1, 10)] == [1, 1, 3, 3, 3, 5, 5, 5, 7]
    down = make(ScheduleScaler, direction="descend", steps=[4, 16, 8], every=1)
    assert [down.decide(sctx([rec(r)])) for r in range(1, 5)] == [8, 4, 4, 4]
    floor = make(ScheduleScaler, direction="descend", step=8, every=1)
    assert [floor.decide(sctx([rec(r)])) for r in range(1, 4)] == [8, 1, 1]


def test_schedule_in_budget_spent() -> None:
    """``at`` switches the count by the share of the budget spent, read from what is left:
    4 until 60 % is spent, 8 until 90 %, 16 after (exactly at a fraction: the next count)."""
    plan = {**PLAN, "stop": {"budget_usd": 0.05}}
    scaler = ScheduleScaler(PluginContext(
        name="s", config={"name": "schedule", "steps": [4, 8, 16], "at": [0.6, 0.9]},
        plan=plan, run_id="t", run_dir=None, seed=0, bus=None))
    lefts = [0.05, 0.0201, 0.02, 0.0051, 0.005, 0.0]
    got = [scaler.decide(sctx([rec(1)], budget_left=left)) for left in lefts]
    assert got == [4, 4, 8, 8, 16, 16]
    assert scaler.last_detail["spent_share"] == pytest.approx(1.0)


@pytest.mark.parametrize(("override", "path", "words"), [
    ({"scaler.at": [0.5]}, "scaler.at", "one fraction fewer than scaler.steps (3 counts"),
    ({"scaler.at": [0.7, 0.4]}, "scaler.at", "rising fractions"),
    ({"scaler.at": [0.5, 1.0]}, "scaler.at", "each in (0, 1)"),
    ({"stop.budget_usd": None}, "stop.budget_usd", "a budget for"),  # None: left out
    ({"scaler.direction": "descend"}, "scaler.direction", "'ascend' with scaler.at"),
])
def test_a_bad_spend_schedule_fails_before_work_starts(override: dict, path: str,
                                                       words: str) -> None:
    from kernel.plan import load_plan
    from kernel.schema import PlanError

    base = {"scaler.name": "schedule", "scaler.steps": [2, 4, 8], "scaler.at": [0.5, 0.8],
            "stop.budget_usd": 0.01}
    assert load_plan("plans/hopper.toml", base)["scaler"]["at"] == [0.5, 0.8]
    bad = {k: v for k, v in {**base, **override}.items() if v is not None}
    with pytest.raises(PlanError) as info:
        load_plan("plans/hopper.toml", bad)
    assert str(info.value).startswith(path) and words in str(info.value), str(info.value)


def test_reward_slope() -> None:
    def decide(returns: list[float | None], current: int = 4) -> int:
        history = [rec(t, eval_return=v) for t, v in enumerate(returns, start=1)]
        return make(RewardSlopeScaler, window=3).decide(sctx(history, current=current))

    assert decide([100.0, 100.0, 100.5]) == 5  # flat: more actors
    assert decide([100.0, 200.0, 300.0]) == 3  # climbing: fewer
    assert decide([300.0, 200.0, 100.0]) == 4  # falling: hold
    assert decide([100.0, None, 100.0]) == 4  # window not filled (a round without eval): hold
    assert decide([math.nan, 100.0, 100.0, 100.0]) == 5  # NaN skipped
    assert decide([0.0, 0.0, 0.0], current=16) == 16  # flat but already at N_max


def test_decay_only_is_nitros_floor_alone() -> None:
    # ceil(max(16 * .96^t, 1)): t=1 15.36 -> 16, t=2 14.75 -> 15, t=3 14.16 -> 15,
    # t=10 16 * .66483 = 10.64 -> 11, t=80 16 * .03817 = .61 -> N_min 1. No probe is read.
    scaler = make(DecayOnlyScaler)
    got = [scaler.decide(sctx([rec(t)])) for t in (1, 2, 3, 10, 80)]
    assert got == [16, 15, 15, 11, 1]
    # The prototype's floor: int(clip(64 * .96^(t*t), 8, 64)): 61, 54, 44, 33, 23, 14, 8, 8.
    proto = make(DecayOnlyScaler, prototype_compat=True)
    got = [proto.decide(sctx([rec(t)], n_min=8, n_max=64)) for t in range(1, 9)]
    assert got == [61, 54, 44, 33, 23, 14, 8, 8]
    assert DecayOnlyScaler.adaptive is False


def test_no_boost_computes_the_score_and_keeps_n() -> None:
    # The prototype's score on the replay above, with N held at 16: the detail shows where the
    # rule would have gone.
    scaler = make(NoBoostScaler, count=16, prototype_compat=True)
    got = run(scaler, [10.0, 20.0, 5.0], key="hessian_ratio_prototype", current=16, n_min=8,
              n_max=64)
    assert got == [16, 16, 16]
    assert scaler.last_detail["score"] == 0.0 and scaler.last_detail["would_boost_to"] == 44.0
    # the paper's baseline scores with the paper's rule, whatever nitro's default rule is
    assert make(NoBoostScaler).rule.rule == "window"
    assert make(NoBoostScaler, rule="anchored").rule.rule == "anchored"


def test_kungfu_follows_rises_of_the_noise_scale_and_updates_previous() -> None:
    # t=1 GNS 100: N = 8, previous 100.   t=2 90 (no rise): 8.
    # t=3 150: 8 * 150/100 = 12, previous 150.   t=4 200: 12 * 200/150 = 16 (the prototype,
    # dividing by GNS_1 = 100 again, would give 24).   t=5 NaN: hold 16.   t=6 180: hold.
    # t=7 1000: 16 * 1000/200 = 80 -> 64.   t=8 1200: 64 * 1.2 -> 64.   t=9 -5: hold 64.
    scaler = make(KungfuScaler)
    gns = [100.0, 90.0, 150.0, 200.0, math.nan, 180.0, 1000.0, 1200.0, -5.0]
    assert run(scaler, gns, key="gns", current=16, n_min=8, n_max=64) == \
        [8, 8, 12, 16, 16, 16, 64, 64, 64]
    assert scaler.last_detail["skipped"] == 1.0 and scaler.previous == 1200.0


def test_grow_follows_a_power_of_the_noise_scale_within_its_band() -> None:
    # base 4, gain 2: N in [2, 8]; exponent 0.5, no smoothing, reference after 2 measurements.
    # t=1 B 100 (warm-up): 2.  t=2 B 100 = B_ref: 2 * 1 = 2.  t=3 B 400: 2 * sqrt(4) = 4.
    # t=4 nothing measured: hold 4.  t=5 B 1800/2 = 900: 2 * 3 = 6.  t=6 B 10,000: 20 -> 8.
    # t=7 B 25: 1 -> 2.  t=8 tr(Sigma) < 0 (B = 0): hold 2.
    scaler = make(GrowScaler, base=4, gain=2.0, exponent=0.5, smoothing=0.0, warmup=2)
    parts = [(1.0, 100.0), (1.0, 100.0), (1.0, 400.0), None, (2.0, 1800.0), (1.0, 1e4),
             (1.0, 25.0), (1.0, -5.0)]
    history: list[RoundRecord] = []
    current, got = 4, []
    for t, part in enumerate(parts, start=1):
        probes = {} if part is None else {"grad_norm_sq": part[0], "trace_sigma": part[1]}
        history.append(rec(t, actors=current, probes=probes))
        current = scaler.decide(sctx(history, current=current))
        got.append(current)
    assert got == [2, 2, 4, 4, 6, 8, 2, 2]
    assert scaler.last_detail["skipped"] == 1.0 and scaler.reference == 100.0
    # A checkpoint carries the reference and the averages: the copy decides as the original.
    copy = make(GrowScaler, base=4, gain=2.0, exponent=0.5, smoothing=0.0, warmup=2)
    copy.load_state(json.loads(json.dumps(scaler.state())))
    history.append(rec(9, actors=2, probes={"grad_norm_sq": 1.0, "trace_sigma": 1600.0}))
    assert scaler.decide(sctx(history)) == copy.decide(sctx(history)) == 8


def test_grow_takes_the_noise_scale_as_a_ratio_of_averages() -> None:
    # |G|^2 of 1 then 3 average to 2 (smoothing 0.5), tr(Sigma) stays 100: B = 50, not the
    # mean of 100 and 33 (a ratio of noisy estimates is biased towards small denominators).
    scaler = make(GrowScaler, smoothing=0.5, warmup=1)
    history = [rec(1, probes={"grad_norm_sq": 1.0, "trace_sigma": 100.0}),
               rec(2, probes={"grad_norm_sq": 3.0, "trace_sigma": 100.0})]
    scaler.decide(sctx(history[:1]))
    scaler.decide(sctx(history))
    assert math.isclose(scaler.last_detail["b_noise"], 50.0)


def test_hydrozoa_doubles_every_ten_rounds() -> None:
    # Round r = t + 1 runs 8 * 2^((r - 1) // 10): rounds 2-10 8, 11-20 16, 21-30 32, then 64.
    scaler = make(HydrozoaScaler)
    decide = {t: scaler.decide(sctx([rec(t)], n_min=8, n_max=64)) for t in range(1, 45)}
    assert {decide[t] for t in range(1, 10)} == {8}
    assert {decide[t] for t in range(10, 20)} == {16}
    assert {decide[t] for t in range(20, 30)} == {32}
    assert {decide[t] for t in range(30, 45)} == {64}


@pytest.mark.parametrize(("name", "probe", "widened"), [
    ("prototype", "hessian", True), ("prototype_compat", "hessian", True),
    ("no_boost", "hessian", False), ("kungfu", "gns", True),
    ("grow", "gns", True), ("critical_batch", "gns", True),
    ("decay_only", None, True), ("hydrozoa", None, True),
])
def test_baselines_get_their_probe_and_room(name: str, probe: str | None,
                                            widened: bool) -> None:
    from kernel.plan import load_plan

    plan = load_plan("plans/hopper.toml", {"scaler.name": name})
    base = load_plan("plans/hopper.toml")
    names = [p["name"] for p in plan["probes"]]
    if probe is None:
        assert names == [p["name"] for p in base["probes"]]
    else:
        assert names[0] == probe and names.count(probe) == 1
    count = plan["actors"]["count"]
    assert plan["actors"]["max"] == (8 * count if widened else count)


# ---- the engine keeps to its budget ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "pipelined"])
def test_engine_run_stays_inside_its_budget(tmp_path: Path, mode: str) -> None:
    from kernel.engine import Engine

    # Small enough that even a quiet machine's cheap rounds exhaust it long before max_rounds,
    # large enough for two rounds when a loaded machine doubles the billed probe time (round 1
    # costs about 1.6e-4 on a quiet one, and the next estimate has a margin of 2).
    budget = 1.2e-3
    plan = tomllib.loads(Path("plans/cartpole.toml").read_text())
    plan["run"].update(name="budget", mode=mode)
    plan["stop"] = {"max_rounds": 400, "budget_usd": budget}
    plan["actors"].update(count=2, min=1, max=4, workers=2, simulate=True)
    plan["scaler"] = {"name": "nitro"}
    plan["probes"] = [{"name": "hessian", "samples": 256, "max_steps": 30}]
    plan["sinks"] = []
    # Round times jitter on a shared 2-core machine; a wider margin keeps this test about the
    # mechanism (estimate, cap, stop) rather than about the default margin's odds.
    plan["cost"] = {"name": "aws", "estimate_margin": 2.0}
    engine = Engine.from_plan(plan, out_dir=tmp_path)
    summary = asyncio.run(engine.run())
    assert summary["stop_reason"] == "budget"
    assert 0 < summary["cost_usd"] <= budget
    assert summary["rounds"] >= 2
    assert all(1 <= n <= 4 for n in summary["actors_per_round"])
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").open()]
    charged = [e for e in events if e["event"] == "CostCharged"]
    assert len(charged) == summary["rounds"]
    assert sum(e["round_usd"] for e in charged) == pytest.approx(summary["cost_usd"])
    scaled = [e for e in events if e["event"] == "ScaleDecided"]
    assert scaled and all(e["scaler"] == "nitro" for e in scaled)
    assert any("score" in e["detail"] or e["detail"].get("skipped") for e in scaled)
    probes = [e for e in events if e["event"] == "ProbeMeasured" and e["probe"] == "hessian"]
    assert probes and all(e["probe_s"] > 0 for e in probes)


def test_engine_switches_a_spend_schedule_at_its_share_of_the_budget(tmp_path: Path) -> None:
    """A schedule in dollars through the real engine: every round's count is the step whose
    share of the budget had been spent when it was decided, and the run spends the budget."""
    from kernel.engine import Engine

    budget = 8e-4  # about 200 rounds of one actor
    plan = tomllib.loads(Path("plans/cartpole.toml").read_text())
    plan["run"].update(name="spend", mode="sync")
    plan["stop"] = {"max_rounds": 1000, "budget_usd": budget}
    plan["actors"].update(count=1, min=1, max=4, workers=2, simulate=True)
    plan["scaler"] = {"name": "schedule", "steps": [1, 2, 4], "at": [0.3, 0.6]}
    plan["probes"], plan["sinks"] = [], []
    plan["cost"] = {"name": "aws", "estimate_margin": 2.0}
    engine = Engine.from_plan(plan, out_dir=tmp_path)
    summary = asyncio.run(engine.run())
    assert summary["stop_reason"] == "budget" and 0 < summary["cost_usd"] <= budget
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").open()]
    charged = [e["round_usd"] for e in events if e["event"] == "CostCharged"]
    spent = np.cumsum([0.0, *charged]) / budget  # before each round was decided
    rounds = summary["actors_per_round"]
    decided = [e for e in events if e["event"] == "ScaleDecided"]
    for r, n in enumerate(rounds[1:], start=1):  # round 1 runs the plan's count
        want = [1, 2, 4][int(spent[r] >= 0.3) + int(spent[r] >= 0.6)]
        assert decided[r - 1]["detail"]["spent_share"] == pytest.approx(spent[r])
        assert n == want or n == min(want, decided[r - 1]["detail"].get("budget_cap", want))
    assert {1, 2, 4} <= set(rounds)


def test_grow_reads_the_real_gns_probe_and_decides_by_its_formula(tmp_path: Path) -> None:
    """An engine run of grow on CartPole: the gns probe it needs is added, its parts reach the
    scaler, and every decision is the formula applied to the noise scale it reports."""
    from kernel.engine import Engine

    plan = tomllib.loads(Path("plans/cartpole.toml").read_text())
    plan["run"].update(name="grow", mode="sync")
    plan["stop"] = {"max_rounds": 10, "target_return": 1e9}
    plan["actors"].update(count=4, min=1, max=8)
    plan["scaler"] = {"name": "grow", "warmup": 2, "exponent": 0.5}
    plan["probes"], plan["sinks"] = [], []
    engine = Engine.from_plan(plan, out_dir=tmp_path)
    summary = asyncio.run(engine.run())
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").open()]
    decided = [e for e in events if e["event"] == "ScaleDecided"]
    assert summary["rounds"] == 10 and len(decided) == 10  # the last one decides no round
    assert decided[0]["detail"]["warmup"] == 1.0 and decided[0]["actors"] == 2  # lo = 4 / 2
    reference = decided[1]["detail"]["b_ref"]
    assert reference > 0
    checked = 0
    for e in decided[1:]:
        detail = e["detail"]
        if detail.get("skipped"):
            continue
        want = min(max(2 * (detail["b_noise"] / reference) ** 0.5, 2.0), 8.0)
        assert detail["raw"] == pytest.approx(want)
        assert e["actors"] == round(want)
        checked += 1
    assert checked >= 6, "the probe's measurements should reach the scaler in most rounds"
    assert summary["actors_per_round"][1:] == [e["actors"] for e in decided[:-1]]


def test_adaptive_scalers_get_room_and_their_probe_by_default() -> None:
    """`--set scaler.name=nitro` on a plan written for the fixed scaler must still boost: an
    unset actors.max widens to 8 x count and the hessian probe it reads is added."""
    from kernel.plan import load_plan

    plan = load_plan("plans/hopper.toml", {"scaler.name": "nitro"})
    assert plan["actors"]["max"] == 8 * plan["actors"]["count"]
    assert [p["name"] for p in plan["probes"]][:2] == ["hessian", "eval"]
    assert plan["probes"][0]["samples"] == 2048  # the probe's own defaults
    fixed = load_plan("plans/hopper.toml")
    assert fixed["actors"]["max"] == fixed["actors"]["count"]
    explicit = load_plan("plans/hopper.toml", {"scaler.name": "gns", "actors.max": 3})
    assert explicit["actors"]["max"] == 3
    assert [p["name"] for p in explicit["probes"]][0] == "gns"


def test_engine_runs_no_boost_under_the_prototype_cost_model(tmp_path: Path) -> None:
    """The paper's no-boost baseline through the real engine: the Hessian probe runs every
    round and its score is published while N stays put, and the prototype's model bills
    every round's time at $3.74/h (probe included here, as asked) and nothing per invocation."""
    from kernel.engine import Engine

    plan = tomllib.loads(Path("plans/cartpole.toml").read_text())
    plan["run"].update(name="noboost")
    plan["stop"] = {"max_rounds": 3}
    plan["actors"].update(count=2, min=1, max=4, workers=2, simulate=True)
    plan["scaler"] = {"name": "no_boost", "prototype_compat": True}
    plan["probes"] = [{"name": "hessian", "samples": 256, "max_steps": 20}]
    plan["sinks"] = []
    plan["cost"] = {"name": "prototype", "charge_probe": True}
    engine = Engine.from_plan(plan, out_dir=tmp_path)
    summary = asyncio.run(engine.run())
    assert summary["actors_per_round"] == [2, 2, 2]
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").open()]
    scaled = [e for e in events if e["event"] == "ScaleDecided"]
    assert scaled and all(e["actors"] == 2 and "would_boost_to" in e["detail"] for e in scaled)
    finished = {e["round"]: e for e in events if e["event"] == "RoundFinished"}
    for e in (e for e in events if e["event"] == "CostCharged"):
        assert set(e["items"]) == {"learner_usd", "actors_usd"}
        assert e["items"]["actors_usd"] == pytest.approx(e["items"]["learner_usd"] * 0.68 / 3.06)
        assert e["round_usd"] > 0
    assert len(finished) == 3


def test_the_package_re_exports_every_scaler_lazily() -> None:
    """``from plugins.scalers import X`` works for every scaler while importing the package
    alone loads none of its modules (listing plugins stays cheap)."""
    import subprocess
    import sys

    code = ("import sys, plugins.scalers as s\n"
            "loaded = [m for m in sys.modules if m.startswith('plugins.scalers.')]\n"
            "assert loaded == [], loaded\n"
            "for name in s.__all__:\n"
            "    assert getattr(s, name).__name__ == name, name\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=60)
    assert out.returncode == 0, out.stderr
    import plugins.scalers
    from kernel.registry import default_registry

    registry = default_registry()
    ours = [registry.get("scaler", n).factory for n in registry.names("scaler")]
    factories = {f.rpartition(":")[2] for f in ours
                 if isinstance(f, str) and f.startswith("plugins.scalers.")}
    assert len(factories) >= 14
    assert factories <= set(plugins.scalers.__all__)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        plugins.scalers.Nope  # noqa: B018


def test_nitro_names_the_probe_it_reads() -> None:
    # The Hessian probe alone, so a pipelined round where it skips may be asked ahead; a signal
    # from a probe the scaler cannot name leaves every decision waiting for its round.
    assert make(NitroScaler).reads_probes == frozenset({"hessian"})
    assert make(PrototypeScaler).reads_probes == frozenset({"hessian"})
    assert make(NitroScaler, signal="gns").reads_probes == frozenset({"gns"})
    assert make(NitroScaler, signal="my_value").reads_probes is None
    assert make(KungfuScaler).reads_probes == make(GrowScaler).reads_probes == frozenset({"gns"})
    assert make(GnsScaler, signal="my_value").reads_probes is None


GNS_PARTS = [{"gns": g, "grad_norm_sq": 1.0, "trace_sigma": g} for g in (50.0, 80.0, 400.0, 900.0)]
HESSIAN = [{"hessian_ratio": rho} for rho in (10.0, 10.0, 10.0, 100.0)]


@pytest.mark.parametrize("cls,config,probes", [
    (NitroScaler, {"base": 4, "min_history": 1}, HESSIAN),
    (NitroScaler, {"rule": "window"}, HESSIAN),
    (PrototypeScaler, {}, [{"hessian_ratio_prototype": v["hessian_ratio"]} for v in HESSIAN]),
    (KungfuScaler, {}, GNS_PARTS),
    (GnsScaler, {"min_history": 2, "threshold": 1.0}, GNS_PARTS),
    (GrowScaler, {"warmup": 1}, GNS_PARTS),
])
def test_scaler_asked_ahead_keeps_n_and_reads_no_round_twice(
        cls: type, config: dict[str, Any], probes: list[dict[str, float]]) -> None:
    # Asked ahead of round 5 (its record not in the history yet: a pipelined round where the
    # probe skips), a scaler must not read round 4's measurement a second time: N is kept
    # and its state is what round 4 left.
    scaler = make(cls, **config)
    history = [rec(t, actors=4, probes=values) for t, values in enumerate(probes, start=1)]
    current = 4
    for t in range(1, len(history) + 1):
        current = scaler.decide(sctx(history[:t], current=current))
    before = json.dumps(scaler.state() if hasattr(scaler, "state") else None)
    ahead = ScaleContext(round=len(history) + 1, current=current, n_min=1, n_max=16,
                         history=history, budget_left_usd=None, cost_per_actor_usd=None,
                         rng=np.random.default_rng(0))
    assert scaler.decide(ahead) == current
    assert scaler.last_detail["skipped"] == 1.0
    assert json.dumps(scaler.state() if hasattr(scaler, "state") else None) == before
