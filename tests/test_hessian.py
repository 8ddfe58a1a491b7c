"""Hessian probe: Lanczos extremes against dense Hessians, early stopping, the rho guards, and
the plugin on PPO's own loss."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import pytest
import torch

from algos.hessian import density_summary, flat_hvp_fn, hessian_ratio, lanczos
from algos.ppo import PPO, PPOConfig
from kernel.roles import PluginContext, ProbeContext
from plugins.probe_hessian import HessianProbe

BOX = {
    "obs_shape": [3],
    "obs_dtype": "float32",
    "action": {"kind": "box", "shape": [2], "low": [-1.0, -1.0], "high": [1.0, 1.0]},
}


def flat_loss(f: Any, params: dict[str, torch.Tensor]) -> tuple[Any, torch.Tensor]:
    """The same loss as a function of one flat vector (what the dense Hessian needs)."""
    names = list(params)
    shapes = [params[k].shape for k in names]
    sizes = [params[k].numel() for k in names]

    def g(v: torch.Tensor) -> torch.Tensor:
        parts = torch.split(v, sizes)
        return f({k: p.reshape(s) for k, p, s in zip(names, parts, shapes, strict=True)})

    return g, torch.cat([params[k].reshape(-1) for k in names])


def dense_extremes(f: Any, params: dict[str, torch.Tensor]) -> tuple[float, float]:
    g, flat = flat_loss(f, params)
    h = torch.autograd.functional.hessian(g, flat).double()
    assert torch.allclose(h, h.T, atol=1e-5)
    ev = torch.linalg.eigvalsh((h + h.T) / 2)
    return float(ev[-1]), float(ev[0])


def test_lanczos_extremes_match_dense_hessian_of_small_network() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(64, 5), torch.randn(64, 1)
    params = {k: v.detach().clone() for k, v in net.named_parameters()}

    def f(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return ((torch.func.functional_call(net, p, (x,)) - y) ** 2).mean()

    lam_max, lam_min = dense_extremes(f, params)
    assert lam_min < 0 < lam_max  # indefinite: the interesting case for rho
    matvec, dim = flat_hvp_fn(f, params)
    result = lanczos(matvec, dim, tol=1e-6, generator=torch.Generator().manual_seed(1))
    assert result.converged
    assert result.lambda_max == pytest.approx(lam_max, rel=1e-4, abs=1e-6)
    assert result.lambda_min == pytest.approx(lam_min, rel=1e-4, abs=1e-6)
    assert float(result.weights.sum()) == pytest.approx(1.0)


def test_lanczos_stops_once_extremes_converge() -> None:
    # A known spectrum of 400 eigenvalues with well separated extremes: Lanczos needs far fewer
    # than 100 steps, and the full-reorthogonalised run must not produce ghost extremes.
    rng = np.random.default_rng(0)
    spectrum = np.concatenate([[-3.0], rng.uniform(-1, 1, 398), [5.0]])
    q, _ = np.linalg.qr(rng.standard_normal((400, 400)))
    a = torch.as_tensor(q @ np.diag(spectrum) @ q.T)
    result = lanczos(lambda v: a @ v, 400, max_steps=100, tol=1e-4,
                     generator=torch.Generator().manual_seed(0))
    assert result.converged
    assert result.steps < 60
    assert result.lambda_max == pytest.approx(5.0, rel=1e-3)
    assert result.lambda_min == pytest.approx(-3.0, rel=1e-3)
    density = density_summary(result)
    assert 0 < density["density_negative_weight"] < 1


def test_lanczos_on_tiny_operator_stops_at_its_dimension() -> None:
    a = torch.diag(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))
    result = lanczos(lambda v: a @ v, 3, generator=torch.Generator().manual_seed(0))
    assert result.steps <= 3 and result.converged
    assert (result.lambda_min, result.lambda_max) == (pytest.approx(-2.0), pytest.approx(1.0))


def test_hessian_ratio_guards() -> None:
    assert hessian_ratio(4.0, -2.0) == 2.0
    assert hessian_ratio(4.0, 2.0) == -2.0  # positive definite: computed, negative
    assert math.isnan(hessian_ratio(4.0, 0.0))
    assert math.isnan(hessian_ratio(4.0, -1e-9))  # numerically zero against lambda_max
    assert math.isnan(hessian_ratio(math.nan, -1.0))
    assert math.isnan(hessian_ratio(1.0, math.inf))
    assert math.isnan(hessian_ratio(0.0, 0.0))


class FakeLearner:
    """What the probe reads from ``plugins.learner.OnPolicyLearner`` after an update."""

    def __init__(self, core: PPO, rollout: dict[str, np.ndarray]):
        self.core = core
        self.last_rollout = rollout
        self._lock = threading.Lock()


def ppo_rollout(t: int, e: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((t, e, 3)).astype(np.float32),
        "actions": rng.standard_normal((t, e, 2)).astype(np.float32),
        "logprobs": (rng.standard_normal((t, e)) - 2.5).astype(np.float32),
        "values": rng.standard_normal((t, e)).astype(np.float32),
        "rewards": rng.standard_normal((t, e)).astype(np.float32),
        "terminated": rng.random((t, e)) < 0.05,
        "truncated": np.zeros((t, e), dtype=bool),
        "bootstrap_values": np.zeros((t, e), dtype=np.float32),
        "last_obs": rng.standard_normal((e, 3)).astype(np.float32),
        "last_values": rng.standard_normal(e).astype(np.float32),
    }


def make_probe(**config: Any) -> HessianProbe:
    ctx = PluginContext(name="hessian", config={"name": "hessian", "every": 1, **config},
                        plan={}, run_id="t", run_dir=None, seed=0, bus=None)
    return HessianProbe(ctx)


def test_probe_matches_dense_hessian_of_ppo_loss() -> None:
    torch.manual_seed(0)
    core = PPO(BOX, PPOConfig(hidden_sizes=(4,), ent_coef=0.01))
    learner = FakeLearner(core, ppo_rollout(32, 4, np.random.default_rng(0)))
    probe = make_probe(samples=96, tol=1e-7, max_steps=200, density=True)
    values = probe.measure(ProbeContext(round=1, learner=learner, batches=[], seed=3))

    # The same subsample and loss, differentiated densely.
    batch = core.make_batch(learner.last_rollout)
    idx = torch.randperm(128, generator=torch.Generator().manual_seed(3))[:96]
    mb = {k: v[idx] for k, v in batch.items()}
    params = {k: v.detach().clone() for k, v in core.model.named_parameters()}
    lam_max, lam_min = dense_extremes(lambda p: core.loss(mb, p)[0], params)

    assert values["lambda_max"] == pytest.approx(lam_max, rel=1e-3, abs=1e-5)
    assert values["lambda_min"] == pytest.approx(lam_min, rel=1e-3, abs=1e-5)
    assert values["hessian_ratio"] == pytest.approx(-lam_max / lam_min, rel=1e-2)
    assert 1 <= values["lanczos_steps"] <= 200
    assert "density_negative_weight" in values
    # The probe works on copies: the model is untouched.
    for k, v in core.model.named_parameters():
        assert torch.equal(v, params[k])


def test_probe_without_an_update_reports_nothing() -> None:
    learner = FakeLearner(PPO(BOX, PPOConfig(hidden_sizes=(4,))), {})
    learner.last_rollout = None  # type: ignore[assignment]
    assert make_probe().measure(ProbeContext(round=1, learner=learner, batches=[], seed=0)) == {}
