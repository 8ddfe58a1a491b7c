"""Run directories are safe: a name cannot escape ``run.out_dir``, sink files stay inside the
run directory, an existing run is never overwritten by accident, and a resume that does not fit
its checkpoint is refused before anything in the run directory changes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel import rundir
from kernel.plan import load_plan
from kernel.schema import PlanError
from tests.conftest import ROOT, run_cli

CARTPOLE = ROOT / "plans" / "cartpole.toml"
#: A tiny run: two rounds of one actor, no evaluation, a checkpoint at the end.
TINY = ["--set", "stop.max_rounds=2", "--set", "actors.steps=16", "--set", "actors.workers=1",
        "--set", "probes=[]", "--set", "stop.max_env_steps=100000000",
        "--set", "stop.target_return=1e9"]


@pytest.mark.parametrize("name", ["../../x", "/tmp/x", "..", ".hidden", "a/b", "x\ny", "-rf"])
def test_run_names_that_leave_the_runs_folder_are_refused(name: str) -> None:
    with pytest.raises(PlanError, match=r"^run\.name: expected 1-64 letters"):
        load_plan(CARTPOLE, {"run.name": name})


def test_ordinary_run_names_are_kept() -> None:
    for name in ("cartpole", "pong_ppo.v2", "x y", "a" * 64):
        assert load_plan(CARTPOLE, {"run.name": name})["run"]["name"] == name


def test_a_traversing_name_is_refused_by_the_cli_and_creates_nothing(tmp_path: Path) -> None:
    result = run_cli("run", str(CARTPOLE), "--set", 'run.name="../../escaped"',
                     "--set", f'run.out_dir="{tmp_path / "runs"}"', *TINY, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "run.name" in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


# -- an existing run is never overwritten or made unresumable ---------------------------------

def _tree(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run directory with its bytes."""
    return {str(p.relative_to(run_dir)): p.read_bytes()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-round run with its final checkpoint (copied by each test that uses it)."""
    out = tmp_path_factory.mktemp("base") / "run"
    result = run_cli("run", str(CARTPOLE), "--out", str(out), *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "checkpoints" / "ckpt-000002.nitro").exists()
    return out


@pytest.fixture
def run_dir(finished_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def _refused(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nitro: "), result.stderr[-3000:]
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(("override", "words"), [
    ("env.id=Acrobot-v1", ("env.id", "'CartPole-v1'", "'Acrobot-v1'")),
    ("env.normalize_obs=true", ("env.normalize_obs",)),
    ('env.kwargs={sutton_barto_reward = true}', ("env.kwargs",)),
    ("algo.name=appo", ("algo.name", "'ppo'", "'appo'")),
    ("algo.hidden_sizes=[32]", ("algo.hidden_sizes",)),
])
def test_a_resume_that_changes_env_spaces_or_algorithm_is_refused_and_changes_nothing(
        run_dir: Path, override: str, words: tuple[str, ...]) -> None:
    before = _tree(run_dir)
    _refused(run_cli("run", "--resume", str(run_dir), "--set", override), *words)
    assert _tree(run_dir) == before


def test_after_a_refused_resume_the_run_still_resumes(run_dir: Path) -> None:
    _refused(run_cli("run", "--resume", str(run_dir), "--set", "env.id=Acrobot-v1"), "env.id")
    result = run_cli("run", "--resume", str(run_dir), "--set", "stop.max_rounds=3",
                     "--set", "env.num_envs=2")  # envs per actor change the batch only
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["stop_reason"] == "max_rounds"
    assert "CartPole-v1" in (run_dir / "plan.toml").read_text()


def test_a_plan_with_resume_is_refused(run_dir: Path) -> None:
    before = _tree(run_dir)
    _refused(run_cli("run", str(CARTPOLE), "--resume", str(run_dir)), "--resume", "plan file")
    _refused(run_cli("run", "--resume", str(run_dir), "--out", str(run_dir.parent / "x")),
             "--resume", "--out")
    assert _tree(run_dir) == before
    assert not (run_dir.parent / "x").exists()


def test_a_non_empty_out_is_refused_unless_forced(run_dir: Path) -> None:
    before = _tree(run_dir)
    old_id = json.loads((run_dir / "summary.json").read_text())["run_id"]
    _refused(run_cli("run", str(CARTPOLE), "--out", str(run_dir), *TINY), "--out", "--force")
    assert _tree(run_dir) == before
    (run_dir / "notes.txt").write_text("mine")
    result = run_cli("run", str(CARTPOLE), "--out", str(run_dir), "--force", *TINY,
                     "--set", "stop.max_rounds=1")
    assert result.returncode == 0, result.stderr[-3000:]
    new = json.loads((run_dir / "summary.json").read_text())
    assert new["run_id"] != old_id and new["rounds"] == 1
    # The old run's checkpoints are gone: a resume continues the new run, not the old one.
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["ckpt-000001.nitro"]
    assert (run_dir / "notes.txt").read_text() == "mine"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").open()]
    assert {e["run_id"] for e in events if e["event"] == "RunStarted"} == {new["run_id"]}


@pytest.mark.parametrize("path", ["../escape.csv", "/tmp/escape.csv", "sub/../../escape.csv",
                                  "."])
def test_sink_files_stay_inside_the_run_directory(tmp_path: Path, path: str) -> None:
    out = tmp_path / "run"
    result = run_cli("run", str(CARTPOLE), "--out", str(out), *TINY,
                     "--set", f'sinks=[{{name = "csv", path = "{path}"}}]')
    _refused(result, "sinks[0].path", "inside the run directory")
    assert not out.exists() and not (tmp_path / "escape.csv").exists()


def test_what_a_resume_keeps_is_declared_by_the_plugins_fields() -> None:
    """The kernel names no env or algorithm key: the core selectors and the plugins' own
    ``Field(fixed_on_resume=True)`` say what a resume may not change."""
    from kernel.plan import fixed_on_resume
    from kernel.registry import Plugin, Registry, default_registry
    from kernel.schema import Field

    keys = fixed_on_resume(default_registry(), {"env": {"id": "CartPole-v1"}})
    assert {"env.provider", "env.id", "env.kwargs", "algo.name", "algo.hidden_sizes",
            "algo.activation"} <= keys
    assert "env.num_envs" not in keys and "algo.learning_rate" not in keys

    registry = Registry()
    registry.register(Plugin("grid", "env", "a:b", config={
        "size": Field("int", 8, fixed_on_resume=True), "workers": Field("int", 1)}))
    keys = fixed_on_resume(registry, {"env": {"provider": "grid"}})
    assert "env.size" in keys and "env.workers" not in keys
    saved = {"env": {"provider": "grid", "size": 8, "workers": 1}}
    rundir.check_resume_fits(saved, {"env": {"provider": "grid", "size": 8, "workers": 4}},
                             keys)
    with pytest.raises(PlanError, match="env.size"):
        rundir.check_resume_fits(saved, {"env": {"provider": "grid", "size": 9, "workers": 1}},
                                 keys)
