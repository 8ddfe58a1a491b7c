"""Hessian probe: Lanczos extremes against dense Hessians, early stopping, the rho guards, and
the plugin on PPO's own loss."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import pytest
import torch

from algos.hessian import (
    basis_plan,
    density_summary,
    flat_hvp_fn,
    hessian_ratio,
    hessian_ratio_prototype,
    lanczos,
)
from algos.policy import ActorPolicy
from algos.ppo import PPO, PPOConfig
from envs import Sampler, describe
from kernel.roles import PluginContext, ProbeContext
from kernel.schema import validate_table
from plugins.descriptors.boost import HESSIAN_CONFIG
from plugins.learners.onpolicy import ROLLOUT_KEYS
from plugins.probes.hessian import HessianProbe

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


def test_regularised_ratio_is_finite_bounded_and_rises_into_the_convex_side() -> None:
    eps = 1e-2
    # Clearly resolved negative curvature: the paper's -lambda_max / lambda_min, to ~eps.
    assert hessian_ratio(4.0, -2.0, eps) == pytest.approx(2.0, rel=2 * eps)
    assert hessian_ratio(10.0, -1.0, eps) == pytest.approx(10.0, rel=20 * eps)
    # Scale-free: a Hessian times c > 0 has the same rho.
    assert hessian_ratio(400.0, -200.0, eps) == pytest.approx(hessian_ratio(4.0, -2.0, eps))
    # From indefinite through lambda_min = 0 into convex: finite, below 1/eps, and rising all
    # the way (no explosion at 0 and no sign flip past it).
    lam_mins = [-4.0, -1.0, -0.1, -1e-3, -1e-9, 0.0, 1e-9, 1e-3, 0.1, 1.0, 4.0]
    rhos = [hessian_ratio(4.0, m, eps) for m in lam_mins]
    assert all(math.isfinite(r) and 0 < r <= 1 / eps for r in rhos), rhos
    assert all(b > a for a, b in zip(rhos, rhos[1:], strict=False)), rhos
    assert rhos[-1] == pytest.approx(1 / eps, rel=1e-6)  # the most convex: the top of the scale
    # Concave and empty spectra read low, never NaN.
    assert hessian_ratio(-1.0, -4.0, eps) < 0
    assert hessian_ratio(0.0, 0.0, eps) == 0.0
    assert math.isnan(hessian_ratio(math.nan, -1.0))  # nothing measured
    assert math.isnan(hessian_ratio(1.0, math.inf))


def test_prototype_ratio_is_the_prototype_formula() -> None:
    assert hessian_ratio_prototype(4.0, -2.0) == pytest.approx(-(4.01) / (-2.01))
    assert hessian_ratio_prototype(4.0, 0.0) == pytest.approx(401.0)  # explodes near 0
    assert hessian_ratio_prototype(4.0, 1.0) < 0  # and flips sign for a convex round
    assert math.isnan(hessian_ratio_prototype(4.0, 0.01))  # 0 denominator: no crash, NaN
    assert math.isnan(hessian_ratio_prototype(math.nan, -1.0))


def spiked_spectrum(n: int, seed: int) -> torch.Tensor:
    """{100, 40, 10, -0.05} and a bulk in U(-0.03, 0.03): lambda_min 2,000 times smaller than
    lambda_max, and only 0.02 from the bulk."""
    rng = np.random.default_rng(seed)
    return torch.as_tensor(np.concatenate([[100.0, 40.0, 10.0, -0.05],
                                           rng.uniform(-0.03, 0.03, n - 4)]))


def test_lanczos_converges_a_small_lambda_min_on_its_own_scale() -> None:
    # Diagonal: a Gaussian start vector makes Lanczos blind to the eigenbasis, so a rotated
    # matrix would behave the same in distribution at 2000 times the cost per product.
    # (A stop test relative to the largest Ritz value stops here after 8 steps with rho
    # between 2,100 and 3,700 depending on the start vector.)
    n = 2000
    spectrum = spiked_spectrum(n, 0)
    steps = []
    for seed in range(10):
        result = lanczos(lambda v: spectrum * v, n, tol=1e-2,
                         generator=torch.Generator().manual_seed(seed))
        rho = -result.lambda_max / result.lambda_min
        assert result.converged
        assert rho == pytest.approx(2000.0, rel=0.05), (seed, result.lambda_min, result.steps)
        assert hessian_ratio(result.lambda_max, result.lambda_min) == pytest.approx(
            hessian_ratio(100.0, -0.05), rel=0.05)
        steps.append(result.steps)
    assert max(steps) <= 40, steps  # a converged run, not a 100-step one


def test_lanczos_stops_at_its_time_cap_unconverged() -> None:
    spectrum = spiked_spectrum(2000, 0)
    result = lanczos(lambda v: spectrum * v, 2000, tol=1e-2, max_seconds=1e-9,
                     generator=torch.Generator().manual_seed(0))
    assert result.steps == 1 and not result.converged


def test_lanczos_basis_stays_within_its_memory_cap_on_a_cnn_sized_problem() -> None:
    # The Nature CNN actor-critic of an Atari run: ~1.7 M parameters. Uncapped, 100 float64
    # basis vectors would take 1.35 GB; capped at 64 MiB the basis is float32 and shorter.
    from algos.ppo import PPO as _PPO

    pixels = {"obs_shape": [4, 84, 84], "obs_dtype": "uint8",
              "action": {"kind": "discrete", "n": 6}}
    dim = sum(p.numel() for p in _PPO(pixels).model.parameters())
    assert dim > 1_500_000
    cap = 64 * 2**20
    assert basis_plan(dim, 100, cap)[1] == torch.float32
    spectrum = torch.linspace(-0.5, 0.5, dim, dtype=torch.float32)
    spectrum[0], spectrum[-1] = -2.0, 8.0
    result = lanczos(lambda v: spectrum * v, dim, max_steps=100, tol=1e-2,
                     generator=torch.Generator().manual_seed(0), max_basis_bytes=cap)
    assert result.basis_bytes <= cap
    assert result.steps <= cap // (4 * dim)
    assert result.lambda_max == pytest.approx(8.0, rel=1e-2)
    assert result.lambda_min == pytest.approx(-2.0, rel=1e-2)


class FakeLearner:
    """What the probe reads from ``plugins.learners.onpolicy.OnPolicyLearner`` after an update."""

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
    """The probe as a plan builds it: the descriptor's defaults filled in."""
    cfg = validate_table("probes.0", {"name": "hessian", "every": 1, **config}, HESSIAN_CONFIG,
                         allow_extra=True)
    ctx = PluginContext(name="hessian", config=cfg, plan={}, run_id="t", run_dir=None, seed=0,
                        bus=None)
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
    assert values["hessian_ratio"] == pytest.approx(hessian_ratio(lam_max, lam_min), rel=1e-2)
    assert values["hessian_ratio_prototype"] == pytest.approx(
        hessian_ratio_prototype(lam_max, lam_min), rel=1e-2)
    assert values["hessian_converged"] == 1.0 and values["hessian_samples"] == 96
    assert 1 <= values["lanczos_steps"] <= 200
    assert "density_negative_weight" in values
    # The probe works on copies: the model is untouched.
    for k, v in core.model.named_parameters():
        assert torch.equal(v, params[k])


def test_probe_without_an_update_reports_nothing() -> None:
    learner = FakeLearner(PPO(BOX, PPOConfig(hidden_sizes=(4,))), {})
    learner.last_rollout = None  # type: ignore[assignment]
    assert make_probe().measure(ProbeContext(round=1, learner=learner, batches=[], seed=0)) == {}


HOPPER = {"id": "Hopper-v5", "num_envs": 2, "normalize_obs": True, "normalize_reward": True,
          "gamma": 0.99}


def test_probe_differentiates_the_loss_the_update_optimised() -> None:
    # A real Hopper rollout and a real decoupled update. Rebuilding the batch afterwards would
    # take the proximal log-probabilities from the updated model: a PPO ratio of exactly 1,
    # where the clip never acts and the curvature is not the optimised loss's.
    torch.manual_seed(0)
    core = PPO(describe(HOPPER), PPOConfig(update_epochs=4, num_minibatches=4))
    assert core.config.decoupled
    policy = ActorPolicy(core.actor_spec())
    policy.load(core.weights())
    with Sampler(HOPPER, seed=0) as sampler:
        sampled = sampler.sample(policy, 128)
    rollout = {k: sampled[k] for k in ROLLOUT_KEYS}
    optimised = core.make_batch(rollout)  # what the update builds, before it moves the model
    core.update(rollout, progress=0.0)

    learner = FakeLearner(core, rollout)
    at = make_probe(samples=0).loss_at(ProbeContext(round=1, learner=learner, batches=[],
                                                    seed=0))
    assert at is not None
    loss_fn, params, batch = at
    for k, v in optimised.items():
        torch.testing.assert_close(batch[k], v, msg=k)
    with torch.no_grad():
        _, parts = core.loss(batch, params)
        ratio_gap = (core.model(batch["obs"], batch["actions"])[1] - batch["logprobs"]).abs()
    assert float(ratio_gap.max()) > 1e-3 and parts["approx_kl"].item() > 1e-6
    # The probe's loss is the learner's loss on the data it optimised, at the new parameters.
    torch.testing.assert_close(loss_fn(params), core.loss(optimised, params)[0])
    torch.testing.assert_close(loss_fn(params), core.loss(optimised)[0])


def test_probe_reports_every_value_each_round_from_a_warm_start() -> None:
    torch.manual_seed(0)
    core = PPO(describe(HOPPER), PPOConfig(update_epochs=1, num_minibatches=4))
    policy = ActorPolicy(core.actor_spec())
    probe = make_probe(samples=192)
    with Sampler(HOPPER, seed=1) as sampler:
        for round_number in (1, 2):
            policy.load(core.weights())
            sampled = sampler.sample(policy, 128)
            rollout = {k: sampled[k] for k in ROLLOUT_KEYS}
            core.update(rollout, progress=0.0)
            values = probe.measure(ProbeContext(round=round_number,
                                                learner=FakeLearner(core, rollout),
                                                batches=[], seed=round_number))
            assert set(values) == {"hessian_ratio", "hessian_ratio_prototype", "lambda_max",
                                   "lambda_min", "lanczos_steps", "hessian_converged",
                                   "hessian_samples"}
            assert all(math.isfinite(v) for v in values.values()), values
            assert values["hessian_converged"] == 1.0 and values["hessian_samples"] == 192
            assert values["lambda_min"] < 0 < values["lambda_max"]
            assert values["hessian_ratio"] == pytest.approx(
                hessian_ratio(values["lambda_max"], values["lambda_min"]))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("hidden", [(4,), (8,), (6, 6), (12,)])
def test_probe_at_its_defaults_agrees_with_a_dense_eigendecomposition(hidden: tuple,
                                                                      seed: int) -> None:
    """What a user gets without tuning: the probe's default stop test (tol 1e-2 relative to
    each extreme) gives rho within 5 % of the dense Hessian's on small PPO networks, over
    several draws of weights and batch."""
    torch.manual_seed(seed)
    core = PPO(BOX, PPOConfig(hidden_sizes=hidden, ent_coef=0.01))
    learner = FakeLearner(core, ppo_rollout(32, 4, np.random.default_rng(seed)))
    values = make_probe().measure(ProbeContext(round=1, learner=learner, batches=[], seed=seed))
    batch = core.make_batch(learner.last_rollout)  # 128 samples: the probe takes them all
    params = {k: v.detach().clone() for k, v in core.model.named_parameters()}
    lam_max, lam_min = dense_extremes(lambda p: core.loss(batch, p)[0], params)
    assert values["hessian_ratio"] == pytest.approx(hessian_ratio(lam_max, lam_min), rel=0.05)
