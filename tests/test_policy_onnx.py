"""The ONNX Runtime Nature-CNN policy: the learner's outputs on real Pong frames, the softmax's
samples, replayable noise, channels-last learner frames, and a pixel actor without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from algos.policy_onnx import CNNPolicy, onnx_available
from algos.ppo import PPO
from envs import make_vector_env
from tests.test_algos_ppo import DISCRETE, PIXELS

pytestmark = pytest.mark.skipif(not onnx_available(), reason="the optional onnx extra is absent")
ROOT = Path(__file__).resolve().parents[1]


def pong_frames(n: int = 8) -> np.ndarray:
    """Real preprocessed Pong observations a few random steps into a game."""
    envs = make_vector_env({"id": "ALE/Pong-v5", "num_envs": n}, seed=0)
    obs, _ = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(40):
        obs, *_ = envs.step(rng.integers(0, 6, n))
    envs.close()
    return np.array(obs)


def loaded(**scale: float) -> tuple[PPO, CNNPolicy]:
    torch.manual_seed(0)
    ppo = PPO(PIXELS)
    with torch.no_grad():
        ppo.model.actor.weight.mul_(scale.get("actor", 1.0))
    policy = CNNPolicy(ppo.actor_spec())
    policy.load(ppo.weights())
    return ppo, policy


def test_outputs_match_the_learner_on_pong_frames() -> None:
    ppo, policy = loaded(actor=100.0)  # logits far from uniform, so a wrong head shows
    obs = pong_frames()
    assert obs.dtype == np.uint8 and obs.shape == (8, *PIXELS["obs_shape"])
    with torch.no_grad():
        logits, values = ppo.model.heads(torch.from_numpy(obs))
    out, value = policy.heads(obs)
    np.testing.assert_allclose(out, logits.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(value, values.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(policy.act_deterministic(obs), logits.argmax(-1).numpy())
    np.testing.assert_allclose(policy.value(obs), values.numpy(), rtol=1e-4, atol=1e-5)


def test_samples_follow_the_softmax_and_score_like_the_learner() -> None:
    ppo, policy = loaded(actor=100.0)
    obs = np.repeat(pong_frames(1), 4000, axis=0)
    policy.reseed(3)
    actions, extras = policy.act(obs)
    _, logprob, _, value = ppo.model(torch.from_numpy(obs[:50]), torch.from_numpy(actions[:50]))
    np.testing.assert_allclose(extras["logprobs"][:50], logprob.detach().numpy(), atol=1e-4)
    np.testing.assert_allclose(extras["values"][:50], value.detach().numpy(), atol=1e-4)
    with torch.no_grad():
        probs = torch.softmax(ppo.model.heads(torch.from_numpy(obs[:1]))[0], -1)[0].numpy()
    freq = np.bincount(actions, minlength=6) / len(actions)
    sigma = np.sqrt(probs * (1 - probs) / len(actions))
    assert np.all(np.abs(freq - probs) <= 4 * sigma + 1e-6), (freq, probs)


def test_reseeding_replays_the_actions() -> None:
    _, policy = loaded()
    obs = pong_frames()
    policy.reseed(7)
    first = policy.act(obs)[0]
    policy.reseed(7)
    np.testing.assert_array_equal(policy.act(obs)[0], first)


def test_vector_specs_and_missing_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="pixel"):
        CNNPolicy(PPO(DISCRETE).actor_spec())
    policy = CNNPolicy(PPO(PIXELS).actor_spec())
    with pytest.raises(RuntimeError, match="load weights"):
        policy.act(pong_frames(1))
    policy.load(PPO(PIXELS).weights())
    with pytest.raises(ValueError, match="uint8"):
        policy.act(pong_frames(1).astype(np.float32))
    weights: dict[str, Any] = PPO(PIXELS).weights()
    del weights["trunk.convs.2.weight"]
    with pytest.raises(KeyError, match="trunk.convs.2.weight"):
        policy.load(weights)


def test_a_pixel_actor_never_imports_torch(tmp_path: Path) -> None:
    """A cold serverless actor would pay ~1 s for `import torch`; the ONNX policy avoids it."""
    np.savez(tmp_path / "w.npz", **PPO(PIXELS).weights())
    script = f"""
import sys
import numpy as np
from algos.policy_onnx import CNNPolicy
from envs import Sampler
spec = {{"spaces": {PIXELS!r}, "net": {{"hidden_sizes": [64, 64], "activation": "tanh"}}}}
policy = CNNPolicy(spec)
policy.load(dict(np.load({str(tmp_path / "w.npz")!r})))
env = {{"id": "ALE/Pong-v5", "num_envs": 2, "normalize_obs": False, "normalize_reward": False}}
rollout = Sampler(env, seed=0).sample(policy, 16)
assert rollout["actions"].shape == (16, 2) and rollout["obs"].dtype == np.uint8
assert "torch" not in sys.modules, "torch was imported"
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def int8_spec(spec: dict[str, Any]) -> dict[str, Any]:
    return {**spec, "net": {**spec["net"], "actor_dtype": "int8"}}


def test_the_int8_policy_stays_close_to_the_learner_on_pong_frames() -> None:
    """8-bit products move the logits by a small fraction of their spread: the policy is the
    learner's within a KL far below a PPO update's, with the same greedy actions."""
    ppo, exact = loaded(actor=100.0)
    policy = CNNPolicy(int8_spec(ppo.actor_spec()))
    policy.load(ppo.weights())
    obs = pong_frames(16)
    policy.heads(obs[:4])  # calibration, on frames of the same games
    out, value = policy.heads(obs)
    ref_out, ref_value = exact.heads(obs)
    assert np.abs(out - ref_out).max() <= 0.05 * np.ptp(ref_out)
    assert np.abs(value - ref_value).max() <= 0.2 * np.ptp(ref_value) + 1e-3

    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    ref_logp, logp = log_softmax(ref_out), log_softmax(out)
    kl = (np.exp(ref_logp) * (ref_logp - logp)).sum(-1)
    assert kl.max() < 1e-3, kl
    np.testing.assert_array_equal(out.argmax(-1), ref_out.argmax(-1))


def test_the_int8_policy_calibrates_on_the_first_batch_of_each_weights_version() -> None:
    """The first batch after a load runs in float32 (it is the calibration), so its outputs are
    the learner's exactly; a new version is calibrated again rather than kept at old scales."""
    ppo, exact = loaded(actor=100.0)
    policy = CNNPolicy(int8_spec(ppo.actor_spec()))
    obs = pong_frames(8)
    for step in range(2):
        if step:
            with torch.no_grad():
                ppo.model.trunk.convs[0].weight.mul_(3.0)  # activations three times larger
            exact.load(ppo.weights())
        policy.load(ppo.weights())
        np.testing.assert_array_equal(policy.heads(obs)[0], exact.heads(obs)[0])
        assert np.abs(policy.heads(obs)[0] - exact.heads(obs)[0]).max() \
            <= 0.05 * np.ptp(exact.heads(obs)[0])


def test_the_folded_first_convolution_is_the_same_convolution() -> None:
    """SpaceToDepth + the rearranged kernel at stride 1 computes the stride-4 convolution."""
    from algos.onnx_graphs import _space_to_depth_kernel

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 84, 84)).astype(np.float32)
    w = rng.standard_normal((32, 4, 8, 8)).astype(np.float32)
    folded = x.reshape(2, 4, 21, 4, 21, 4).transpose(0, 3, 5, 1, 2, 4).reshape(2, 64, 21, 21)
    direct = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=4)
    via_depth = torch.nn.functional.conv2d(torch.from_numpy(folded),
                                           torch.from_numpy(_space_to_depth_kernel(w, 4)))
    torch.testing.assert_close(via_depth, direct, rtol=1e-4, atol=1e-4)


def test_an_unknown_actor_dtype_is_refused_and_evaluation_stays_exact() -> None:
    from plugins.registry_access import actor_policy

    spec = PPO(PIXELS).actor_spec()
    with pytest.raises(ValueError, match="actor_dtype"):
        CNNPolicy({**spec, "net": {**spec["net"], "actor_dtype": "float16"}})
    sampling = {**int8_spec(spec), "algo": "ppo"}
    assert actor_policy(sampling).dtype == "int8"
    assert actor_policy(sampling, exact=True).dtype == "float32"


def test_a_blank_calibration_batch_keeps_float32_rather_than_saturating() -> None:
    """Frames that leave a layer at zero give no scale: that version samples in float32."""
    ppo, exact = loaded(actor=100.0)
    with torch.no_grad():
        ppo.model.trunk.convs[0].bias.fill_(-10.0)  # a black frame leaves every unit at 0
    exact.load(ppo.weights())
    policy = CNNPolicy(int8_spec(ppo.actor_spec()))
    policy.load(ppo.weights())
    policy.heads(np.zeros((2, *PIXELS["obs_shape"]), dtype=np.uint8))
    obs = pong_frames(8)
    np.testing.assert_array_equal(policy.heads(obs)[0], exact.heads(obs)[0])


def test_a_channel_of_zero_weights_still_adds_its_bias_in_int8() -> None:
    ppo, exact = loaded(actor=100.0)
    with torch.no_grad():
        ppo.model.trunk.convs[2].weight[3].zero_()
        ppo.model.trunk.convs[2].bias[3] = 0.5
        ppo.model.trunk.fc[0].weight[7].zero_()
        ppo.model.trunk.fc[0].bias[7] = 2.0
    exact.load(ppo.weights())
    policy = CNNPolicy(int8_spec(ppo.actor_spec()))
    policy.load(ppo.weights())
    obs = pong_frames(8)
    policy.heads(obs)
    out, ref = policy.heads(obs)[0], exact.heads(obs)[0]
    assert np.abs(out - ref).max() <= 0.05 * np.ptp(ref)
