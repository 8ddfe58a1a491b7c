"""The numpy MLP policy: right distributions, replayable noise, no torch, clear load errors.

Agreement with the learner's torch model (logprobs, values, modes) is checked for both actor
implementations in `tests/test_algos_ppo.py::test_actor_policy_matches_learner`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from algos.actor import make_actor_policy
from algos.policy import ActorPolicy
from algos.policy_numpy import MLPPolicy
from algos.policy_onnx import CNNPolicy, onnx_available
from algos.ppo import PPO, PPOConfig
from tests.test_algos_ppo import BOX, DISCRETE, PIXELS

ROOT = Path(__file__).resolve().parents[1]


def loaded(spaces: dict[str, Any], **config: Any) -> tuple[PPO, MLPPolicy]:
    torch.manual_seed(0)
    ppo = PPO(spaces, PPOConfig(**config))
    policy = make_actor_policy(ppo.actor_spec())
    assert isinstance(policy, MLPPolicy)
    policy.load(ppo.weights())
    return ppo, policy


def test_the_factory_runs_pixels_on_onnx_runtime_when_installed() -> None:
    """The Nature CNN goes to ONNX Runtime (about twice eager torch's speed at an actor's few
    frames) when the optional extra is there, and to torch otherwise; never to numpy."""
    policy = make_actor_policy(PPO(PIXELS).actor_spec())
    if onnx_available():
        assert isinstance(policy, CNNPolicy)
    else:
        assert isinstance(policy, ActorPolicy)
    with pytest.raises(ValueError, match="pixels"):
        MLPPolicy(PPO(PIXELS).actor_spec())


def test_the_factory_falls_back_to_torch_without_the_onnx_extra(tmp_path: Path) -> None:
    """An install without the extra (simulated by hiding both modules) still gets a pixel
    policy: the torch one."""
    script = """
import sys
sys.modules["onnx"] = None  # a None entry makes importlib report the module as absent
sys.modules["onnxruntime"] = None
from algos.actor import make_actor_policy
from algos.policy import ActorPolicy
from algos.policy_onnx import onnx_available
from algos.ppo import PPO
from tests.test_algos_ppo import PIXELS
assert not onnx_available()
assert type(make_actor_policy(PPO(PIXELS).actor_spec())) is ActorPolicy
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_categorical_samples_follow_the_softmax() -> None:
    ppo, policy = loaded(DISCRETE)
    with torch.no_grad():  # a larger output layer makes the two probabilities differ clearly
        ppo.model.actor[4].weight.mul_(200.0)
    policy.load(ppo.weights())
    obs = np.tile(np.array([[0.5, -1.0, 0.3, 0.8]], dtype=np.float32), (20_000, 1))
    policy.reseed(3)
    actions, extras = policy.act(obs)
    probs = torch.softmax(ppo.model.actor(torch.from_numpy(obs[:1])), -1)[0].detach().numpy()
    assert 0.05 < probs[1] < 0.95
    freq = np.bincount(actions, minlength=2) / len(actions)
    sigma = np.sqrt(probs * (1 - probs) / len(actions))
    assert np.all(np.abs(freq - probs) < 4 * sigma), (freq, probs)
    np.testing.assert_allclose(extras["logprobs"], np.log(probs[actions]), rtol=1e-5)


def test_gaussian_samples_have_the_policy_mean_and_std() -> None:
    ppo, policy = loaded(BOX)
    with torch.no_grad():
        ppo.model.actor_logstd.copy_(torch.tensor([[-0.5, 0.3]]))
    policy.load(ppo.weights())
    obs = np.tile(np.array([[0.1, 0.2, -0.3]], dtype=np.float32), (50_000, 1))
    policy.reseed(4)
    actions, _ = policy.act(obs)
    mean = policy.act_deterministic(obs[:1])[0]
    np.testing.assert_allclose(actions.mean(0), mean, atol=0.02)
    np.testing.assert_allclose(actions.std(0), np.exp([-0.5, 0.3]), rtol=0.02)


def test_reseeding_replays_the_actions() -> None:
    _, policy = loaded(BOX)
    obs = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    policy.reseed(11)
    first = policy.act(obs)[0]
    policy.reseed(11)
    np.testing.assert_array_equal(policy.act(obs)[0], first)
    policy.reseed(12)
    assert not np.array_equal(policy.act(obs)[0], first)


def test_relu_nets_match_the_learner() -> None:
    ppo, policy = loaded(BOX, activation="relu", hidden_sizes=(32, 16, 8))
    obs = np.random.default_rng(1).standard_normal((6, 3)).astype(np.float32)
    with torch.no_grad():
        expected = ppo.model.value(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(policy.value(obs), expected, rtol=1e-5, atol=1e-6)


def test_weights_of_another_shape_are_refused() -> None:
    _, policy = loaded(BOX)
    other = PPO({**BOX, "obs_shape": [5]}, PPOConfig()).weights()
    with pytest.raises(ValueError, match="actor.0"):
        policy.load(other)
    with pytest.raises(RuntimeError, match="load weights"):
        MLPPolicy(PPO(BOX).actor_spec()).act(np.zeros((1, 3), np.float32))


def test_a_vector_actor_never_imports_torch(tmp_path: Path) -> None:
    """A cold serverless actor would pay ~1 s for `import torch`; MLP actors do not need it."""
    np.savez(tmp_path / "w.npz", **PPO(DISCRETE).weights())
    script = f"""
import sys
import numpy as np
from plugins.function import handler
from kernel.registry import default_registry
from envs import Sampler
spec = {{"spaces": {DISCRETE!r}, "net": {{"hidden_sizes": [64, 64], "activation": "tanh"}}}}
policy = default_registry().get("algo", "ppo").load_actor()(spec)
policy.load(dict(np.load({str(tmp_path / "w.npz")!r})))
rollout = Sampler({{"id": "CartPole-v1", "num_envs": 2}}, seed=0).sample(policy, 16)
assert rollout["actions"].shape == (16, 2)
assert "torch" not in sys.modules, "torch was imported"
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
