"""The Nature-CNN trunk in bfloat16 (``cnn_dtype``): float32 weights and outputs, and the same
learning signal as float32 within bfloat16's rounding, for PPO's and APPO's losses.

Speed is measured in perf/learner_bench.py, not here: it depends on whether the CPU has AMX.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from algos.appo import APPO, APPOConfig
from algos.nets import NatureCNN
from algos.ppo import PPO, PPOConfig
from kernel.plan import load_plan
from kernel.schema import PlanError
from tests.conftest import ROOT

SPACES = {"obs_shape": [4, 84, 84], "obs_dtype": "uint8", "action": {"kind": "discrete", "n": 6}}


def pixel_rollout(steps: int = 16, envs: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.integers(0, 255, (steps, envs, 4, 84, 84), dtype=np.uint8),
        "actions": rng.integers(0, 6, (steps, envs)),
        "logprobs": np.full((steps, envs), -np.log(6.0), np.float32),
        "values": rng.normal(size=(steps, envs)).astype(np.float32),
        "rewards": rng.choice([-1.0, 0.0, 1.0], (steps, envs)).astype(np.float32),
        "terminated": rng.random((steps, envs)) < 0.05,
        "truncated": np.zeros((steps, envs), bool),
        "bootstrap_values": np.zeros((steps, envs), np.float32),
        "last_obs": rng.integers(0, 255, (envs, 4, 84, 84), dtype=np.uint8),
        "last_values": np.zeros(envs, np.float32),
    }


def test_a_bfloat16_trunk_keeps_float32_weights_and_gives_float32_features_close_to_them(
        ) -> None:
    torch.manual_seed(0)
    exact = NatureCNN()
    rounded = NatureCNN(compute_dtype="bfloat16")
    rounded.load_state_dict(exact.state_dict())
    frames = torch.randint(0, 255, (8, 4, 84, 84), dtype=torch.uint8)
    want, got = exact(frames), rounded(frames)
    assert got.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in rounded.parameters())
    assert torch.linalg.vector_norm(got - want) < 0.03 * torch.linalg.vector_norm(want)


def test_an_unknown_compute_dtype_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="float16"):
        NatureCNN(compute_dtype="float16")


def _flat_grad(core: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    loss, _ = core.loss(batch)
    grads = torch.autograd.grad(loss, [p for p in core.model.parameters()])
    return torch.cat([g.reshape(-1) for g in grads])


@pytest.mark.parametrize("make", [
    lambda dtype: PPO(SPACES, PPOConfig(cnn_dtype=dtype)),
    lambda dtype: APPO(SPACES, APPOConfig(cnn_dtype=dtype)),
], ids=["ppo", "appo"])
def test_the_loss_gradient_in_bfloat16_points_where_float32_does(make: Any) -> None:
    """The update follows this gradient: if bfloat16's rounding turned it, learning would
    change. The same weights and batch in both dtypes give gradients whose cosine is ~1."""
    torch.manual_seed(0)
    exact, rounded = make("float32"), make("bfloat16")
    rounded.load_state_dict(exact.state_dict())
    rollout = pixel_rollout()
    g32 = _flat_grad(exact, exact.make_batch(rollout))
    g16 = _flat_grad(rounded, rounded.make_batch(rollout))
    cosine = torch.nn.functional.cosine_similarity(g32, g16, dim=0)
    assert cosine > 0.99, float(cosine)
    assert torch.linalg.vector_norm(g16) == pytest.approx(
        float(torch.linalg.vector_norm(g32)), rel=0.05)
    # And an update in bfloat16 trains: the weights move and every diagnostic is finite.
    before = rounded.weights()
    metrics = rounded.update(rollout, progress=0.0)
    assert all(np.isfinite(v) for k, v in metrics.items() if k != "explained_variance")
    assert any(not np.allclose(before[k], v) for k, v in rounded.weights().items())


@pytest.mark.parametrize("plan_name", ["pong-appo.toml", "pong-ppo.toml"])
@pytest.mark.parametrize("field,other", [("cnn_dtype", "bfloat16"), ("actor_dtype", "int8")])
def test_a_plan_names_the_compute_dtype_or_fails_before_work_starts(plan_name: str, field: str,
                                                                   other: str) -> None:
    plan = ROOT / "plans" / plan_name
    assert load_plan(plan)["algo"][field] == "float32"
    assert load_plan(plan, [f"algo.{field}={other}"])["algo"][field] == other
    with pytest.raises(PlanError, match=field):
        load_plan(plan, [f"algo.{field}=half"])
