"""Run directories are safe: a name cannot escape ``run.out_dir``, sink files stay inside the
run directory, an existing run is never overwritten by accident, and a resume that does not fit
its checkpoint is refused before anything in the run directory changes."""

from __future__ import annotations

from pathlib import Path

import pytest

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
