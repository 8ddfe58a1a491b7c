"""Fault matrix, local actors: each fault is counted, and the run goes on or stops cleanly.

Every case runs the real CLI in its own process (its own forkserver and worker pool) with a
handler from ``tests/fault_handlers.py`` that misbehaves for chosen actors and rounds.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

CARTPOLE = str(ROOT / "plans" / "cartpole.toml")
STEPS = 128 * 4  # env steps per actor per round in plans/cartpole.toml
# Sync rounds: the counts below are exact per round (N invocations each). The default plan is
# pipelined; tests/test_pipelined.py runs the same kinds of faults through overlapped rounds.
BASE = ["--set", "actors.handler=tests.fault_handlers:faulty", "--set", "stop.target_return=1e9",
        "--set", "probes=[]", "--set", 'run.mode="sync"']


def _run(tmp_path: Path, fault: dict, *sets: str) -> dict:
    out = tmp_path / "run"
    args = ["run", CARTPOLE, "--out", str(out), *BASE]
    for item in sets:
        args += ["--set", item]
    result = run_cli(*args, env={"NITRO_FAULT": json.dumps(fault)}, timeout=240)
    assert "Traceback" not in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert result.returncode == _exit_status(summary), result.stderr[-3000:]
    return summary


def _exit_status(summary: dict) -> int:
    """A run that trained nothing or whose actors kept failing exits 1, so a script that
    chains runs does not go on after one that did no work; any other finished run exits 0."""
    return 1 if summary["stop_reason"] == "actors_failing" or not summary["env_steps"] else 0


def _rounds(run_dir: Path) -> list[int]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [json.loads(x)["round"] for x in lines if '"RoundFinished"' in x]


def test_handler_exceptions_are_counted_and_the_round_goes_on(tmp_path: Path) -> None:
    s = _run(tmp_path, {"mode": "raise", "actors": [0]}, "actors.count=2", "stop.max_rounds=3")
    assert s["rounds"] == 3 and s["stop_reason"] == "max_rounds"
    assert s["invocations"] == 6 and s["invocation_errors"] == 3 and s["handler_errors"] == 3
    assert s["env_steps"] == 3 * STEPS  # only the healthy actor's batches were used


def test_async_mode_with_every_actor_failing_stops_instead_of_spinning(tmp_path: Path) -> None:
    s = _run(tmp_path, {"mode": "raise"}, "run.mode=async", "actors.count=2",
             "stop.max_rounds=50")
    assert s["stop_reason"] == "actors_failing" and s["rounds"] == 3
    assert s["env_steps"] == 0 and s["invocation_errors"] >= 3 * 4
    assert s["invocation_errors"] < 200  # backed off, not a hot loop


def test_a_hung_actor_is_killed_at_its_deadline(tmp_path: Path) -> None:
    s = _run(tmp_path, {"mode": "hang", "actors": [0], "rounds": [2]}, "actors.count=2",
             "stop.max_rounds=3", "actors.timeout_s=3", "actors.deadline_s=20")
    assert s["rounds"] == 3
    assert s["worker_kills"] == 1 and s["invocation_errors"] == 1
    assert s["env_steps"] == 5 * STEPS


def test_an_actor_killed_mid_invocation_is_retried(tmp_path: Path) -> None:
    marker = tmp_path / "crashed-once"
    s = _run(tmp_path, {"mode": "crash", "actors": [1], "rounds": [2], "once_file": str(marker)},
             "actors.count=2", "stop.max_rounds=3")
    assert marker.exists()
    assert s["worker_deaths"] == 1 and s["retries"] == 1 and s["invocation_errors"] == 0
    assert s["env_steps"] == 6 * STEPS  # nothing lost


def test_stragglers_past_the_round_deadline_are_left_behind(tmp_path: Path) -> None:
    s = _run(tmp_path, {"mode": "slow", "seconds": 8, "actors": [0], "rounds": [2]},
             "actors.count=2", "stop.max_rounds=3", "actors.deadline_s=3")
    assert s["rounds"] == 3
    assert s["invocation_timeouts"] == 1
    assert s["env_steps"] == 5 * STEPS


def _wait_for(predicate, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.2)


def _popen(out: Path, fault: dict, *sets: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "kernel", "run", CARTPOLE, "--out", str(out), *BASE]
    for item in sets:
        args += ["--set", item]
    import os

    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "NITRO_FAULT": json.dumps(fault)})


def test_sigint_during_a_fan_out_stops_cleanly_with_a_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _popen(out, {"mode": "slow", "seconds": 60, "rounds": [2]}, "actors.count=2",
                  "stop.max_rounds=5")
    try:
        _wait_for(lambda: (out / "events.jsonl").exists()
                  and '"round": 2, "actors"' in (out / "events.jsonl").read_text(), proc)
        time.sleep(0.5)  # the fan-out of round 2 is in flight
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < 20  # did not wait for the 60 s actors
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130  # stopped by SIGINT: 128 + 2, as a shell reports it, stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "signal SIGINT" and summary["rounds"] == 1
    assert (out / "checkpoints" / "ckpt-000001.nitro").exists()


@pytest.mark.parametrize("kill", [signal.SIGKILL])
def test_a_killed_learner_resumes_from_its_checkpoint(tmp_path: Path, kill: int) -> None:
    out = tmp_path / "run"
    pid_file = tmp_path / "actor.pid"
    proc = _popen(out, {"mode": "slow", "seconds": 120, "rounds": [4],
                        "pid_file": str(pid_file)}, "stop.max_rounds=6", "checkpoint.every=1")
    try:
        _wait_for(lambda: (out / "checkpoints" / "ckpt-000003.nitro").exists()
                  and pid_file.exists(), proc)
        proc.send_signal(kill)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (out / "summary.json").exists()  # it really died
    # Its actor, mid-invocation, does not outlive it by more than the watchdog's period.
    actor = Path(f"/proc/{pid_file.read_text()}")
    deadline = time.monotonic() + 15
    while actor.exists() and (actor / "status").read_text().find("zombie") < 0:
        assert time.monotonic() < deadline, "an orphaned actor is still running"
        time.sleep(0.2)
    result = run_cli("run", "--resume", str(out), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 6 and summary["stop_reason"] == "max_rounds"
    assert summary["env_steps"] == 6 * STEPS
    assert sorted(set(_rounds(out))) == [1, 2, 3, 4, 5, 6]
