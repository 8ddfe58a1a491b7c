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


def test_embedding_callers_may_pass_no_overrides_or_a_lone_string() -> None:
    # None is "no overrides", and one string is one override: iterated, it would have been
    # overrides named "s", "t", "o", ... each failing as a bad --set.
    assert load_plan(CARTPOLE, None) == load_plan(CARTPOLE)
    assert load_plan(CARTPOLE, "stop.max_env_steps=1234")["stop"]["max_env_steps"] == 1234


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
    assert plan["probes"] == [{"name": "eval", "every": 10, "max_share": None, "episodes": 10}]


HOPPER_NITRO = ROOT / "plans" / "hopper-nitro.toml"


def test_switching_a_plugin_by_override_drops_the_old_plugins_keys() -> None:
    """A grid over ``scaler.name`` must run on a plan written for one scaler: the file's
    ``rule`` and ``gain`` configured ``nitro``, and ``fixed`` has neither."""
    plan = load_plan(HOPPER_NITRO, ["scaler.name=fixed"])
    assert plan["scaler"] == {"name": "fixed", "count": None}
    # Keys the new plugin also declares are kept: no_boost reads nitro's rule and gain.
    kept = load_plan(HOPPER_NITRO, {"scaler.name": "no_boost"})["scaler"]
    assert (kept["rule"], kept["gain"]) == ("anchored", 2.0)
    # Another algorithm: PPO's clipping means nothing to IMPALA, the core keys stay.
    algo = load_plan(HOPPER_NITRO, ["algo.name=impala"])["algo"]
    assert "clip_coef" not in algo and algo["learning_rate"] == 3e-4


@pytest.mark.parametrize(
    ("source", "override", "path"),
    [
        # A key the override itself sets is never dropped: it must fit the new plugin.
        (HOPPER_NITRO, {"scaler.name": "fixed", "scaler.gain": 3.0}, "scaler.gain"),
        # A whole table given by override is explicit in every key.
        (HOPPER_NITRO, ['scaler={name="fixed", gain=3.0}'], "scaler.gain"),
        # Without a change of plugin, a key the plugin does not know is an error as before.
        ({"env": {"id": "CartPole-v1"}, "stop": {"max_rounds": 1},
          "scaler": {"name": "fixed", "gain": 2.0}}, (), "scaler.gain"),
        # Naming the plugin the file already names drops nothing.
        ({"env": {"id": "CartPole-v1"}, "stop": {"max_rounds": 1},
          "scaler": {"name": "fixed", "gain": 2.0}}, ["scaler.name=fixed"], "scaler.gain"),
    ],
)
def test_keys_that_do_not_fit_still_fail(source: object, override: object, path: str) -> None:
    with pytest.raises(PlanError) as info:
        load_plan(source, override)  # type: ignore[arg-type]
    assert str(info.value).startswith(path), str(info.value)


def test_the_readme_sweep_over_scalers_validates(tmp_path: Path) -> None:
    result = run_cli("sweep", str(HOPPER_NITRO), "--seeds", "1-2", "--out", str(tmp_path / "s"),
                     "--grid", "setting=fixed8:scaler.name=fixed;nitro:scaler.name=nitro",
                     "--dry-run")
    assert result.returncode == 0, result.stderr
    issue = run_cli("sweep", str(HOPPER_NITRO), "--seeds", "1-2", "--out", str(tmp_path / "t"),
                    "--grid", "scaler.name=nitro,decay_only,fixed,prototype,hydrozoa,kungfu",
                    "--grid", "actors.count=4,8", "--dry-run")
    assert issue.returncode == 0, issue.stderr
    assert "24 runs" in issue.stdout
