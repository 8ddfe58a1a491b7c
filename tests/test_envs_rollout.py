"""envs/: rollout table shapes, episode tracking across fragments, truncation bootstrap,
running statistics and env-id checks. Uses a numpy stub policy (no torch)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers.utils import RunningMeanStd as GymRunningMeanStd

from envs import RunningMeanStd, Sampler, check_env_id, describe, evaluate, moments


class RandomPolicy:
    """Random actions; the value is a fixed function of the obs so bootstraps can be checked."""

    def __init__(self, space: dict, seed: int = 0, action_scale: float = 2.0):
        self.space = space
        self.rng = np.random.default_rng(seed)
        self.action_scale = action_scale

    def value(self, obs: np.ndarray) -> np.ndarray:
        flat = np.asarray(obs, dtype=np.float64).reshape(len(obs), -1)
        return (flat.sum(axis=1) * 0.5 + 1.0).astype(np.float32)

    def _sample(self, n: int) -> np.ndarray:
        action = self.space["action"]
        if action["kind"] == "discrete":
            return self.rng.integers(0, action["n"], size=n, dtype=np.int64)
        # Wider than the [-1, 1] bounds on purpose, to exercise clipping.
        shape = (n, *action["shape"])
        return (self.rng.standard_normal(shape) * self.action_scale).astype(np.float32)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        n = len(obs)
        logprobs = self.rng.standard_normal(n).astype(np.float32)
        return self._sample(n), {"logprobs": logprobs, "values": self.value(obs)}

    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        action = self.space["action"]
        if action["kind"] == "discrete":
            return np.zeros(len(obs), dtype=np.int64)
        return np.zeros((len(obs), *action["shape"]), dtype=np.float32)


def spec(env_id: str, **overrides) -> dict:
    base = {
        "id": env_id,
        "num_envs": 2,
        "kwargs": {},
        "normalize_obs": True,
        "normalize_reward": True,
        "clip_obs": 10.0,
        "gamma": 0.99,
        "max_episode_steps": None,
    }
    return {**base, **overrides}


@pytest.mark.parametrize(
    ("env_id", "obs_shape", "action_shape", "action_dtype"),
    [("CartPole-v1", (4,), (), np.int64), ("Hopper-v5", (11,), (3,), np.float32)],
)
def test_rollout_shapes_and_dtypes(env_id, obs_shape, action_shape, action_dtype):
    env_spec = spec(env_id, num_envs=3)
    space = describe(env_spec)
    assert tuple(space["obs_shape"]) == obs_shape and space["obs_dtype"] == "float32"
    T, E = 16, 3
    with Sampler(env_spec, seed=1) as sampler:
        r = sampler.sample(RandomPolicy(space), T, obs_rms=None)
    expected = {
        "obs": ((T, E, *obs_shape), np.float32),
        "actions": ((T, E, *action_shape), action_dtype),
        "logprobs": ((T, E), np.float32),
        "values": ((T, E), np.float32),
        "rewards": ((T, E), np.float32),
        "terminated": ((T, E), np.bool_),
        "truncated": ((T, E), np.bool_),
        "bootstrap_values": ((T, E), np.float32),
        "last_obs": ((E, *obs_shape), np.float32),
        "last_values": ((E,), np.float32),
    }
    for key, (shape, dtype) in expected.items():
        assert r[key].shape == shape, key
        assert r[key].dtype == dtype, key
    assert r["episode_returns"].dtype == np.float32
    assert r["episode_lengths"].dtype == np.int64
    assert r["obs_stats"]["mean"].shape == obs_shape
    assert r["obs_stats"]["var"].shape == obs_shape
    assert r["obs_stats"]["count"] == T * E
    assert r["ret_stats"]["mean"].shape == () and r["ret_stats"]["count"] == T * E
    if space["action"]["kind"] == "box":
        assert np.abs(r["actions"]).max() > 1.0  # stored unclipped


def test_box_actions_are_clipped_for_the_env_only():
    env_spec = spec("Hopper-v5", num_envs=1, normalize_obs=False, normalize_reward=False)
    space = describe(env_spec)
    with Sampler(env_spec, seed=3) as sampler:
        r = sampler.sample(RandomPolicy(space, seed=5), 10, obs_rms=None)
    assert "obs_stats" not in r and "ret_stats" not in r
    # Replaying the clipped actions in a plain env reproduces the rewards.
    env = gym.make("Hopper-v5")
    obs, _ = env.reset(seed=3)
    np.testing.assert_allclose(r["obs"][0, 0], obs.astype(np.float32))
    for t in range(10):
        _, reward, term, trunc, _ = env.step(np.clip(r["actions"][t, 0], -1.0, 1.0))
        assert np.float32(reward) == r["rewards"][t, 0]
        if term or trunc:
            break
    env.close()


def test_raw_obs_pass_through_and_obs_stats_are_their_moments():
    env_spec = spec("CartPole-v1", clip_obs=1e9)
    space = describe(env_spec)
    with Sampler(env_spec, seed=0) as sampler:
        r = sampler.sample(RandomPolicy(space), 20, obs_rms={})
    ref = moments(r["obs"], sample_ndim=1)
    np.testing.assert_allclose(r["obs_stats"]["mean"], ref["mean"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r["obs_stats"]["var"], ref["var"], rtol=1e-4, atol=1e-7)


def _reference_episodes(rewards: np.ndarray, dones: np.ndarray) -> tuple[list, list]:
    """Episode returns/lengths in the sampler's order (by step, then env index)."""
    ret, length = np.zeros(rewards.shape[1]), np.zeros(rewards.shape[1], dtype=np.int64)
    returns, lengths = [], []
    for t in range(len(rewards)):
        ret += rewards[t]
        length += 1
        for i in np.flatnonzero(dones[t]):
            returns.append(ret[i])
            lengths.append(int(length[i]))
            ret[i], length[i] = 0.0, 0
    return returns, lengths


def test_episodes_tracked_across_fragments():
    env_spec = spec("CartPole-v1", max_episode_steps=10)
    space = describe(env_spec)
    policy = RandomPolicy(space, seed=2)
    with Sampler(env_spec, seed=7) as sampler:
        first = sampler.sample(policy, 7, obs_rms=None)
        second = sampler.sample(policy, 7, obs_rms=None)
    # No step lost or repeated at the boundary: the second fragment starts at last_obs.
    np.testing.assert_array_equal(second["obs"][0], first["last_obs"])
    rewards = np.concatenate([first["rewards"], second["rewards"]])
    dones = np.concatenate(
        [first["terminated"] | first["truncated"], second["terminated"] | second["truncated"]]
    )
    ref_returns, ref_lengths = _reference_episodes(rewards, dones)
    got_returns = np.concatenate([first["episode_returns"], second["episode_returns"]])
    got_lengths = np.concatenate([first["episode_lengths"], second["episode_lengths"]])
    np.testing.assert_allclose(got_returns, ref_returns)
    np.testing.assert_array_equal(got_lengths, ref_lengths)
    # An episode that started in the first fragment is reported once, with its full length.
    assert second["episode_lengths"].max() > 7
    assert len(got_lengths) == len(ref_lengths)


def test_truncation_bootstrap_uses_value_of_normalised_final_obs():
    obs_rms = {"mean": np.array([0.01, -0.02, 0.03, 0.1]), "var": np.full(4, 0.04), "count": 50.0}
    env_spec = spec("CartPole-v1", num_envs=2, max_episode_steps=5, clip_obs=5.0)
    space = describe(env_spec)
    policy = RandomPolicy(space, seed=4)
    T, seed = 12, 11
    with Sampler(env_spec, seed=seed) as sampler:
        r = sampler.sample(policy, T, obs_rms=obs_rms)
    rms = RunningMeanStd.from_dict(obs_rms)
    assert r["truncated"][4].all() and r["truncated"][9].all()
    assert not (r["terminated"] & r["truncated"]).any()
    cut = r["truncated"] & ~r["terminated"]
    np.testing.assert_array_equal(r["bootstrap_values"][~cut], 0.0)
    # Replay each env by hand to get the final observations gymnasium hid in the info.
    for i in range(2):
        env = gym.make("CartPole-v1", max_episode_steps=5)
        obs, _ = env.reset(seed=seed + i)
        for t in range(T):
            np.testing.assert_allclose(r["obs"][t, i], rms.normalize(obs, 5.0), rtol=1e-6)
            obs, _, term, trunc, _ = env.step(int(r["actions"][t, i]))
            assert (term, trunc) == (r["terminated"][t, i], r["truncated"][t, i])
            if trunc and not term:
                expected = policy.value(rms.normalize(obs[None], 5.0))[0]
                assert r["bootstrap_values"][t, i] == pytest.approx(expected, rel=1e-6)
            if term or trunc:
                obs, _ = env.reset()
        env.close()


def test_running_mean_std_merge_matches_whole_update():
    rng = np.random.default_rng(0)
    data = rng.normal(2.0, 5.0, size=(1000, 3))
    whole = RunningMeanStd((3,))
    whole.update(data)
    # Same numbers as gymnasium's own implementation.
    gym_rms = GymRunningMeanStd(shape=(3,))
    gym_rms.update(data)
    np.testing.assert_allclose(whole.mean, gym_rms.mean)
    np.testing.assert_allclose(whole.var, gym_rms.var)
    # Learner statistics + an actor's delta (exact moments, no prior) == one update.
    learner = RunningMeanStd((3,))
    learner.update(data[:400])
    delta = RunningMeanStd.empty((3,))
    delta.update(data[400:700])
    delta.merge(moments(data[700:], sample_ndim=1))
    learner.merge(delta.to_dict())
    np.testing.assert_allclose(learner.mean, whole.mean)
    np.testing.assert_allclose(learner.var, whole.var)
    assert learner.count == pytest.approx(whole.count)
    # Two ordinary halves: equal up to the second prior's 1e-4 pseudo-count.
    a, b = RunningMeanStd((3,)), RunningMeanStd((3,))
    a.update(data[:500])
    b.update(data[500:])
    a.merge(b)
    np.testing.assert_allclose(a.mean, whole.mean, rtol=1e-5)
    np.testing.assert_allclose(a.var, whole.var, rtol=1e-5)
    # Round trip and normalisation.
    copy = RunningMeanStd.from_dict(whole.to_dict())
    assert copy.count == whole.count and copy.mean is not whole.mean
    z = whole.normalize(data[:5], clip=10.0)
    assert z.dtype == np.float32
    np.testing.assert_allclose(
        z, (data[:5] - gym_rms.mean) / np.sqrt(gym_rms.var + 1e-8), rtol=1e-6
    )


def test_check_env_id():
    check_env_id("CartPole-v1")
    with pytest.raises(ValueError, match="CartPole-v1"):
        check_env_id("CartPole-v2")
    check_env_id("ALE/Pong-v5")


def test_evaluate_counts_exactly_the_requested_episodes():
    env_spec = spec("CartPole-v1", max_episode_steps=6)
    space = describe(env_spec)
    returns = evaluate(RandomPolicy(space), env_spec, episodes=11, seed=0, obs_rms=None)
    assert len(returns) == 11
    assert all(0 < x <= 6 for x in returns)


def test_pixel_obs_keep_uint8_without_normalisation():
    env_spec = spec("ALE/Pong-v5", normalize_obs=False)
    space = describe(env_spec)
    assert space["obs_dtype"] == "uint8" and space["action"]["kind"] == "discrete"
    with Sampler(env_spec, seed=0) as sampler:
        r = sampler.sample(RandomPolicy(space), 4, obs_rms=None)
    assert r["obs"].dtype == np.uint8 and r["obs"].shape == (4, 2, *space["obs_shape"])
    assert r["last_obs"].dtype == np.uint8 and "obs_stats" not in r
