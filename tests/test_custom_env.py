"""Users' own environments (``module:EnvId``, ``env.imports``) and pixel-safe normalisation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernel.engine import Engine
from kernel.plan import load_plan
from kernel.schema import PlanError
from tests.conftest import ROOT, run_cli

CARTPOLE = ROOT / "plans" / "cartpole.toml"
ECHO = "tests.custom_env:NitroEcho-v0"


def test_a_custom_env_in_its_own_module_trains(tmp_path: Path) -> None:
    """The id names the module that registers it; the local actors import it too."""
    engine = Engine.from_plan(
        CARTPOLE,
        {"env.id": ECHO, "stop.max_env_steps": 30_000, "stop.target_return": 19.0,
         "probes": [{"name": "eval", "every": 2, "episodes": 8}], "sinks": []},
        out_dir=tmp_path / "run",
    )
    summary = asyncio.run(engine.run())
    assert summary["stop_reason"] == "target_return", summary
    assert summary["best_eval_return"] >= 19.0


def test_env_imports_register_ids_before_validation() -> None:
    plan = load_plan(CARTPOLE, {"env.id": "NitroEcho-v0", "env.imports": ["tests.custom_env"]})
    assert plan["env"]["imports"] == ["tests.custom_env"]
    assert plan["env"]["normalize_obs"] is False  # as the plan asked: vector observations


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--set", "env.id=no_such_pkg.envs:Foo-v0"),
         "env.id: expected a registered gymnasium environment id, found "
         "'no_such_pkg.envs:Foo-v0' (cannot import env module 'no_such_pkg.envs'"),
        (("--set", "env.id=tests.conftest:Foo-v0"),
         "(module 'tests.conftest' imported but does not register 'Foo-v0')"),
        (("--set", 'env.imports=["no_such_pkg"]'),
         "env.imports[0]: expected a module that can be imported, found 'no_such_pkg'"),
        (("--set", 'env.imports=["tests.custom_env"]', "--set", "env.id=NitroEko-v0"),
         "unknown environment id 'NitroEko-v0' (after importing tests.custom_env); "
         "close matches: NitroEcho-v0"),
        (("--set", "env.id=ALE/Pong-v5", "--set", "env.normalize_obs=true"),
         "env.normalize_obs: expected false for image observations, found true"),
    ],
    ids=["id-module-missing", "id-module-without-the-id", "imports-missing",
         "imports-typo", "pixels-normalised"],
)
def test_bad_env_plans_fail_in_one_line_naming_the_key(args: tuple[str, ...], words: str
                                                       ) -> None:
    result = run_cli("validate", str(CARTPOLE), *args)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def _pong_plan(tmp_path: Path, env_extra: str = "") -> Path:
    plan = tmp_path / "pong.toml"
    plan.write_text(f'[stop]\nmax_rounds = 1\n[env]\nid = "ALE/Pong-v5"\n{env_extra}')
    return plan


def test_pong_with_default_normalisation_never_gets_an_mlp(tmp_path: Path) -> None:
    """Left at its default, normalize_obs either follows the observations (off for frames,
    so the learner builds the CNN) or refuses the plan naming the key: never floats into an
    MLP over 28,224 pixels."""
    from envs import describe, is_image_obs

    try:
        plan = load_plan(_pong_plan(tmp_path))
    except PlanError as exc:
        assert exc.path == "env.normalize_obs"
        assert "false for image observations" in str(exc)
        return
    spaces = describe({k: v for k, v in plan["env"].items() if k != "provider"})
    assert plan["env"]["normalize_obs"] is False and is_image_obs(spaces)


def test_pong_without_normalisation_builds_the_nature_cnn(tmp_path: Path) -> None:
    from algos.nets import ActorCritic
    from envs import describe

    plan = load_plan(_pong_plan(tmp_path, "normalize_obs = false\n"))
    spaces = describe({k: v for k, v in plan["env"].items() if k != "provider"})
    assert spaces["obs_dtype"] == "uint8" and spaces["obs_shape"] == [4, 84, 84]
    assert ActorCritic(spaces).pixels
