"""Gradient noise scale: a synthetic problem with a known B_simple, the |G|^2 <= 0 guard, and
the probe on PPO's own loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from algos.gns import noise_scale, slice_gradients
from algos.ppo import PPO, PPOConfig
from kernel.roles import PluginContext, ProbeContext
from plugins.probes.gns import GnsProbe
from tests.test_hessian import BOX, FakeLearner, ppo_rollout


def quadratic_loss(p: dict[str, torch.Tensor], mb: dict[str, torch.Tensor]) -> torch.Tensor:
    # Per-sample gradient w - x_i: G = w - mu, Sigma = sigma^2 I, so B_simple = d sigma^2/|G|^2.
    return 0.5 * ((p["w"] - mb["x"]) ** 2).sum(dim=1).mean()


def test_noise_scale_of_a_known_problem() -> None:
    d, sigma, n = 10, 2.0, 8192
    g = torch.Generator().manual_seed(0)
    mu = torch.zeros(d, dtype=torch.float64)
    x = mu + sigma * torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.full((d,), 2.0 / math.sqrt(d), dtype=torch.float64)  # |G|^2 = 4
    grads, slice_size = slice_gradients(quadratic_loss, {"w": w}, {"x": x}, 64)
    est = noise_scale(grads, slice_size)
    assert (est.b_small, est.b_big) == (128, 8192)
    assert est.trace_sigma == pytest.approx(d * sigma**2, rel=0.2)
    assert est.grad_norm_sq == pytest.approx(4.0, rel=0.05)
    assert est.gns == pytest.approx(d * sigma**2 / 4.0, rel=0.2)


def test_whole_batch_gradient_is_the_mean_of_slices() -> None:
    x = torch.arange(12.0, dtype=torch.float64).reshape(6, 2)
    w = torch.zeros(2, dtype=torch.float64)
    grads, size = slice_gradients(quadratic_loss, {"w": w}, {"x": x}, 3)
    full = torch.func.grad(quadratic_loss)({"w": w}, {"x": x})["w"]
    assert size == 2
    assert torch.allclose(torch.stack(grads).mean(0), full)


def test_zero_or_negative_true_gradient_gives_nan_not_infinity() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 4, generator=g, dtype=torch.float64)
    w = x.mean(dim=0)  # the whole-batch gradient is exactly zero: |G|^2 estimate < 0
    grads, size = slice_gradients(quadratic_loss, {"w": w}, {"x": x}, 8)
    est = noise_scale(grads, size)
    assert est.grad_norm_sq < 0
    assert math.isnan(est.gns)
    same = noise_scale([torch.zeros(3), torch.zeros(3)], 4)  # no gradient and no noise: 0/0
    assert math.isnan(same.gns)
    with pytest.raises(ValueError):
        noise_scale([torch.zeros(3)], 4)


def test_probe_on_ppo_loss() -> None:
    torch.manual_seed(0)
    core = PPO(BOX, PPOConfig(hidden_sizes=(8,)))
    learner = FakeLearner(core, ppo_rollout(64, 8, np.random.default_rng(0)))
    ctx = PluginContext(name="gns", config={"name": "gns", "every": 1, "samples": 512,
                                            "slices": 8, "at": "after"},
                        plan={}, run_id="t", run_dir=None, seed=0, bus=None)
    values = GnsProbe(ctx).measure(ProbeContext(round=1, learner=learner, batches=[], seed=0))
    assert set(values) == {"gns", "grad_norm_sq", "trace_sigma", "gns_samples"}
    assert values["gns_samples"] == 64 * 8  # its work, what a time model bills it by
    assert math.isfinite(values["trace_sigma"]) and values["trace_sigma"] > 0
    assert math.isnan(values["gns"]) or values["gns"] >= 0


def test_the_noise_is_measured_where_the_update_started() -> None:
    """After ten epochs on a batch its own gradient is near zero, so measured there |G|^2 is
    mostly noise (it read negative on every round of a Hopper run); at the parameters the
    update started from it is the signal the update followed."""
    torch.manual_seed(0)
    core = PPO(BOX, PPOConfig(hidden_sizes=(16,), update_epochs=10, num_minibatches=8))
    rollout = ppo_rollout(128, 8, np.random.default_rng(0))
    learner = FakeLearner(core, rollout)

    def probe(at: str) -> dict[str, float]:
        ctx = PluginContext(name="gns", config={"name": "gns", "every": 1, "samples": 0,
                                                "slices": 8, "at": at},
                            plan={}, run_id="t", run_dir=None, seed=0, bus=None)
        return GnsProbe(ctx).measure(ProbeContext(round=1, learner=learner, batches=[],
                                                  seed=0))

    assert probe("before") == {}  # no update yet: nothing to measure at its start
    core.update(rollout, progress=0.0)
    before, after = probe("before"), probe("after")
    assert before["grad_norm_sq"] > 0 and math.isfinite(before["gns"])
    assert before["grad_norm_sq"] > 4 * max(after["grad_norm_sq"], 0.0)
