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
from tests.test_faults_local import _exit_status

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
    assert "Traceback" not in result.stderr
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    assert result.returncode == _exit_status(summary), result.stderr[-3000:]
    return summary, events


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


def _published(events: list[dict]) -> list[tuple[int, int]]:
    return [(e["round"], e["version"]) for e in events if e["event"] == "WeightsPublished"]


def test_a_fixed_snapshot_point_samples_with_mid_update_weights(tmp_path: Path) -> None:
    s, events = _run(tmp_path, "stop.max_rounds=4", "run.snapshot_at=0.5")
    assert s["rounds"] == 4 and s["invocations"] == 8
    # Rounds 1-3 publish a snapshot during their update, then the update's weights; round 4
    # starts no next round, so it takes no snapshot.
    assert _published(events) == [(1, 1), (1, 2), (1, 3), (2, 4), (2, 5), (3, 6), (3, 7), (4, 8)]
    arrived = {}
    for e in events:
        if e["event"] == "BatchArrived":
            arrived.setdefault(e["round"], set()).add(e["version"])
    assert arrived == {1: {1}, 2: {2}, 3: {4}, 4: {6}}
    # The snapshot really is mid-update: published before that update's LearnerUpdated.
    order = [(e["event"], e.get("version")) for e in events
             if e["event"] in ("WeightsPublished", "LearnerUpdated")]
    assert order.index(("WeightsPublished", 2)) < order.index(("LearnerUpdated", 1))
    lags = {e["round"]: e["max"] for e in events if e["event"] == "VersionLag"}
    assert lags == {1: 0, 2: 1, 3: 1, 4: 1}


def test_snapshot_at_zero_starts_the_fan_out_with_the_previous_weights(tmp_path: Path) -> None:
    s, events = _run(tmp_path, "stop.max_rounds=3", "run.snapshot_at=0")
    assert _published(events) == [(1, 1), (1, 2), (2, 3), (3, 4)]
    assert s["invocations"] == 6


def test_the_snapshot_point_is_timed_from_the_last_round(tmp_path: Path) -> None:
    """A long update (40 epochs) against short sampling: the fan-out starts late in it."""
    s, events = _run(tmp_path, "stop.max_rounds=5", "algo.update_epochs=40")
    assert s["rounds"] == 5 and s["invocations"] == 10
    # Round 1 has no timings yet and starts the fan-out at once; later rounds snapshot.
    per_round: dict[int, int] = {}
    for number, _ in _published(events):
        per_round[number] = per_round.get(number, 0) + 1
    assert per_round[1] == 2 and per_round[5] == 1
    assert all(per_round[r] == 2 for r in (2, 3, 4)), per_round
    assert all(e["max"] <= 1 for e in events if e["event"] == "VersionLag")


def test_an_update_that_stops_before_the_snapshot_point_launches_with_fresh_weights(
        tmp_path: Path) -> None:
    """target_kl ends each update after its first epoch, before the 0.9 snapshot point."""
    s, events = _run(tmp_path, "stop.max_rounds=3", "run.snapshot_at=0.9",
                     "algo.target_kl=1e-9")
    assert s["rounds"] == 3 and s["invocations"] == 6
    # No snapshot: the next fan-out starts after each update, with what it published.
    assert _published(events) == [(1, 1), (1, 2), (2, 3), (3, 4)]
    lags = {e["round"]: e["max"] for e in events if e["event"] == "VersionLag"}
    assert lags == {1: 0, 2: 0, 3: 0}
