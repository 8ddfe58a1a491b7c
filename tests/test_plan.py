"""Plans fail before work starts, with the key path, the expectation and the finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.plan import load_plan
from kernel.schema import PlanError
from tests.conftest import ROOT, run_cli

CARTPOLE = ROOT / "plans" / "cartpole.toml"


def test_default_plan_resolves_with_defaults() -> None:
    plan = load_plan(CARTPOLE)
    assert plan["env"]["id"] == "CartPole-v1"
    assert plan["actors"]["max"] == plan["actors"]["count"]
    assert plan["algo"]["gae_lambda"] == 0.95  # a default the file does not set
    assert plan["probes"][0]["name"] == "eval"


@pytest.mark.parametrize(
    ("override", "path", "words"),
    [
        ({"algo.learnig_rate": 0.1}, "algo.learnig_rate", "unknown key"),
        ({"actors.count": "two"}, "actors.count", "found 'two'"),
        ({"actors.count": 0}, "actors.count", ">= 1"),
        ({"algo.gamma": 1.5}, "algo.gamma", "<= 1"),
        ({"env.id": "CartPole-v9"}, "env.id", "CartPole-v1"),
        ({"scaler.name": "bogus"}, "scaler.name", "found 'bogus'"),
        ({"env.num_envs": True}, "env.num_envs", "an integer"),
        ({"probes.0.name": "nope"}, "probes[0].name", "found 'nope'"),
        ({"actors.min": 3}, "actors.count", "between"),
        ({"env.kwargs": {"no_such_kwarg": 1}}, "env.kwargs", "no_such_kwarg"),
    ],
)
def test_bad_values_name_the_key(override: dict, path: str, words: str) -> None:
    with pytest.raises(PlanError) as info:
        load_plan(CARTPOLE, override)
    message = str(info.value)
    assert message.startswith(path), message
    assert words in message, message


def test_a_run_needs_an_end() -> None:
    with pytest.raises(PlanError, match="^stop: expected at least one of"):
        load_plan({"env": {"id": "CartPole-v1"}})


def test_unknown_section() -> None:
    with pytest.raises(PlanError, match="^learner: expected a known section"):
        load_plan({"env": {"id": "CartPole-v1"}, "stop": {"max_rounds": 1}, "learner": {}})


def test_overrides_take_toml_values_and_bare_strings() -> None:
    plan = load_plan(CARTPOLE, ["stop.max_env_steps=150000", "env.id=Acrobot-v1",
                                'run.name="x y"', "algo.hidden_sizes=[32, 32]"])
    assert plan["stop"]["max_env_steps"] == 150000
    assert plan["env"]["id"] == "Acrobot-v1"
    assert plan["run"]["name"] == "x y"
    assert plan["algo"]["hidden_sizes"] == [32, 32]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "args", "words"),
    [
        ("[env\nid = 1", (), "valid TOML"),
        ('[env]\nid = "CartPole-v1"\n[stop]\nmax_rounds = -1\n', (), "stop.max_rounds"),
        ('[env]\nid = "NoSuchEnv-v0"\n[stop]\nmax_rounds = 1\n', (), "env.id"),
        ('[env]\nid = "CartPole-v1"\n[stop]\nmax_rounds = 1\n', ("--set", "actors.steps=x"),
         "actors.steps"),
    ],
)
def test_cli_exits_2_with_one_message_and_no_traceback(
    tmp_path: Path, text: str, args: tuple[str, ...], words: str
) -> None:
    plan = _write(tmp_path, text)
    for command in ("validate", "run"):
        result = run_cli(command, str(plan), *args, "--out", str(tmp_path / "out")) \
            if command == "run" else run_cli(command, str(plan), *args)
        assert result.returncode == 2, result.stderr
        assert words in result.stderr
        assert "Traceback" not in result.stderr + result.stdout
        assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing started


def test_cli_missing_plan_file(tmp_path: Path) -> None:
    result = run_cli("validate", str(tmp_path / "absent.toml"))
    assert result.returncode == 2
    assert "absent.toml" in result.stderr and "Traceback" not in result.stderr


def test_docs_plan_md_is_generated_from_the_schema() -> None:
    from kernel.plandoc import render
    from kernel.registry import default_registry

    expected = render(default_registry())
    actual = (ROOT / "docs" / "plan.md").read_text(encoding="utf-8")
    assert actual == expected, "regenerate: python -m kernel plugins --markdown > docs/plan.md"


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [
        ({"algo.learnig_rate": 0.1}, "did you mean 'learning_rate'?"),
        ({"stop.max_round": 3}, "did you mean 'max_rounds'?"),
        ({"env.num_env": 2}, "did you mean 'num_envs'?"),
        ({"scaler.name": "nitr"}, "did you mean 'nitro'?"),
        ({"stpo": {"max_rounds": 1}}, "did you mean 'stop'?"),
    ],
)
def test_near_misses_get_a_suggestion(override: dict, suggestion: str) -> None:
    with pytest.raises(PlanError) as info:
        load_plan(CARTPOLE, override)
    assert suggestion in str(info.value) and "\n" not in str(info.value)


def test_far_misses_get_no_guess() -> None:
    with pytest.raises(PlanError) as info:
        load_plan(CARTPOLE, {"algo.zzzzqqq": 1})
    assert "did you mean" not in str(info.value)


def test_without_probes_evaluation_is_not_every_round() -> None:
    """Ten eval episodes every round cost a small env more than its training."""
    plan = load_plan({"env": {"id": "CartPole-v1"}, "stop": {"max_rounds": 30}})
    assert plan["probes"] == [{"name": "eval", "every": 10, "episodes": 10}]
