"""Atari through ale-py's vector env: spaces, the uint8 path from actor to learner, real game
scores with life-loss episodes and clipped training rewards, and a two-round Pong run."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envs import Sampler, describe
from envs.atari import GameEnds

PLANS = Path(__file__).resolve().parent.parent / "plans"
PONG = {"id": "ALE/Pong-v5", "num_envs": 2, "normalize_obs": False, "normalize_reward": False}


class RandomPolicy:
    def __init__(self, n: int, seed: int = 0):
        self.n = n
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        zeros = np.zeros(len(obs), dtype=np.float32)
        return self.rng.integers(0, self.n, len(obs)), {"logprobs": zeros, "values": zeros}

    def value(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros(len(obs), dtype=np.float32)


def test_describe_pong_is_a_uint8_frame_stack() -> None:
    space = describe({**PONG, "num_envs": 8})
    assert space == {"obs_shape": [4, 84, 84], "obs_dtype": "uint8",
                     "action": {"kind": "discrete", "n": 6}}


def test_breakout_reports_whole_games_and_trains_on_lives_and_clipped_rewards() -> None:
    spec = {**PONG, "id": "ALE/Breakout-v5", "num_envs": 4}
    with Sampler(spec, seed=3) as sampler:
        r = sampler.sample(RandomPolicy(4), 400)
    assert r["obs"].dtype == np.uint8 and r["obs"].shape == (400, 4, 4, 84, 84)
    games = len(r["episode_returns"])
    assert games >= 2
    # Five lives per game: every finished game contributed five life-loss terminations.
    assert r["terminated"].sum() >= 5 * games
    assert set(np.unique(r["rewards"])) <= {0.0, 1.0}
    assert np.all(r["episode_lengths"] > 50)


def test_game_ends_tells_lives_from_games() -> None:
    ends = GameEnds({"episode_frame_number": np.array([12, 13, 14])})
    done = np.array([True, True, False])
    # env 0 lost a life (frames go on), env 1 finished its game (new game's frame number).
    got = ends({"episode_frame_number": np.array([16, 9, 18])}, done)
    np.testing.assert_array_equal(got, [False, True, False])


def test_handler_batches_keep_uint8_observations() -> None:
    """The actor function, in-process with an inline context: no float pixels cross the codec,
    and the learner shell accepts and trains on what arrives."""
    from algos.appo import APPO, APPOConfig
    from kernel import codec
    from plugins.actors.workers import InvokeContext
    from plugins.function.handler import handler

    spaces = describe(PONG)
    core = APPO(spaces, APPOConfig(num_minibatches=1, update_epochs=1))
    weights = codec.encode("weights", {"version": 0, "weights": {"model": core.weights()}})
    event = {
        "run_id": "atari-test", "request_id": "r-0", "version": 0, "seed": 5, "steps": 8,
        "env": PONG, "algo": {"algo": "appo", **core.actor_spec()},
        "transport": {"kind": "inline"},
    }
    context = InvokeContext(aws_request_id="r-0", function_name="nitro-actor",
                            memory_limit_in_mb=1769, deadline_ms=time.time() * 1000 + 60_000,
                            attachment=weights)
    receipt = handler(event, context)
    assert receipt["env_steps"] == 16
    body = codec.decode(context.returned_payload, kind="batch")
    data = body["data"]
    assert data["obs"].dtype == np.uint8 and data["obs"].shape == (8, 2, 4, 84, 84)
    assert data["last_obs"].dtype == np.uint8
    assert "obs_stats" not in body["stats"]
    metrics = core.update({k: np.asarray(v) for k, v in data.items()}, progress=0.0)
    assert np.isfinite(metrics["loss"])


@pytest.mark.parametrize("plan,actor_dtype", [("pong-appo.toml", "float32"),
                                              ("pong-appo.toml", "int8"),
                                              ("breakout-ppo.toml", "float32")])
def test_two_rounds_through_the_local_backend(tmp_path: Path, plan: str, actor_dtype: str
                                              ) -> None:
    from kernel.engine import Engine

    overrides: dict[str, Any] = {
        "algo.actor_dtype": actor_dtype,
        "stop.max_rounds": 2,
        "env.num_envs": 2,
        "actors.count": 1,
        "actors.steps": 32,
        "actors.workers": 1,
        "probes": [],
        "sinks": [],
        "checkpoint.enabled": False,
    }
    engine = Engine.from_plan(PLANS / plan, overrides=overrides, out_dir=tmp_path)
    summary = asyncio.run(engine.run())
    assert engine._roles is not None  # what every invocation tells its actor to sample with
    assert engine._roles.learner.actor_spec()["net"]["actor_dtype"] == actor_dtype
    assert summary["stop_reason"] == "max_rounds" and summary["rounds"] == 2
    assert summary["invocation_errors"] == 0
    assert summary["env_steps"] == 2 * 32 * 2
