"""Stale and forged batches during a real run: whoever can write to the Redis stream sends a
batch under a request id the round is waiting for (they are predictable from the run id, which
a Redis writer sees in the key names) but with an old policy version, or with another run's id.
Both must be dropped and counted (``stale_batches``), never trained on, while the honest
batches of the round are. And in an async run that tolerates no lag (``actors.max_lag = 0``),
slowed actors return batches that are stale by the time they are read: dropped, counted, and
reported per update (``VersionLag.dropped_stale``)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import redis

from kernel import codec
from kernel import events as ev
from kernel.engine import Engine
from plugins.transports.redis_stream import batches_key
from tests.conftest import ROOT, RedisServer, missing, run_watching

CARTPOLE = ROOT / "plans" / "cartpole.toml"
IMPALA = ROOT / "plans" / "cartpole-impala.toml"
ROUNDS, ACTORS, STEPS, ENVS = 3, 2, 32, 4


def _first_payload(r: redis.Redis, stream: str) -> bytes | None:
    entries = r.xrange(stream)
    return entries[0][1].get(b"p") if entries else None


@pytest.fixture(scope="module")
def forged_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict, list, dict]]:
    """One sync run through a real Redis whose round 2 receives two forged batches under
    request ids it waits for: (summary, events, {request id: kind of forgery})."""
    if shutil.which("redis-server") is None:
        missing("redis-server is not installed")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    out = tmp_path_factory.mktemp("forged") / "run"
    # Round 2's honest actors are slowed, so the forged batches are read first.
    fault = {"NITRO_FAULT": json.dumps({"mode": "slow", "rounds": [2], "seconds": 1})}
    with mock.patch.dict(os.environ, fault):
        try:
            summary, forged = _forge(server, out)
        finally:
            server.stop()
    events = [json.loads(line) for line in (out / "events.jsonl").open()]
    yield summary, events, forged


def _forge(server: RedisServer, out: Path) -> tuple[dict, dict[str, str]]:
    engine = Engine.from_plan(CARTPOLE, {
        "actors.steps": STEPS, "actors.count": ACTORS, "probes": [], "sinks": [],
        "transport.kind": "redis", "transport.url": server.url, "run.mode": "sync",
        "stop.max_rounds": ROUNDS, "checkpoint.enabled": False,
        "actors.handler": "tests.fault_handlers:faulty"}, out_dir=out)
    r = redis.Redis.from_url(server.url)
    stream = batches_key(engine.run_id)
    honest: list[dict[str, Any]] = []
    forged: dict[str, str] = {}

    async def inject(event: ev.Event) -> None:
        if isinstance(event, ev.BatchArrived) and not honest:
            payload = _first_payload(r, stream)
            if payload is not None:
                honest.append(codec.decode(payload, kind="batch"))
        if isinstance(event, ev.WeightsPublished) and event.round == 2 and honest:
            body, v = honest[0], event.version
            rid = f"{engine.run_id}-r2-v{v}"
            old = {**body, "request_id": f"{rid}-a0", "version": v - 1}
            other = {**body, "request_id": f"{rid}-a1", "version": v, "run_id": "another-run"}
            for name, batch in (("old_version", old), ("other_run", other)):
                r.xadd(stream, {"p": codec.encode("batch", batch)})
                forged[batch["request_id"]] = name

    return run_watching(engine, inject), forged


@pytest.mark.redis
def test_a_batch_with_an_old_version_or_another_run_id_is_dropped_and_counted(
        forged_run: tuple[dict, list, dict]) -> None:
    summary, events, forged = forged_run
    assert sorted(forged.values()) == ["old_version", "other_run"]
    assert summary["stop_reason"] == "max_rounds", summary
    assert summary["stale_batches"] >= 2
    assert summary["rejected_payloads"] == 0  # well-formed: stale, not malformed
    dropped = {(e["request_id"], e["reason"]) for e in events if e["event"] == "BatchDropped"}
    # Each forged batch was dropped as stale on arrival; had it been taken, its honest twin
    # would have been dropped as a duplicate.
    assert dropped == {(rid, "stale") for rid in forged}
    # Never trained on: whatever round 2 trained on was sampled with round 2's weights.
    published = {e["round"]: e["version"] for e in events if e["event"] == "WeightsPublished"}
    round2 = [e for e in events if e["event"] == "BatchArrived" and e["round"] == 2]
    assert all(e["version"] == published[2] for e in round2)
    trained = sum(e["env_steps"] for e in events if e["event"] == "BatchArrived")
    assert summary["env_steps"] == trained


@pytest.mark.redis
def test_a_forged_batch_does_not_cost_the_round_its_honest_batch(
        forged_run: tuple[dict, list, dict]) -> None:
    summary, events, forged = forged_run
    assert summary["stale_batches"] == 2
    round2 = [e for e in events if e["event"] == "BatchArrived" and e["round"] == 2]
    assert sorted(e["request_id"] for e in round2) == sorted(forged)
    assert summary["env_steps"] == ROUNDS * ACTORS * STEPS * ENVS


def test_an_async_run_without_lag_drops_and_counts_the_batches_of_slowed_actors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Actor 1 takes a second per invocation: by the time its batch is read the learner has
    # moved on (actor 0 keeps it busy), and max_lag = 0 tolerates no version behind.
    monkeypatch.setenv("NITRO_FAULT", json.dumps({"mode": "slow", "actors": [1],
                                                  "seconds": 1}))
    engine = Engine.from_plan(IMPALA, {
        "actors.handler": "tests.fault_handlers:faulty", "actors.max_lag": 0,
        "actors.count": 2, "actors.batches_per_update": 1, "actors.steps": 16,
        "actors.workers": 2, "stop.max_rounds": 12, "stop.max_env_steps": 10**8,
        "stop.target_return": 1e9, "probes": [], "sinks": [], "checkpoint.enabled": False},
        out_dir=tmp_path / "run")
    lags: list[ev.VersionLag] = []

    async def watch(event: ev.Event) -> None:
        if isinstance(event, ev.VersionLag):
            lags.append(event)

    summary = run_watching(engine, watch)
    assert summary["stop_reason"] == "max_rounds", summary
    assert summary["stale_batches"] >= 1, summary
    assert sum(e.dropped_stale for e in lags) == summary["stale_batches"]
    # What was trained on was never behind: lag 0 in every update.
    assert lags and all(e.max == 0 for e in lags)
    assert summary["env_steps"] == 12 * 16 * 8  # one fresh batch per update
