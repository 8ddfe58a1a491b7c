"""Collecting rollout fragments (the actors' hot path) and evaluating a policy.

A ``Sampler`` outlives a single ``sample`` call: a warm actor keeps its envs mid-episode between
invocations, so episode returns, lengths and the reward-scaling accumulators run across fragment
boundaries exactly as if the fragments were one long rollout. Normalisation statistics are not
owned here: the learner sends a frozen ``obs_rms`` with every call and gets back the moments of
what this fragment saw (docs/contracts.md).

With ``clip_reward`` (the default for Atari ids) the rollout's ``rewards`` are the signs of the
env rewards, while ``episode_returns`` stay the real scores; Atari training envs end an episode
(``terminated``) at every lost life, but an episode return is only reported per whole game.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from envs.atari import GameEnds, is_atari
from envs.make import make_vector_env, resolve_spec, rollout_obs_dtype, split_env_id
from envs.normalize import EPSILON, moments

__all__ = ["Policy", "Sampler", "evaluate"]

#: Sub-env count cap for ``evaluate``: enough to batch inference, few enough for 2 cores.
MAX_EVAL_ENVS = 8


class Policy(Protocol):
    """What the sampler needs from ``algos.policy.ActorPolicy`` (duck-typed, numpy in/out)."""

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sampled actions plus ``{"logprobs": [B], "values": [B]}``."""
        ...

    def value(self, obs: np.ndarray) -> np.ndarray:
        """State values ``[B]``."""
        ...


class _ObsTransform:
    """Frozen observation normalisation, writing into caller-owned buffers.

    Same math as ``RunningMeanStd.normalize`` (float64, ``sqrt(var + 1e-8)``, clip) but with the
    scale precomputed and a reusable float64 scratch, so a step costs three ufunc calls and no
    allocation. ``obs_rms`` None or empty means the identity (mean 0, scale 1), still clipped.
    """

    def __init__(
        self,
        obs_rms: Mapping[str, Any] | None,
        enabled: bool,
        clip: float,
        obs_shape: tuple[int, ...],
        dtype: np.dtype,
        batch: int,
    ):
        self.enabled = enabled
        self.clip = float(clip)
        self.dtype = dtype
        self.mean: np.ndarray | float = 0.0
        self.scale: np.ndarray | float = 1.0
        if enabled and obs_rms:
            mean = np.asarray(obs_rms["mean"], dtype=np.float64)
            if mean.shape != obs_shape:
                raise ValueError(f"obs_rms mean has shape {mean.shape}, observations {obs_shape}")
            self.mean = mean
            self.scale = np.sqrt(np.asarray(obs_rms["var"], dtype=np.float64) + EPSILON)
        self._scratch = np.empty((batch, *obs_shape), dtype=np.float64) if enabled else None

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            out = np.empty(np.shape(x), dtype=self.dtype)
        if not self.enabled:
            np.copyto(out, x, casting="same_kind")
            return out
        scratch = self._scratch
        if scratch is None or scratch.shape != out.shape:
            scratch = np.empty(out.shape, dtype=np.float64)
        np.subtract(x, self.mean, out=scratch)
        np.divide(scratch, self.scale, out=scratch)
        np.clip(scratch, -self.clip, self.clip, out=out)
        return out


def _action_bounds(space: gym.Space) -> tuple[np.ndarray, np.ndarray] | None:
    """Clip bounds for Box actions (None for Discrete): policies sample from unbounded
    Gaussians, and the env must only see in-range actions while the rollout keeps the sample
    (its logprob is the one the learner re-evaluates)."""
    if isinstance(space, gym.spaces.Box):
        return space.low.astype(space.dtype), space.high.astype(space.dtype)
    if isinstance(space, gym.spaces.Discrete):
        return None
    raise ValueError(f"unsupported action space {space}")


class Sampler:
    """Owns one vector env and steps it for ``sample`` calls (see module docstring)."""

    def __init__(self, env_spec: Mapping[str, Any], seed: int):
        self.spec = resolve_spec(env_spec)
        self.envs = make_vector_env(self.spec, seed)
        self.num_envs = int(self.envs.num_envs)
        obs_space = self.envs.single_observation_space
        act_space = self.envs.single_action_space
        self.obs_shape: tuple[int, ...] = tuple(obs_space.shape)
        self.normalize_obs = bool(self.spec["normalize_obs"])
        self.normalize_reward = bool(self.spec["normalize_reward"])
        self.clip_obs = float(self.spec["clip_obs"])
        self.gamma = float(self.spec["gamma"])
        self.clip_reward = bool(self.spec["clip_reward"])
        self.obs_dtype = rollout_obs_dtype(obs_space, self.normalize_obs)
        self._bounds = _action_bounds(act_space)
        if self._bounds is None:
            self._action_shape: tuple[int, ...] = ()
            self._action_dtype = np.dtype(np.int64)
            self._env_actions = None
        else:
            self._action_shape = tuple(act_space.shape)
            self._action_dtype = np.dtype(np.float32)
            self._env_actions = np.empty((self.num_envs, *self._action_shape), act_space.dtype)

        # Resetting again with the same seed reproduces make_vector_env's start state; it is
        # how we get the first observation without reaching into the vector env.
        obs, info = self.envs.reset(seed=seed)
        self._obs = np.array(obs, copy=True)  # raw observation of the next step
        # Atari training envs end episodes at lost lives; episode returns count whole games.
        # The id may name its registering module (``ale_py:ALE/Pong-v5``): judge the game id.
        atari = is_atari(split_env_id(self.spec["id"])[1])
        self._game_ends = GameEnds(info) if atari else None
        E = self.num_envs
        self._episode_return = np.zeros(E, dtype=np.float64)
        self._episode_length = np.zeros(E, dtype=np.int64)
        self._discounted_return = np.zeros(E, dtype=np.float64)
        self.env_steps = 0

    def close(self) -> None:
        """Close the envs (the actor calls this when it goes cold)."""
        self.envs.close()

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sample(
        self, policy: Policy, steps: int, obs_rms: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Step every env ``steps`` times and return the rollout of docs/contracts.md.

        ``obs_rms`` is the learner's frozen observation statistics; it is never updated here.
        Returned arrays are fresh (the caller may keep or ship them); ``obs`` and ``last_obs``
        are views of one buffer of ``steps + 1`` rows so the next obs is written only once.
        """
        T, E = int(steps), self.num_envs
        if T <= 0:
            raise ValueError(f"steps must be positive, got {steps}")
        transform = _ObsTransform(
            obs_rms, self.normalize_obs, self.clip_obs, self.obs_shape, self.obs_dtype, E
        )

        # ---- storage, preallocated [T, E] (obs gets one extra row for last_obs)
        obs = np.empty((T + 1, E, *self.obs_shape), dtype=self.obs_dtype)
        raw_obs = (
            np.empty((T, E, *self.obs_shape), dtype=np.float64) if self.normalize_obs else None
        )
        actions = np.empty((T, E, *self._action_shape), dtype=self._action_dtype)
        logprobs = np.empty((T, E), dtype=np.float32)
        values = np.empty((T, E), dtype=np.float32)
        rewards = np.empty((T, E), dtype=np.float32)
        terminated = np.empty((T, E), dtype=np.bool_)
        truncated = np.empty((T, E), dtype=np.bool_)
        bootstrap_values = np.zeros((T, E), dtype=np.float32)
        discounted = np.empty((T, E), dtype=np.float64) if self.normalize_reward else None
        done = np.empty(E, dtype=np.bool_)
        episode_returns: list[float] = []
        episode_lengths: list[int] = []

        # ---- hot loop: locals only, one batched policy call per step
        act, step, gamma = policy.act, self.envs.step, self.gamma
        clip_reward, game_ends = self.clip_reward, self._game_ends
        bounds, env_actions = self._bounds, self._env_actions
        ep_return, ep_length = self._episode_return, self._episode_length
        disc_return = self._discounted_return
        next_raw = self._obs
        transform(next_raw, out=obs[0])
        for t in range(T):
            if raw_obs is not None:
                raw_obs[t] = next_raw
            a, extras = act(obs[t])
            actions[t] = a
            logprobs[t] = extras["logprobs"]
            values[t] = extras["values"]
            if bounds is None:
                env_a = actions[t]
            else:
                env_a = np.clip(actions[t], bounds[0], bounds[1], out=env_actions)
            next_raw, r, term, trunc, info = step(env_a)
            ep_return += r  # the real score; training may see it clipped
            ep_length += 1
            if clip_reward:
                r = np.sign(r)
            rewards[t] = r
            terminated[t] = term
            truncated[t] = trunc
            if discounted is not None:
                # baselines' VecNormalize accumulator: G = gamma * G + r, reset after an episode
                disc_return *= gamma
                disc_return += r
                discounted[t] = disc_return
            np.logical_or(term, trunc, out=done)
            game_over = done if game_ends is None else game_ends(info, done)
            if done.any():
                ended = np.flatnonzero(game_over)
                episode_returns.extend(ep_return[ended].tolist())
                episode_lengths.extend(ep_length[ended].tolist())
                ep_return[ended] = 0.0
                ep_length[ended] = 0
                disc_return[done] = 0.0
                cut = np.flatnonzero(trunc & ~term)
                if cut.size:
                    # SAME_STEP autoreset: next_raw already holds the reset obs; the last obs
                    # of the cut episode is in info["final_obs"] (object array, mask "_final_obs").
                    final = np.stack([info["final_obs"][i] for i in cut])
                    bootstrap_values[t, cut] = policy.value(transform(final))
            transform(next_raw, out=obs[t + 1])

        # copy=False vector env: its obs buffer is overwritten by the next step.
        self._obs = np.array(next_raw, copy=True)
        self.env_steps += T * E
        last_obs = obs[T]
        rollout: dict[str, Any] = {
            "obs": obs[:T],
            "actions": actions,
            "logprobs": logprobs,
            "values": values,
            "rewards": rewards,
            "terminated": terminated,
            "truncated": truncated,
            "bootstrap_values": bootstrap_values,
            "last_obs": last_obs,
            "last_values": np.asarray(policy.value(last_obs), dtype=np.float32),
            "episode_returns": np.asarray(episode_returns, dtype=np.float32),
            "episode_lengths": np.asarray(episode_lengths, dtype=np.int64),
        }
        if raw_obs is not None:
            rollout["obs_stats"] = moments(raw_obs, sample_ndim=len(self.obs_shape))
        if discounted is not None:
            rollout["ret_stats"] = moments(discounted)
        return rollout


def evaluate(
    policy: Any,
    env_spec: Mapping[str, Any],
    episodes: int,
    seed: int,
    obs_rms: Mapping[str, Any] | None = None,
) -> list[float]:
    """Returns of ``episodes`` episodes of ``policy.act_deterministic``, raw (unscaled) rewards.

    Atari envs play whole games here (no life-loss episodes, no reward clipping).

    Runs on a fresh vector env of ``min(episodes, 8)`` envs, each assigned a fixed quota of
    episodes up front: counting whichever episodes finish first would favour short ones.
    Envs past their quota keep stepping (the batch shape stays fixed) but are not counted.
    """
    if episodes <= 0:
        return []
    n = min(int(episodes), MAX_EVAL_ENVS)
    spec = resolve_spec({**env_spec, "num_envs": n})
    envs = make_vector_env(spec, seed, training=False)
    try:
        obs_space = envs.single_observation_space
        normalize_obs = bool(spec["normalize_obs"])
        transform = _ObsTransform(
            obs_rms,
            normalize_obs,
            float(spec["clip_obs"]),
            tuple(obs_space.shape),
            rollout_obs_dtype(obs_space, normalize_obs),
            n,
        )
        bounds = _action_bounds(envs.single_action_space)
        quota = np.array([episodes // n + (i < episodes % n) for i in range(n)], dtype=np.int64)
        counted = np.zeros(n, dtype=np.int64)
        ep_return = np.zeros(n, dtype=np.float64)
        returns: list[float] = []
        obs, _ = envs.reset(seed=seed)
        while (counted < quota).any():
            a = np.asarray(policy.act_deterministic(transform(obs)))
            if bounds is not None:
                a = np.clip(a, bounds[0], bounds[1]).astype(envs.single_action_space.dtype)
            obs, r, term, trunc, _ = envs.step(a)
            ep_return += r
            for i in np.flatnonzero(term | trunc):
                if counted[i] < quota[i]:
                    returns.append(float(ep_return[i]))
                    counted[i] += 1
                ep_return[i] = 0.0
        return returns
    finally:
        envs.close()
