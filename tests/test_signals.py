"""Signals at the awkward moments: a second Ctrl-C while the stop path writes the final
checkpoint, and SIGTERM or a first Ctrl-C while plugins start. Each case is a real ``nitro
run`` process; the run must end promptly and leave its summary.json.

The slow moments come from test plugins (``tests/slow_plugins.py``), registered through the
``nitro.plugins`` entry-point group of a throwaway distribution on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

CARTPOLE = str(ROOT / "plans" / "cartpole.toml")
TINY = ["--set", "actors.steps=16", "--set", "actors.workers=1", "--set", "probes=[]",
        "--set", "stop.max_env_steps=100000000", "--set", "stop.target_return=1e9",
        "--set", "stop.max_rounds=100000"]


def _site(tmp_path: Path) -> Path:
    """A site folder whose only distribution registers ``tests.slow_plugins``."""
    site = tmp_path / "site"
    dist = site / "slow_plugins-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: slow-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[nitro.plugins]\nslow = tests.slow_plugins:PLUGINS\n")
    return site


def _start(tmp_path: Path, scaler: str, seconds: float,
           *sets: str) -> tuple[subprocess.Popen[str], Path]:
    out, marker = tmp_path / "run", tmp_path / "slow.marker"
    env = {**os.environ, "PYTHONPATH": f"{_site(tmp_path)}{os.pathsep}{ROOT}",
           "NITRO_SLOW_MARKER": str(marker), "NITRO_SLOW_SECONDS": str(seconds)}
    extra = [arg for item in sets for arg in ("--set", item)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernel", "run", CARTPOLE, "--out", str(out), *TINY,
         "--set", f"scaler.name={scaler}", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return proc, marker


def _wait_for(what: object, proc: subprocess.Popen[str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not what():  # type: ignore[operator]
        if proc.poll() is not None:
            pytest.fail(f"exited {proc.returncode} early: {proc.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _finish(proc: subprocess.Popen[str], timeout: float) -> str:
    try:
        return proc.communicate(timeout=timeout)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").open()]


def _summary_after_signal(proc: subprocess.Popen[str], stderr: str, out: Path) -> dict:
    """A run ended by a signal: exit code 130, no traceback, a summary and a whole journal."""
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert _events(out)[-1]["event"] == "RunStopped"
    return json.loads((out / "summary.json").read_text())


def test_a_second_sigint_during_the_final_checkpoint_still_leaves_the_summary(
        tmp_path: Path) -> None:
    proc, marker = _start(tmp_path, "slow_state", seconds=4)
    out = tmp_path / "run"
    try:
        _wait_for(lambda: (out / "events.jsonl").exists()
                  and '"RoundFinished"' in (out / "events.jsonl").read_text(), proc)
        proc.send_signal(signal.SIGINT)
        _wait_for(marker.exists, proc)  # the final checkpoint is being written now
        proc.send_signal(signal.SIGINT)
        stderr = _finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = _summary_after_signal(proc, stderr, out)
    assert summary["stop_reason"] == "signal SIGINT" and summary["rounds"] >= 1
    # The stop path ran to its end despite the second signal: final checkpoint and journal.
    assert (out / "checkpoints" / f"ckpt-{summary['rounds']:06d}.nitro").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_start_up_ends_the_run_promptly_with_a_summary(
        tmp_path: Path, sig: signal.Signals) -> None:
    proc, marker = _start(tmp_path, "slow_start", seconds=120)
    out = tmp_path / "run"
    try:
        _wait_for(marker.exists, proc)  # plugins are starting: the scaler's start waits
        t0 = time.monotonic()
        proc.send_signal(sig)
        stderr = _finish(proc, timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = _summary_after_signal(proc, stderr, out)
    assert took < 20, took  # not the 120 s the start would have taken
    assert summary["stop_reason"] == f"signal {sig.name}"
    assert summary["rounds"] == 0 and summary["env_steps"] == 0


def test_a_second_signal_while_start_up_is_undone_still_leaves_the_summary(
        tmp_path: Path) -> None:
    # The scaler's start waits; the probe started before it closes slowly (2 s).
    proc, marker = _start(tmp_path, "slow_start", 120, 'probes=[{name = "slow_close"}]')
    out, closing = tmp_path / "run", Path(f"{marker}.closing")
    try:
        _wait_for(marker.exists, proc)
        proc.send_signal(signal.SIGTERM)
        _wait_for(closing.exists, proc)  # the started plugins are being closed
        proc.send_signal(signal.SIGINT)
        stderr = _finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = _summary_after_signal(proc, stderr, out)
    assert summary["stop_reason"] == "signal SIGTERM" and summary["rounds"] == 0
