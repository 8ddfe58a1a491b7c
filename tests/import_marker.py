"""A module whose import is visible: it writes the file named by ``NITRO_TEST_IMPORT_MARKER``
and registers ``NitroMarker-v0`` (CartPole under another id). The actor-function tests use it to
see whether an event made the function import code."""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium as gym

_marker = os.environ.get("NITRO_TEST_IMPORT_MARKER")
if _marker:
    Path(_marker).write_text(str(os.getpid()))

if "NitroMarker-v0" not in gym.registry:
    gym.register("NitroMarker-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv",
                 max_episode_steps=50)
