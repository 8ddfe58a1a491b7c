"""The env section belongs to its provider: the kernel knows only ``env.provider`` and
validates every other key through the provider's declared fields; gymnasium's
``normalize_obs`` left unset follows the observations."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.plan import ENV, load_plan
from kernel.registry import Plugin, Registry, default_registry
from kernel.schema import Field, PlanError
from tests.conftest import ROOT

CARTPOLE = ROOT / "plans" / "cartpole.toml"
TOY_CONFIG = {"level": Field("int", 1, "Toy level.", min=1)}


def _with_toy_provider() -> Registry:
    """Every installed plugin plus an env provider that declares a section of its own."""
    registry = Registry()
    for plugin in default_registry().all():
        registry.register(plugin)
    registry.register(Plugin("toy", "env", "plugins.environments.gymnasium_env:make",
                             "A toy provider.", config=TOY_CONFIG))
    return registry


def _toy_plan(**env: object) -> dict:
    return {"env": {"provider": "toy", **env}, "stop": {"max_rounds": 1}, "probes": []}


def test_the_kernel_declares_only_the_provider_of_the_env_section() -> None:
    assert set(ENV) == {"provider"}


def test_another_provider_validates_its_own_env_keys() -> None:
    registry = _with_toy_provider()
    plan = load_plan(_toy_plan(), registry=registry)
    assert plan["env"] == {"provider": "toy", "level": 1}
    with pytest.raises(PlanError) as info:
        load_plan(_toy_plan(level=0), registry=registry)
    assert info.value.path == "env.level"


def test_gymnasium_keys_are_gymnasiums_not_every_providers() -> None:
    with pytest.raises(PlanError) as info:
        load_plan(_toy_plan(num_envs=4), registry=_with_toy_provider())
    assert info.value.path == "env.num_envs"
    assert "unknown key" in str(info.value) and "\n" not in str(info.value)


def test_gymnasium_keys_keep_their_defaults_and_errors() -> None:
    plan = load_plan({"env": {"id": "CartPole-v1"}, "stop": {"max_rounds": 1}})
    env = plan["env"]
    assert env == {"id": "CartPole-v1", "provider": "gymnasium", "num_envs": 4, "kwargs": {},
                   "normalize_obs": True, "normalize_reward": True, "clip_obs": 10.0,
                   "max_episode_steps": None, "clip_reward": None, "imports": []}
    with pytest.raises(PlanError) as info:
        load_plan({"env": {}, "stop": {"max_rounds": 1}})
    assert str(info.value) == "env.id: expected a string, found nothing (required key)"


def test_a_default_pong_plan_gets_the_nature_cnn(tmp_path: Path) -> None:
    """Unset normalize_obs is off for frames: the plan validates and the learner's network is
    the CNN on uint8 frames, not an MLP over every pixel."""
    from algos.nets import ActorCritic
    from envs import describe

    plan = load_plan({"env": {"id": "ALE/Pong-v5", "num_envs": 1},
                      "stop": {"max_rounds": 1}})
    assert plan["env"]["normalize_obs"] is False
    spaces = describe({k: v for k, v in plan["env"].items() if k != "provider"})
    assert spaces["obs_dtype"] == "uint8" and ActorCritic(spaces).pixels


def test_normalize_obs_set_true_on_frames_is_still_refused() -> None:
    with pytest.raises(PlanError) as info:
        load_plan({"env": {"id": "ALE/Pong-v5", "normalize_obs": True},
                   "stop": {"max_rounds": 1}})
    assert info.value.path == "env.normalize_obs"
    assert "false for image observations" in str(info.value)


def test_normalize_obs_as_set_is_kept() -> None:
    plan = load_plan(CARTPOLE, {"stop.max_rounds": 1})
    assert plan["env"]["normalize_obs"] is False  # the plan says so, vector observations or not
