"""The example plugin package: installed like a third party's, listed, and its A2C learns.

The package (``examples/plugin_package``) reaches Nitro only through the ``nitro.plugins``
entry point, so this is the path an outside author's algorithm takes. Checks run in fresh
processes: entry points are read when a registry is first built.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

PACKAGE = ROOT / "examples" / "plugin_package"

A2C_PLAN = """
[run]
name = "a2c-cartpole"
seed = 1

[stop]
max_env_steps = 60_000
target_return = 475.0

[env]
id = "CartPole-v1"
num_envs = 16

[algo]
name = "a2c"
learning_rate = 7e-4

[actors]
backend = "local"
count = 1
steps = 5
workers = 1

[scaler]
name = "warmup"
warmup_rounds = 0

[[probes]]
name = "eval"
every = 25
episodes = 10

[[sinks]]
name = "csv"
"""


@pytest.fixture(scope="module", autouse=True)
def installed() -> None:
    """Install the example package into this interpreter unless it already is (editable, no
    dependencies, no build isolation: nothing is downloaded)."""
    try:
        metadata.distribution("nitro-a2c")
        return
    except metadata.PackageNotFoundError:
        pass
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "-e", str(PACKAGE)], capture_output=True, text=True, timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(f"pip install of the example package failed:\n{proc.stderr[-2000:]}")


def test_plugins_lists_the_package() -> None:
    proc = run_cli("plugins", timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    a2c = next(line for line in lines if line.split()[:2] == ["algo", "a2c"])
    assert a2c.endswith("[nitro-a2c]")
    assert any(line.split()[:2] == ["scaler", "warmup"] for line in lines)
    assert any("learning_rate (a number > 0; default 0.0007)" in line for line in lines)


def test_plan_with_an_unknown_a2c_key_fails_before_running(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(A2C_PLAN.replace('learning_rate = 7e-4', 'learning_rate = 7e-4\nlr = 1'))
    proc = run_cli("validate", str(plan), timeout=120)
    assert proc.returncode == 2
    assert "algo.lr" in proc.stderr


def test_a2c_learns_cartpole(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(A2C_PLAN)
    out = tmp_path / "run"
    proc = run_cli("run", str(plan), "--out", str(out), timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    # Seed 1 reaches 475 after 16,000 env steps (200 rounds of 5 steps x 16 envs).
    assert summary["stop_reason"] == "target_return", summary
    assert summary["best_eval_return"] >= 475.0
    assert summary["env_steps"] <= 60_000
    header = (out / "rounds.csv").read_text().splitlines()[0]
    assert "boost_score" in header
