"""The sampler treats an ALE game named as ``module:ALE/...`` (gymnasium's form that imports
the registering module first) exactly like its plain ``ALE/...`` id."""

from __future__ import annotations

import numpy as np

from envs import Sampler
from tests.test_atari import PONG, RandomPolicy


def test_a_module_qualified_ale_id_reports_whole_games() -> None:
    """Training episodes end at every lost life; the returns reported are whole games'. With
    the id's module part left in, the game-end detection was skipped and every life counted
    as a game (Breakout: five 'games' per game, returns a fifth of the real ones)."""
    spec = {**PONG, "id": "ale_py:ALE/Breakout-v5", "num_envs": 4}
    with Sampler(spec, seed=3) as sampler:
        r = sampler.sample(RandomPolicy(4), 400)
    games = len(r["episode_returns"])
    assert games >= 2
    assert r["terminated"].sum() >= 5 * games, (r["terminated"].sum(), games)
    assert np.all(r["episode_lengths"] > 50)
