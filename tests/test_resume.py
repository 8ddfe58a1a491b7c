"""Checkpoint and resume: a stopped run continues where it was, with nothing repeated."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kernel import checkpoint, codec
from kernel.engine import Engine
from tests.conftest import ROOT, resume_to_end, run_cli, run_stopped_after
from tests.test_cost import MODEL

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


# -- every piece of state survives a checkpoint ----------------------------------------------

#: Observation and return normalisation on, an adaptive scaler with state (KungFu, fed by the
#: GNS probe), a checkpoint every round.
STATEFUL = {"stop.max_rounds": 3, "stop.target_return": 1e9, "actors.steps": 64,
            "actors.count": 2, "actors.max": 4, "env.normalize_obs": True,
            "env.normalize_reward": True, "scaler.name": "kungfu",
            "probes": [{"name": "gns", "every": 1, "samples": 256, "slices": 4}],
            "sinks": [], "checkpoint.every": 1}


def _assert_same(saved: object, restored: object, path: str = "state") -> None:
    """Deep equality of checkpoint-able state (maps, lists, numpy arrays, scalars)."""
    if isinstance(saved, dict):
        assert isinstance(restored, dict) and saved.keys() == restored.keys(), path
        for key in saved:
            _assert_same(saved[key], restored[key], f"{path}.{key}")
    elif isinstance(saved, (list, tuple)):
        assert isinstance(restored, (list, tuple)) and len(saved) == len(restored), path
        for i, (a, b) in enumerate(zip(saved, restored, strict=True)):
            _assert_same(a, b, f"{path}[{i}]")
    elif isinstance(saved, np.ndarray):
        np.testing.assert_array_equal(np.asarray(restored), saved, err_msg=path)
    else:
        assert restored == saved or (saved != saved and restored != restored), \
            (path, saved, restored)


def _snapshot(engine: Engine) -> dict:
    """Everything the docs promise a resume brings back, read through the roles' own
    ``state()`` (what a checkpoint holds)."""
    roles = engine._roles  # type: ignore[union-attr]
    s = engine.state
    return {
        "learner": roles.learner.state(),  # model, optimiser, torch RNG, obs/return stats
        "scaler": roles.scaler.state(),
        "cost_model": roles.cost.state(),
        "numpy_rng": engine.rng.bit_generator.state,
        "run": {"round": s.round, "env_steps": s.env_steps, "version": s.version,
                "cost_usd": s.cost_usd, "counters": dataclasses.asdict(s.counters),
                "history": [dataclasses.asdict(r) for r in s.history]},
    }


def test_a_resume_restores_every_piece_of_state(tmp_path: Path) -> None:
    out = tmp_path / "run"
    engine = Engine.from_plan(CARTPOLE, STATEFUL, out_dir=out)
    asyncio.run(engine.run())
    saved = _snapshot(engine)
    assert saved["learner"]["obs_rms"] is not None and saved["learner"]["ret_rms"] is not None
    assert saved["scaler"]["n"] is not None  # the scaler did adapt
    assert saved["run"]["cost_usd"] > 0 and saved["run"]["round"] == 3
    optimiser = saved["learner"]["core"]
    assert optimiser, "the learner's core state (model and optimiser) is empty?"
    body = checkpoint.read(checkpoint.latest(out))  # type: ignore[arg-type]
    assert body["run_state"]["round"] == 3

    async def restored() -> dict:
        again = Engine.resume(out)
        async with again:
            return _snapshot(again)

    _assert_same(saved, asyncio.run(restored()))


# -- an interrupted run continues exactly ----------------------------------------------------

EXACT = {"run.seed": 7, "stop.max_rounds": 6, "stop.target_return": 1e9,
         "actors.steps": 64, "actors.count": 2, "probes": [], "sinks": [],
         "checkpoint.every": 2, "checkpoint.exact_resume": True, "env.normalize_obs": True}


def _losses(out: Path) -> dict[int, dict[str, float]]:
    lines = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    return {e["round"]: e["metrics"] for e in lines if e["event"] == "LearnerUpdated"}


def _weights(engine: Engine) -> dict:
    return engine._roles.learner.weights()  # type: ignore[union-attr]


#: Pipelined rounds whose snapshot point is timed by the time model (an update slow enough,
#: 1 s, that the point falls part-way through it), not by this machine's clock.
TIMED_BY_MODEL = {"run.mode": "pipelined", "actors.simulate": True,
                  **{f"cost.{k}": v for k, v in MODEL.items()}, "cost.model_learner_s": 1.0}


@pytest.mark.parametrize("mode", ["sync", "pipelined", "timed-by-model"])
def test_an_interrupted_run_matches_an_uninterrupted_one_round_by_round(
        tmp_path: Path, mode: str) -> None:
    """With ``checkpoint.exact_resume``, stopped at a periodic checkpoint (round 4 of 6, so
    rounds 2, 4 and 6 continue their epoch's episodes) and resumed: the same losses every
    round and the same final weights. Pipelined rounds replay when their fan-out takes a
    fixed snapshot (``run.snapshot_at``) or one the time model times."""
    settings = {"sync": {"run.mode": "sync"},
                "pipelined": {"run.mode": "pipelined", "run.snapshot_at": 0.5},
                "timed-by-model": TIMED_BY_MODEL}[mode]
    plan = {**EXACT, **settings}
    straight = Engine.from_plan(CARTPOLE, plan, out_dir=tmp_path / "straight")
    asyncio.run(straight.run())
    expected = _losses(tmp_path / "straight")
    assert sorted(expected) == list(range(1, 7))

    out = tmp_path / "stopped"
    summary = run_stopped_after(Engine.from_plan(CARTPOLE, plan, out_dir=out), 4)
    assert summary["rounds"] == 4, summary
    final = _weights(resume_to_end(out))
    got = _losses(out)
    assert sorted(got) == list(range(1, 7))
    for number in range(1, 7):
        assert got[number] == pytest.approx(expected[number], rel=1e-6, abs=1e-9), number
    _assert_same(_weights(straight), final, "weights")


def test_a_resumed_simulated_cloud_is_as_warm_as_it_was(tmp_path: Path) -> None:
    """The simulated warm pool lives in the round records, which checkpoints keep: a run
    stopped after round 2 and resumed starts no function cold in round 3, in the clock (a
    cold start of 5 s would show in the round's simulated time) nor in the bill. Before, the
    actors backend kept its own pool, empty again after a resume."""
    plan = {**EXACT, "stop.max_rounds": 4, "actors.simulate": True,
            "actors.sim_cold_start_s": 5.0}
    out = tmp_path / "run"
    assert run_stopped_after(Engine.from_plan(CARTPOLE, plan, out_dir=out), 2)["rounds"] == 2
    resume_to_end(out)
    history = checkpoint.read(checkpoint.latest(out))["history"]  # type: ignore[arg-type]
    assert history[0]["sim_time_s"] > 5.0 > max(r["sim_time_s"] for r in history[1:])
    assert [(r["sim_cold_starts"], r["warm_pool"]) for r in history] == \
        [(2, 2), (0, 2), (0, 2), (0, 2)]
    charged = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()
               if '"event": "CostCharged"' in x]
    cold_usd = {e["round"]: e["items"].get("cold_start_usd", 0.0) for e in charged}
    assert [cold_usd[n] > 0 for n in range(1, 5)] == [True, False, False, False]


def test_a_checkpoint_from_before_the_records_kept_the_warm_pool_resumes_warm(
        tmp_path: Path) -> None:
    """Such a checkpoint's last record gets the most actors a round ran as its pool, so the
    resumed run's next round starts cold only functions beyond them."""
    out = tmp_path / "run"
    asyncio.run(Engine.from_plan(CARTPOLE, {**EXACT, "stop.max_rounds": 2,
                                            "actors.simulate": True}, out_dir=out).run())
    body = checkpoint.read(checkpoint.latest(out))  # type: ignore[arg-type]
    for r in body["history"]:
        del r["warm_pool"], r["sim_cold_starts"]
        r["actors"] = 3 if r["round"] == 1 else 2
    history = checkpoint._run_state(body).history
    assert [r.warm_pool for r in history] == [0, 3]


CARTPOLE_ENV = {"id": "CartPole-v1", "num_envs": 2, "normalize_obs": False,
                "normalize_reward": False}


def test_a_new_episode_epoch_restarts_the_actors_envs_and_nothing_else_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``checkpoint.exact_resume`` rests on: within an epoch a warm actor's episodes run
    on from one invocation to the next; a new epoch starts them afresh from the invocation's
    seed, exactly as the cold actor of a resumed run does. The actor function in-process."""
    from algos.ppo import PPO, PPOConfig
    from envs import describe
    from plugins.actors.workers import InvokeContext
    from plugins.function import handler as fn

    core = PPO(describe(CARTPOLE_ENV), PPOConfig())
    weights = codec.encode("weights", {"version": 0, "weights": {"model": core.weights()}})

    def first_obs(seed: int, epoch: int | None) -> np.ndarray:
        """The first observation of the rollout an invocation returns."""
        event = {"run_id": "epochs", "request_id": f"r-{seed}", "version": 0, "seed": seed,
                 "steps": 16, "env": CARTPOLE_ENV, "algo": {"algo": "ppo", **core.actor_spec()},
                 "transport": {"kind": "inline"}}
        if epoch is not None:
            event["episode_epoch"] = epoch
        context = InvokeContext(aws_request_id=event["request_id"], function_name="nitro-actor",
                                memory_limit_in_mb=1769,
                                deadline_ms=time.time() * 1000 + 60_000, attachment=weights)
        fn.handler(event, context)
        body = codec.decode(context.returned_payload, kind="batch")
        return np.asarray(body["data"]["obs"][0])

    cold = {}
    for seed in (11, 12):
        monkeypatch.setattr(fn, "_warm", fn._Warm())  # a fresh execution environment
        cold[seed] = first_obs(seed, 1)

    monkeypatch.setattr(fn, "_warm", fn._Warm())
    first_obs(11, None)  # no epoch in the event: epoch 0
    assert not np.allclose(first_obs(12, 0), cold[12]), "same epoch: the episodes go on"
    np.testing.assert_array_equal(first_obs(12, 1), cold[12])  # a new epoch: afresh
    assert not np.allclose(first_obs(11, 1), cold[11]), "and go on within the new epoch"


def test_exact_resume_needs_periodic_checkpoints() -> None:
    from kernel.schema import PlanError

    with pytest.raises(PlanError, match=r"checkpoint\.exact_resume: .*checkpoint\.every > 0"):
        Engine.from_plan(CARTPOLE, {"checkpoint.exact_resume": True, "checkpoint.every": 0})
