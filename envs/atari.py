"""Atari (``ALE/<Game>-v5``) vector envs with the standard DQN/IMPALA preprocessing.

ale-py's own ``AtariVectorEnv`` does the preprocessing in C++: no-op reset (up to 30), frame skip
4 with max-pooling over the last two frames, fire on reset, 84x84 grey, a 4-frame stack. On this
machine it steps Pong at ~3.7k agent steps/s on one thread, against ~2.8k for gymnasium's
``AtariPreprocessing`` + ``FrameStackObservation`` (which also need OpenCV); see
``perf/atari_sps.py``. The v5 ids' own settings are kept (sticky actions 0.25, 108,000 frames
per episode, minimal action set), and ``env.kwargs`` overrides any constructor argument.

Training and evaluation differ on purpose:
- training envs end an *episode* at every life loss (``life_loss_info``: ``terminated`` is set,
  the game goes on), the usual "episodic life" that makes losing a life costly to the critic;
  ale-py's ``episodic_life`` flag instead resets the whole game at a life loss, so it is not used.
- rewards leave the env unclipped; the sampler clips them (sign) for training only, and reports
  the real game score, summed over all lives, as the episode return (``GameEnds`` tells which
  sub-envs finished a whole game).
- evaluation envs play whole games with raw rewards.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["GameEnds", "is_atari", "make_atari_vector_env"]

#: AtariVectorEnv settings that make up the standard preprocessing (any can be overridden).
PREPROCESSING: dict[str, Any] = {
    "img_height": 84,
    "img_width": 84,
    "grayscale": True,
    "stack_num": 4,
    "maxpool": True,
    "noop_max": 30,
    "use_fire_reset": True,
    "reward_clipping": False,  # the sampler clips for training; episode returns stay real
    "episodic_life": False,
    # One thread per actor: actors are one per core (Lambda: per vCPU), and extra threads on a
    # loaded core only add contention (1 thread: 3.7k steps/s, 2 threads: 3.9k on 2 cores).
    "num_threads": 1,
}


def is_atari(env_id: str) -> bool:
    """ALE v5 ids are the ones built by ``make_atari_vector_env``."""
    return env_id.startswith("ALE/")


def make_atari_vector_env(
    env_id: str,
    num_envs: int,
    kwargs: Mapping[str, Any] | None = None,
    *,
    training: bool = True,
    max_episode_steps: int | None = None,
) -> gym.vector.VectorEnv:
    """Build ``num_envs`` preprocessed copies of ``env_id`` (not reset yet).

    ``max_episode_steps`` counts agent steps; ALE counts frames, hence the frame-skip factor.
    """
    registered = dict(gym.spec(env_id).kwargs)  # game, sticky actions, frameskip, frame limit
    settings: dict[str, Any] = {**registered, **PREPROCESSING, "life_loss_info": training}
    if max_episode_steps is not None:
        settings["max_num_frames_per_episode"] = int(max_episode_steps) * int(
            settings.get("frameskip", 4)
        )
    settings.update(kwargs or {})
    game = settings.pop("game")
    return _atari_vector_env_class()(
        game,
        int(num_envs),
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        **settings,
    )


@functools.cache
def _atari_vector_env_class() -> type[gym.vector.VectorEnv]:
    """ale-py's ``AtariVectorEnv`` with a ``reset`` that folds an int seed into ALE's range.

    ALE seeds are C ints: a seed of 2**31 or more (the engine derives actor seeds from large
    hashes) makes ``reset`` raise a pybind TypeError, so seeds are taken modulo 2**31 minus the
    sub-env count (sub-env ``i`` gets ``seed + i``).
    """

    from ale_py.vector_env import AtariVectorEnv  # lazy: only Atari runs pay for the import

    class SeedFoldingAtariVectorEnv(AtariVectorEnv):
        def reset(self, *, seed: Any = None, options: Any = None) -> Any:
            if isinstance(seed, (int, np.integer)):
                seed = int(seed) % (2**31 - self.num_envs)
            return super().reset(seed=seed, options=options)

    return SeedFoldingAtariVectorEnv


class GameEnds:
    """Which sub-envs finished a whole game at a step, when episodes end at every life loss.

    Within a game ALE's ``episode_frame_number`` only grows; SAME_STEP autoreset reports the
    new game's (small) frame number at the step where a game ended. So a done step whose frame
    number did not grow is a game over (or a time-limit truncation), and any other done step is
    a lost life.
    """

    def __init__(self, info: Mapping[str, Any]):
        self.frame = np.array(info["episode_frame_number"], dtype=np.int64)

    def __call__(self, info: Mapping[str, Any], done: np.ndarray) -> np.ndarray:
        frame = np.asarray(info["episode_frame_number"], dtype=np.int64)
        ended = done & (frame <= self.frame)
        self.frame = frame
        return ended
