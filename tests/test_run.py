"""Whole runs through the CLI and the engine: learning, clean stops, failures named."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kernel.engine import Engine
from tests.conftest import ROOT, run_cli

CARTPOLE = ROOT / "plans" / "cartpole.toml"


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("run", [{"run.mode": "sync"},
                                 {"run.mode": "sync", "actors.count": 2},
                                 {"run.mode": "sync", "actors.count": 5, "actors.workers": 2},
                                 {"run.mode": "pipelined", "run.snapshot_at": 0.5,
                                  "actors.count": 2},
                                 {"run.mode": "pipelined", "run.snapshot_at": 0.0}],
                         ids=["sync", "sync-2-actors", "sync-more-actors-than-workers",
                              "pipelined-snapshot",
                              "pipelined-previous-weights"])
def test_a_seeded_run_replays_exactly(tmp_path: Path, run: dict) -> None:
    """Same plan, same seed: the same rollouts and updates, whichever warm worker serves each
    invocation (the actors' action noise comes from the invocation's seed, and the local pool
    pins each call to a worker by its index in the round, so the envs each worker keeps
    mid-episode are continued in the same order even with more actors than workers).
    Pipelined rounds replay with a fixed snapshot point (a timed one depends on the machine's
    speed)."""
    def trace(name: str) -> list[tuple]:
        out = tmp_path / name
        engine = Engine.from_plan(CARTPOLE, {**run, "stop.max_rounds": 4,
                                             "probes": [], "sinks": []}, out_dir=out)
        asyncio.run(engine.run())
        return [(e["round"], e["episode_return_mean"], e["metrics"]["loss"])
                for e in _events(out) if e["event"] == "RoundFinished"]

    first = trace("a")
    assert len(first) == 4
    assert trace("b") == first


def test_cartpole_learns_to_475(tmp_path: Path) -> None:
    """The default plan reaches an eval return of 475 well inside 150k env steps (seeded)."""
    engine = Engine.from_plan(CARTPOLE, {"stop.max_env_steps": 150_000, "run.seed": 3},
                              out_dir=tmp_path / "run")
    summary = asyncio.run(engine.run())
    assert summary["stop_reason"] == "target_return", summary
    assert summary["best_eval_return"] >= 475
    assert summary["env_steps"] <= 150_000
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    for key in ("rounds", "env_steps", "best_eval_return", "final_eval_return", "wall_s",
                "stop_reason", "invocations", "invocation_errors"):
        assert key in written
    assert written["invocation_errors"] == 0
    kinds = {e["event"] for e in _events(tmp_path / "run")}
    assert {"RunStarted", "RoundStarted", "WeightsPublished", "InvocationFinished",
            "BatchArrived", "LearnerUpdated", "ProbeMeasured", "CostCharged", "ScaleDecided",
            "RoundFinished", "RunStopped"} <= kinds
    assert (tmp_path / "run" / "plan.toml").exists()
    assert (tmp_path / "run" / "log.jsonl").stat().st_size > 0


def test_sigint_stops_cleanly_and_writes_the_summary(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernel", "run", str(CARTPOLE), "--out", str(out),
         "--set", "stop.max_env_steps=100000000", "--set", "stop.target_return=1e9"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(e["event"] == "RoundFinished" for e in _events(out)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130  # stopped by SIGINT: 128 + 2, as a shell reports it, stderr
    assert "Traceback" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "signal SIGINT"
    assert summary["rounds"] >= 1
    assert _events(out)[-1]["event"] == "RunStopped"


def test_a_failing_plugin_is_named_and_the_exit_code_is_nonzero(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "boom_scaler").mkdir(parents=True)
    (site / "boom_scaler" / "__init__.py").write_text(textwrap.dedent("""
        from kernel.registry import Plugin

        class Boom:
            def __init__(self, ctx):
                pass
            def decide(self, ctx):
                raise RuntimeError("kaboom")

        PLUGINS = [Plugin("boom", "scaler", "boom_scaler:Boom", "Always fails.")]
    """))
    dist = site / "boom_scaler-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: boom-scaler\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[nitro.plugins]\nboom = boom_scaler:PLUGINS\n")
    out = tmp_path / "run"
    result = run_cli("run", str(CARTPOLE), "--out", str(out), "--set", "scaler.name=boom",
                     env={"PYTHONPATH": str(site)})
    assert result.returncode == 1, result.stderr
    assert "scaler plugin 'boom' failed: RuntimeError: kaboom" in result.stderr
    assert "Traceback" not in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"].startswith("error: scaler plugin 'boom'")
    assert any(e["event"] == "PluginFailed" and e["plugin"] == "boom" for e in _events(out))
