"""The premise experiment (perf/boost_premise.py): its branches must not touch the run they
branch from, and its analysis must find a premise that holds and miss one that does not."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "perf"))

import boost_premise as bp  # noqa: E402


def leaves(tree, prefix=""):
    """Every array or number of a nested state, by path."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from leaves(v, f"{prefix}/{k}")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from leaves(v, f"{prefix}/{i}")
    else:
        yield prefix, tree


@pytest.mark.parametrize(("horizon", "use"), [(1, "count"), (2, "count"), (1, "steps"),
                                             (1, "lr"), (1, "clip")])
def test_a_branch_trains_copies_and_leaves_the_run_as_it_was(horizon, use):
    import torch

    from kernel.plan import load_plan
    from kernel.registry import default_registry
    from kernel.roles import PluginContext, ProbeContext

    plan = load_plan(str(ROOT / "plans" / "hopper.toml"), {"actors.count": 1})
    ctx = PluginContext(name="ppo", config=plan["algo"], plan=plan, run_id="t", run_dir=None,
                        seed=0, bus=None)
    learner = default_registry().get("algo", "ppo").load()(ctx)
    b = bp.Branching(every=1, start=1, small=1, big=2, replicates=1, episodes=1, steps=64,
                     horizon=horizon, use=use)
    probe = bp.branch_probe(b)(ctx)
    learner.update([probe._round(learner, 2, seed=5)])  # a run one round in
    before = dict(leaves(learner.state()))
    rng = torch.get_rng_state()

    values = probe.measure(ProbeContext(round=3, learner=learner, batches=[], seed=4))

    assert {"eval_before", "small_0", "big_0", "branch_s"} <= values.keys()
    assert ("control_0" in values) == (use in bp.CONTROLLED)
    after = dict(leaves(learner.state()))
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert np.array_equal(np.asarray(value), np.asarray(after[key])), key
    assert torch.equal(torch.get_rng_state(), rng)
    assert probe.measure(ProbeContext(round=0, learner=learner, batches=[], seed=4)) == {}


def test_each_use_of_the_big_round_changes_only_what_it_names():
    """``count`` keeps the run's update; ``steps`` keeps the small round's minibatch size, so
    the big round takes big / small times the optimiser steps at the run's rate; ``lr`` keeps
    the minibatch count and raises the rate by sqrt(big / small)."""
    from types import SimpleNamespace

    from algos.ppo import PPO, PPOConfig

    config = PPOConfig(num_minibatches=32, update_epochs=10, learning_rate=3e-4)
    b = bp.Branching(every=2, start=2, small=8, big=64, replicates=1, episodes=1, steps=512)
    big_batch = 64 * 512

    assert bp.big_config(config, b) == config
    steps = bp.big_config(config, bp.dataclasses.replace(b, use="steps"))
    assert steps.minibatch_size == 8 * 512 // 32
    assert round(big_batch / steps.minibatch_size) == 8 * 32
    assert steps.learning_rate == config.learning_rate and steps.lr_reference_minibatch is None
    lr = bp.big_config(config, bp.dataclasses.replace(b, use="lr"))
    assert lr.minibatch_size is None and lr.num_minibatches == 32
    assert lr.lr_reference_minibatch == 8 * 512 // 32
    assert PPO.lr_size_factor(SimpleNamespace(config=lr), big_batch / 32) == \
        pytest.approx(8 ** 0.5)
    assert PPO.lr_size_factor(SimpleNamespace(config=config), big_batch / 32) == 1.0
    with pytest.raises(ValueError, match="--use must be one of"):
        bp.big_config(config, bp.dataclasses.replace(b, use="epochs"))


def test_the_clip_use_widens_the_range_by_the_square_root_rule_and_controls_for_it():
    """``clip`` is ``steps`` with the clip range x sqrt(big / small); its control arm is the
    small round with that range and nothing else changed."""
    from algos.ppo import PPOConfig

    config = PPOConfig(num_minibatches=32, update_epochs=10, clip_coef=0.2)
    b = bp.Branching(every=2, start=2, small=8, big=64, replicates=1, episodes=1, steps=512,
                     use="clip")
    steps = bp.big_config(config, bp.dataclasses.replace(b, use="steps"))
    clip = bp.big_config(config, b)
    assert clip == bp.dataclasses.replace(steps, clip_coef=pytest.approx(0.2 * 8 ** 0.5))
    control = bp.control_config(config, b)
    assert control == bp.dataclasses.replace(config, clip_coef=clip.clip_coef)
    assert [(label, n) for label, n, _ in bp.arms(config, b)] == \
        [("small", 8), ("big", 64), ("control", 8)]
    assert [label for label, *_ in bp.arms(config, bp.dataclasses.replace(b, use="lr"))] == \
        ["small", "big"]
    with pytest.raises(ValueError, match="no control arm"):
        bp.control_config(config, bp.dataclasses.replace(b, use="steps"))


def rows_with(advantage_of, seeds=4, rounds=20):
    """Branch rows whose big round's advantage is ``advantage_of(log rho, noise)``."""
    rng = np.random.default_rng(1)
    rows = []
    for s in range(1, seeds + 1):
        for t in range(2, 2 + 2 * rounds, 2):
            log_rho = 0.02 * t + rng.normal(0, 0.5)
            adv = advantage_of(log_rho, rng.normal(0, 10))
            rows.append({"seed": s, "round": t, "eval_before": 100.0, "small": [110.0, 110.0],
                         "big": [110.0 + adv, 110.0 + adv],
                         "hessian_ratio": float(np.exp(log_rho)), "gns": 50.0 + t + s,
                         "hessian_ratio_prototype": None, "lambda_max": 1.0,
                         "lambda_min": -0.5})
    return rows


def test_the_analysis_finds_a_planted_premise_and_not_an_absent_one():
    held = bp.analyse(rows_with(lambda log_rho, noise: 40 * log_rho + noise))
    rho, (lo, _) = held["correlations"]["log rho, detrended"]
    assert rho > 0.6 and lo > 0.3
    assert held["top_third_rho"][0] > held["bottom_third_rho"][0] + 20
    absent = bp.analyse(rows_with(lambda log_rho, noise: 5 + noise))
    rho, (lo, hi) = absent["correlations"]["log rho, detrended"]
    assert lo < 0 < hi
    assert absent["advantage"][1][0] < 5 < absent["advantage"][1][1]


def test_the_table_is_recomputed_from_the_rows():
    data = {"branching": {"every": 2, "start": 2, "small": 8, "big": 64, "replicates": 2,
                          "episodes": 10, "steps": 512},
            "rows": rows_with(lambda log_rho, noise: 30.0)}
    page = bp.render(data)
    assert "80 branches over seeds 1, 2, 3, 4" in page
    assert "| 64 minus 8 (the advantage) | +30 [+30, +30] |" in page
    assert "control" not in page


def test_the_control_arm_is_reported_when_its_rows_have_it():
    rows = rows_with(lambda log_rho, noise: 30.0)
    for r in rows:
        r["control"] = [120.0, 120.0]  # a gain of 20 against the small round's 10
    data = {"branching": {"every": 2, "start": 2, "small": 8, "big": 64, "replicates": 2,
                          "episodes": 10, "steps": 512, "use": "clip"}, "rows": rows}
    page = bp.render(data)
    assert "| 8 actors with the big round's clip (the control) | +20 [+20, +20] |" in page
    assert "| 64 minus the control (what the samples add) | +20 [+20, +20] |" in page


def test_branches_without_a_positive_noise_scale_still_count_for_the_advantage_and_rho():
    """The noise scale is an estimate that can come out at zero or below; dropping those
    branches from everything would let one signal select the advantage the others are
    tested against."""
    rows = rows_with(lambda log_rho, noise: 10.0)
    for r in rows[::4]:  # a quarter of the branches: no usable noise scale, a big advantage
        r["gns"] = None if r["round"] % 4 else -3.0
        r["big"] = [r["big"][0] + 40.0, r["big"][1] + 40.0]
    a = bp.analyse(rows)
    assert a["branches"] == 80 and a["gns_branches"] == 60
    assert a["advantage"][0] == pytest.approx(20.0)  # 3/4 at +10, 1/4 at +50
    assert not np.isnan(a["correlations"]["log gns, detrended"][0])
    page = bp.render({"branching": {"every": 2, "start": 2, "small": 8, "big": 64,
                                    "replicates": 2, "episodes": 10, "steps": 512},
                      "rows": rows})
    assert "80 branches over seeds" in page
    assert "the noise scale's over the 60 branches where its estimate is positive" in page
