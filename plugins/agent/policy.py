"""A trained agent outside the engine: ``Policy.load(run_dir).predict(obs)``.

A run directory holds everything a policy needs: ``plan.toml`` (the resolved plan: env spec,
algorithm, network sizes) and ``checkpoints/ckpt-<round>.nitro`` (the learner's weights and its
observation statistics). Loading needs neither the engine, Redis nor worker processes; it
builds the same actor-side policy the actors ran (numpy for MLPs, torch for the Nature CNN)
and applies the observation normalisation and clipping the run trained with, so raw env
observations go in and env-ready actions come out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Added to the variance under the square root, as in the run's own normalisation.
EPSILON = 1e-8


class PolicyLoadError(ValueError):
    """A path that does not hold a loadable policy (the message says what is missing)."""


@dataclass(frozen=True)
class ObsFilter:
    """The run's frozen observation transform: ``clip((obs - mean) / sqrt(var + 1e-8))``.

    Computed in float64 and cast to the rollout dtype, as the actors and the eval probe do, so
    a loaded policy sees exactly the numbers it was trained and evaluated on. Disabled (the
    run did not normalise), it only casts: pixels stay uint8 for the CNN.
    """

    enabled: bool
    clip: float
    dtype: np.dtype
    mean: np.ndarray | None = None
    scale: np.ndarray | None = None

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return np.asarray(obs).astype(self.dtype, copy=False)
        x = np.asarray(obs, dtype=np.float64)
        if self.mean is not None and self.scale is not None:
            x = (x - self.mean) / self.scale
        return np.clip(x, -self.clip, self.clip).astype(self.dtype)


def find_checkpoint(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """(checkpoint, run directory) for a run directory or one of its checkpoint files."""
    from kernel.checkpoint import latest

    path = Path(path)
    if path.is_dir():
        ckpt = latest(path)
        if ckpt is None:
            raise PolicyLoadError(f"{path}: no checkpoints/ckpt-*.nitro (was [checkpoint] "
                                  "enabled, and did the run finish a round?)")
        return ckpt, path
    if not path.is_file():
        raise PolicyLoadError(f"{path}: no such run directory or checkpoint file")
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return path, run_dir


def read_run_plan(run_dir: Path) -> dict[str, Any]:
    """The resolved plan a run wrote next to its checkpoints."""
    import tomllib

    plan_path = run_dir / "plan.toml"
    try:
        return tomllib.loads(plan_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyLoadError(f"{plan_path}: cannot read the run's plan ({exc.strerror})") \
            from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyLoadError(f"{plan_path}: not valid TOML ({exc})") from None


def actor_spec_of(plan: Mapping[str, Any], spaces: dict[str, Any]) -> dict[str, Any]:
    """The recipe the learner sent its actors (``actor_spec()``), rebuilt from the plan.

    Only keys the plan holds are passed, so the policy classes keep the one default.
    """
    algo = plan["algo"]
    net = {k: algo[k] for k in ("hidden_sizes", "activation") if k in algo}
    return {"algo": algo["name"], "spaces": spaces, "net": net}


class Policy:
    """A trained policy: raw observations in, actions the env accepts out.

    ``predict`` takes one observation (shape ``obs_shape``) or a batch (``[B, *obs_shape]``)
    and answers in kind. Box actions are clipped to the action space, as the actors clip what
    they send to the env; ``deterministic`` picks the mean (or the most likely discrete
    action), as the eval probe does.
    """

    def __init__(self, actor_spec: dict[str, Any], weights: Mapping[str, Any],
                 env_spec: dict[str, Any], obs_rms: Mapping[str, Any] | None,
                 source: Path | None = None):
        from envs.make import resolve_spec
        from plugins.registry_access import actor_policy

        self.actor_spec = actor_spec
        self.env_spec = resolve_spec(env_spec)
        self.spaces: dict[str, Any] = actor_spec["spaces"]
        self.obs_shape = tuple(int(d) for d in self.spaces["obs_shape"])
        self.action: dict[str, Any] = self.spaces["action"]
        self.weights = {k: np.asarray(v) for k, v in weights.items()}
        self.obs_rms = dict(obs_rms) if obs_rms else None
        self.source = source
        self.obs_filter = self._obs_filter()
        self._policy = actor_policy(actor_spec, exact=True)
        self._policy.load(self.weights)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Policy:
        """Load the newest checkpoint of a run directory, or the given checkpoint file."""
        from envs import describe
        from kernel.checkpoint import CheckpointError, read

        ckpt, run_dir = find_checkpoint(path)
        plan = read_run_plan(run_dir)
        try:
            learner = read(ckpt)["learner"]
        except CheckpointError as exc:
            raise PolicyLoadError(str(exc)) from None
        try:
            weights = learner["core"]["model"]
        except (KeyError, TypeError):
            raise PolicyLoadError(f"{ckpt}: the learner state holds no model weights") from None
        env_spec = {k: v for k, v in plan["env"].items() if k != "provider"}
        spec = actor_spec_of(plan, describe(env_spec))
        return cls(spec, weights, env_spec, learner.get("obs_rms"), source=ckpt)

    def _obs_filter(self) -> ObsFilter:
        enabled = bool(self.env_spec["normalize_obs"])
        mean = scale = None
        if enabled and self.obs_rms:
            mean = np.asarray(self.obs_rms["mean"], dtype=np.float64)
            if mean.shape != self.obs_shape:
                raise PolicyLoadError(f"obs_rms mean has shape {mean.shape}, observations "
                                      f"{self.obs_shape}")
            scale = np.sqrt(np.asarray(self.obs_rms["var"], dtype=np.float64) + EPSILON)
        return ObsFilter(enabled, float(self.env_spec["clip_obs"]),
                         np.dtype(self.spaces["obs_dtype"]), mean, scale)

    @property
    def discrete(self) -> bool:
        return self.action["kind"] == "discrete"

    def _batch(self, obs: Any) -> tuple[np.ndarray, bool]:
        obs = np.asarray(obs)
        if obs.shape == self.obs_shape:
            return obs[None], True
        if obs.ndim == len(self.obs_shape) + 1 and obs.shape[1:] == self.obs_shape:
            return obs, False
        raise ValueError(f"observation shape {obs.shape}: expected {self.obs_shape} or "
                         f"(batch, {', '.join(map(str, self.obs_shape))})")

    def predict(self, obs: Any, deterministic: bool = True) -> np.ndarray:
        """Actions for one observation or a batch of them (raw, as the env returns them)."""
        batch, single = self._batch(obs)
        x = self.obs_filter(batch)
        if deterministic:
            actions = np.asarray(self._policy.act_deterministic(x))
        else:
            actions = np.asarray(self._policy.act(x)[0])
        if self.discrete:
            actions = actions.astype(np.int64)
        else:
            low = np.asarray(self.action["low"], dtype=np.float32).reshape(self.action["shape"])
            high = np.asarray(self.action["high"], dtype=np.float32).reshape(self.action["shape"])
            actions = np.clip(actions, low, high).astype(np.float32)
        return actions[0] if single else actions

    def value(self, obs: Any) -> np.ndarray:
        """The critic's value of one observation (a 0-d array) or of a batch."""
        batch, single = self._batch(obs)
        values = np.asarray(self._policy.value(self.obs_filter(batch)))
        return values[0] if single else values

    def reseed(self, seed: int) -> None:
        """Seed the sampling noise of ``predict(..., deterministic=False)``."""
        self._policy.reseed(int(seed))

    def evaluate(self, episodes: int = 10, seed: int = 0) -> list[float]:
        """Episode returns exactly as the run's ``eval`` probe measures them (same envs, seeds
        ``seed + i`` for its sub-envs, deterministic actions): with the probe's seed (the
        plan's ``run.seed`` plus the round) it reproduces that round's ``eval_return``."""
        from envs import evaluate

        return evaluate(self._policy, self.env_spec, episodes, seed=seed, obs_rms=self.obs_rms)

    def make_env(self, render_mode: str | None = None) -> Any:
        """One env as the run built it (id, kwargs, time limit, imports), for watching."""
        from envs.atari import is_atari
        from envs.make import make_env, split_env_id

        name = split_env_id(self.env_spec["id"])[1]
        if is_atari(name):
            raise PolicyLoadError(f"{name}: ALE ids train on ale-py's preprocessed vector env; "
                                  "use Policy.evaluate, or predict on its frames")
        spec = self.env_spec
        return make_env(spec["id"], spec["kwargs"], spec["max_episode_steps"], spec["imports"],
                        render_mode=render_mode)()

    def torch_model(self) -> Any:
        """The learner's ``ActorCritic`` (torch) with these weights, for exports."""
        from algos.policy import ActorPolicy

        policy = ActorPolicy(dict(self.actor_spec))
        policy.load(self.weights)
        return policy.model
