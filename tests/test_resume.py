"""Checkpoint and resume: a stopped run continues where it was, with nothing repeated."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from kernel import checkpoint, codec
from kernel.engine import Engine
from tests.conftest import ROOT, run_cli

CARTPOLE = str(ROOT / "plans" / "cartpole.toml")
SETS = ["stop.max_rounds=8", "stop.target_return=1e9", "probes=[]"]
STEPS = 512


def _args(out: Path) -> list[str]:
    args = [sys.executable, "-m", "kernel", "run", CARTPOLE, "--out", str(out)]
    for item in SETS:
        args += ["--set", item]
    return args


def _rounds(out: Path) -> list[int]:
    lines = (out / "events.jsonl").read_text().splitlines()
    return [json.loads(x)["round"] for x in lines if '"event": "RoundFinished"' in x]


def test_sigint_then_resume_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    done = subprocess.run(_args(straight), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = json.loads((straight / "summary.json").read_text())

    out = tmp_path / "stopped"
    proc = subprocess.Popen(_args(out), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not ((out / "events.jsonl").exists() and len(_rounds(out)) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130  # stopped by SIGINT: 128 + 2, as a shell reports it, stderr[-2000:]
    stopped = json.loads((out / "summary.json").read_text())
    assert stopped["stop_reason"] == "signal SIGINT" and 3 <= stopped["rounds"] < 8

    resumed = run_cli("run", "--resume", str(out), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final = json.loads((out / "summary.json").read_text())
    assert final["rounds"] == expected["rounds"] == 8
    assert final["env_steps"] == expected["env_steps"] == 8 * STEPS
    assert final["stop_reason"] == "max_rounds"
    assert _rounds(out) == list(range(1, 9))  # no gap, no repeat
    started = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()
               if '"RunStarted"' in x]
    assert [e["resumed_from_round"] for e in started] == [0, stopped["rounds"]]
    assert len({e["run_id"] for e in started}) == 1  # the same run, continued


def test_a_checkpoint_restores_the_learner_exactly(tmp_path: Path) -> None:
    out = tmp_path / "run"
    engine = Engine.from_plan(CARTPOLE, {"stop.max_rounds": 3, "probes": []}, out_dir=out)
    asyncio.run(engine.run())
    before = engine._roles.learner.weights()  # type: ignore[union-attr]
    body = checkpoint.read(checkpoint.latest(out))  # type: ignore[arg-type]
    assert body["run_state"]["round"] == 3 and body["nitro_version"]

    async def restored() -> dict:
        again = Engine.resume(out)
        async with again:
            assert again.state.round == 3 and again.state.env_steps == 3 * STEPS
            return again._roles.learner.weights()  # type: ignore[union-attr]

    after = asyncio.run(restored())
    for name, value in before["model"].items():
        np.testing.assert_array_equal(after["model"][name], value)


def test_an_unreadable_checkpoint_is_refused_clearly(tmp_path: Path) -> None:
    out = tmp_path / "run"
    engine = Engine.from_plan(CARTPOLE, {"stop.max_rounds": 1, "probes": []}, out_dir=out)
    asyncio.run(engine.run())
    path = checkpoint.latest(out)
    assert path is not None
    body = dict(checkpoint.read(path))
    body["format"], body["nitro_version"] = 99, "9.9.9"
    path.write_bytes(codec.encode("checkpoint", body))
    result = run_cli("run", "--resume", str(out))
    assert result.returncode == 2
    assert "format 99" in result.stderr and "9.9.9" in result.stderr
    assert "Traceback" not in result.stderr
    path.write_bytes(b"\x80\x04garbage")
    result = run_cli("run", "--resume", str(out))
    assert result.returncode == 2 and "not a checkpoint" in result.stderr
