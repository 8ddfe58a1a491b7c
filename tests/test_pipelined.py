"""Pipelined rounds (the default CartPole plan): lag, accounting and faults, with real workers.

The next round's invocations start before the current update, so these tests check what that
must not change: every batch is exactly one version stale, a run that stops at its limit has
started no invocation it does not train on, and a failing actor costs its round nothing but a
replacement.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ROOT, run_cli

CARTPOLE = str(ROOT / "plans" / "cartpole.toml")
STEPS = 128 * 4  # env steps per actor per round in plans/cartpole.toml
BASE = ["--set", 'run.mode="pipelined"', "--set", "stop.target_return=1e9", "--set", "probes=[]",
        "--set", "actors.count=2"]


def _run(tmp_path: Path, *sets: str, fault: dict | None = None) -> tuple[dict, list[dict]]:
    out = tmp_path / "run"
    args = ["run", CARTPOLE, "--out", str(out), *BASE]
    for item in sets:
        args += ["--set", item]
    env = {"NITRO_FAULT": json.dumps(fault)} if fault else None
    result = run_cli(*args, env=env, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), events


def test_batches_are_one_version_stale_and_no_invocation_outlives_the_run(tmp_path: Path
                                                                          ) -> None:
    s, events = _run(tmp_path, "stop.max_rounds=4")
    assert s["rounds"] == 4 and s["stop_reason"] == "max_rounds"
    assert s["env_steps"] == 4 * 2 * STEPS
    # Round 4 launched nothing for a round 5 that max_rounds rules out.
    assert s["invocations"] == 8 and s["invocation_errors"] == 0
    lags = {e["round"]: (e["mean"], e["max"]) for e in events if e["event"] == "VersionLag"}
    assert lags == {1: (0.0, 0), 2: (1.0, 1), 3: (1.0, 1), 4: (1.0, 1)}
    # Request ids name the round that trains on them, though they start one round earlier.
    trained = [e["request_id"] for e in events if e["event"] == "BatchArrived"]
    assert [int(rid.split("-r")[1].split("-")[0]) for rid in trained] == [1, 1, 2, 2, 3, 3, 4, 4]
    # Each round is charged for its own invocations: two each.
    finished = [e for e in events if e["event"] == "InvocationFinished"]
    assert len(finished) == 8


def test_a_step_limit_stops_the_fan_out_before_the_last_round(tmp_path: Path) -> None:
    s, _ = _run(tmp_path, f"stop.max_env_steps={3 * 2 * STEPS}")
    assert s["stop_reason"] == "max_env_steps" and s["rounds"] == 3
    assert s["invocations"] == 6


def test_a_failing_actor_is_replaced_and_its_round_goes_on(tmp_path: Path) -> None:
    s, _ = _run(tmp_path, "stop.max_rounds=3", "actors.handler=tests.fault_handlers:faulty",
                fault={"mode": "raise", "actors": [1]})
    assert s["rounds"] == 3 and s["stop_reason"] == "max_rounds"
    assert s["invocation_errors"] == 1 and s["handler_errors"] == 1
    # The failed invocation's batch was sampled again by a replacement: nothing is missing.
    assert s["env_steps"] == 3 * 2 * STEPS and s["invocations"] == 7
