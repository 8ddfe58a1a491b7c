"""A user's own environment, registered on import (for tests/test_custom_env.py).

``NitroEcho-v0``: the observation is a cue of +1 or -1; action 1 answers +1 and action 0
answers -1; a right answer earns 1. Episodes last ``length`` steps, so a random policy scores
about half of ``length`` and a trained one all of it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

ENV_ID = "NitroEcho-v0"


class EchoEnv(gym.Env[np.ndarray, np.int64]):
    metadata = {"render_modes": []}

    def __init__(self, length: int = 20):
        self.length = length
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._cue = 1.0
        self._t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self._cue], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        self._cue = float(self.np_random.choice([-1.0, 1.0]))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = 1.0 if (int(action) == 1) == (self._cue > 0) else 0.0
        self._t += 1
        self._cue = float(self.np_random.choice([-1.0, 1.0]))
        return self._obs(), reward, self._t >= self.length, False, {}


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=EchoEnv)
