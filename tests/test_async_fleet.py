"""Async mode with a learner slower than its actors: the fleet keeps only as many invocations
outstanding as the learner digests, so what is sampled is trained on instead of going stale.

The run is real (local worker processes, CartPole, APPO through the engine); the learner is
slowed by many SGD passes per batch. Before the fleet adapted, the same run with 16 epochs per
update dropped 2,163 of the 2,183 batches it read over 20 updates as stale (a busy 2-core
machine); the fleet kept every invocation it could replace running, whatever the learner took.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kernel import events as ev
from kernel.engine import Engine
from kernel.fleet import RECOVER_ROUNDS, FleetSize

PLAN = Path(__file__).resolve().parent.parent / "plans" / "cartpole-impala.toml"
TARGET = 4
ROUNDS = 20


def run_slow_learner(tmp_path: Path) -> tuple[Engine, list[ev.Event]]:
    overrides = {
        # 8 envs x 16 steps per batch, 8 epochs of 8 one-sequence minibatches: the update takes
        # several times an invocation's time.
        "algo.name": "appo", "algo.update_epochs": 8, "algo.num_minibatches": 8,
        "env.num_envs": 8, "actors.steps": 16, "actors.workers": 2,
        "actors.count": TARGET, "actors.batches_per_update": 1, "actors.max_lag": 1,
        "stop.max_rounds": ROUNDS, "stop.target_return": 1e9, "stop.max_wall_s": 150.0,
        "probes": [], "checkpoint.enabled": False, "sinks": [],
    }
    engine = Engine.from_plan(PLAN, overrides=overrides, out_dir=tmp_path / "run")
    seen: list[ev.Event] = []

    async def body() -> None:
        async with engine:
            async def watch() -> None:
                async for event in engine.events(maxsize=100_000):
                    if isinstance(event, (ev.VersionLag, ev.LearnerUpdated)):
                        seen.append(event)

            watcher = asyncio.create_task(watch())
            await asyncio.sleep(0)
            try:
                await engine.run()
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)

    asyncio.run(body())
    return engine, seen


def test_a_slow_learner_trains_on_most_of_what_its_actors_sample(tmp_path: Path) -> None:
    engine, seen = run_slow_learner(tmp_path)
    s, c = engine.state, engine.state.counters
    assert s.round == ROUNDS and c.invocation_errors == 0
    assert c.trained_env_steps == s.env_steps > 0
    fraction = c.trained_fraction()
    assert fraction is not None and fraction >= 0.8, (fraction, c)
    assert c.stale_batches < ROUNDS // 4, c
    lags = [e for e in seen if isinstance(e, ev.VersionLag)]
    assert len(lags) == ROUNDS
    assert all(e.in_flight is not None and 1 <= e.in_flight <= TARGET for e in lags)
    # One batch per update, each update longer than an invocation: one outstanding suffices.
    assert [e.in_flight for e in lags[-5:]] == [1] * 5, [e.in_flight for e in lags]
    assert all(e.trained_fraction is not None and 0 < e.trained_fraction <= 1 for e in lags)
    # Nothing outstanding waits long: lags stay within max_lag.
    assert max(e.max for e in lags) <= 1
    # Few invocations beyond the batches trained (the tail still in flight at the stop).
    assert c.invocations <= ROUNDS + c.stale_batches + TARGET, c


def grow(fleet: FleetSize, **measured: Any) -> int:
    defaults = {"target": 8, "batches_per_round": 2, "invocation_s": 1.0, "busy_s": 1.0,
                "stale": 0}
    return fleet.update(**{**defaults, **measured})


def test_the_fleet_is_what_one_round_reads_times_the_rounds_an_invocation_spans() -> None:
    fleet = FleetSize(n_min=1, target=8, max_lag=4, batches_per_round=2)
    assert fleet.value == 8  # before anything is measured: the target
    assert grow(fleet, invocation_s=0.1, busy_s=1.0) == 2  # slow learner: one round's worth
    assert grow(fleet, invocation_s=2.5, busy_s=1.0) == 6  # invocations span three rounds
    assert grow(fleet, invocation_s=30.0, busy_s=1.0) == 8  # never above the scaler's target
    assert grow(fleet, invocation_s=30.0, busy_s=1.0, target=5) == 5
    # A batch waits size / B rounds in the queue: never more than max_lag rounds' worth.
    lagged = FleetSize(n_min=1, target=8, max_lag=1, batches_per_round=2)
    assert lagged.value == 2
    assert grow(lagged, invocation_s=2.5, busy_s=1.0) == 2


def test_stale_drops_lower_the_fleet_until_clean_rounds_raise_it_again() -> None:
    fleet = FleetSize(n_min=2, target=8, max_lag=4, batches_per_round=2)
    assert grow(fleet, invocation_s=1.5, busy_s=1.0) == 4
    assert grow(fleet, invocation_s=1.5, busy_s=1.0, stale=3) == 3
    assert grow(fleet, invocation_s=1.5, busy_s=1.0, stale=1) == 2
    assert grow(fleet, invocation_s=1.5, busy_s=1.0, stale=5) == 2  # never below actors.min
    values = [grow(fleet, invocation_s=1.5, busy_s=1.0) for _ in range(3 * RECOVER_ROUNDS)]
    assert values[RECOVER_ROUNDS - 2] == 2 and values[RECOVER_ROUNDS - 1] == 3
    assert values[-1] == 4  # back to what the timings ask for, not beyond
