"""Whole runs through Redis: a real redis-server, real actor processes, real CartPole.

Hostile and unlucky deliveries (garbage, a pickle, a duplicate, a Redis restart) happen while
a run is in flight; the run must finish its rounds and count what it refused.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import redis

from kernel import events as ev
from kernel.engine import Engine
from plugins.transports.redis_stream import PASSWORD_ENV, batches_key
from tests.conftest import ROOT, RedisServer, run_cli, run_watching

pytestmark = pytest.mark.redis

CARTPOLE = ROOT / "plans" / "cartpole.toml"
#: Small rounds: the point is the data plane, not learning.
FAST = {"actors.steps": 32, "probes": [], "sinks": []}


def _overrides(url: str, rounds: int, **extra: Any) -> dict[str, Any]:
    return {**FAST, "transport.kind": "redis", "transport.url": url,
            "stop.max_rounds": rounds, **extra}


def test_cli_run_through_redis(redis_server: RedisServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli("run", str(CARTPOLE), "--out", str(out), "--set", "transport.kind=redis",
                   "--set", f"transport.url={redis_server.url}", "--set", "stop.max_rounds=3",
                   "--set", "actors.count=2", "--set", "actors.steps=32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 3
    assert summary["invocations"] == 6
    assert summary["invocation_errors"] == 0
    assert summary["rejected_payloads"] == 0
    assert summary["env_steps"] == 3 * 2 * 32 * 4
    # Every batch was used and acknowledged, and the clean end deleted the run's keys: nothing
    # left in the stream, the pending list, or the weights.
    r = redis.Redis.from_url(redis_server.url)
    assert r.keys(f"nitro:{summary['run_id']}:*") == []




def test_garbage_pickle_and_duplicate_are_refused_while_the_run_goes_on(
        redis_server: RedisServer, tmp_path: Path) -> None:
    engine = Engine.from_plan(CARTPOLE, _overrides(redis_server.url, 4, **{"actors.count": 2}),
                              out_dir=tmp_path / "run")
    r = redis.Redis.from_url(redis_server.url)
    stream = batches_key(engine.run_id)
    injected: list[str] = []

    async def inject(event: ev.Event) -> None:
        if isinstance(event, ev.RoundStarted) and event.round == 2:
            r.xadd(stream, {"p": b"\x93\x01garbage\xff"})
            r.xadd(stream, {"p": pickle.dumps({"a": 1})})  # test-only: the learner must refuse
            injected.append("junk")
        if isinstance(event, ev.BatchArrived) and event.round == 2 and "dup" not in injected:
            # Re-send a batch the learner has just taken (entries stay until acknowledged).
            for _mid, fields in r.xrange(stream):
                if fields.get(b"p", b"").startswith(b"\x83"):  # a codec map, not the junk
                    r.xadd(stream, {"p": fields[b"p"]})
                    injected.append("dup")
                    break

    summary = run_watching(engine, inject)
    assert injected == ["junk", "dup"]
    assert summary["stop_reason"] == "max_rounds"
    assert summary["rounds"] == 4
    assert summary["rejected_payloads"] >= 2
    assert summary["rejected_reasons"].get("pickle_rejected") == 1
    assert summary["duplicate_batches"] == 1
    # The duplicate was used once: every round trained on exactly its own two batches.
    assert summary["env_steps"] == 4 * 2 * 32 * 4
    assert r.xlen(stream) == 0


def _run_with_restart_at_round_2(redis_server: RedisServer, tmp_path: Path, mode: str
                                 ) -> dict[str, Any]:
    """Restart Redis (no persistence: weights, stream and group are lost) right after round
    2's weights are published; the run's summary."""
    engine = Engine.from_plan(
        CARTPOLE,
        _overrides(redis_server.url, 4, **{"actors.count": 2, "actors.deadline_s": 15.0,
                                           "run.mode": mode}),
        out_dir=tmp_path / "run",
    )
    restarted: list[int] = []

    async def restart(event: ev.Event) -> None:
        if isinstance(event, ev.WeightsPublished) and event.round == 2 and not restarted:
            # Blocking the engine's loop on purpose: awaited in a thread, the restart could
            # outlast a short run on a loaded machine, and the run would end (cancelling this
            # watcher) before Redis ever went away.
            redis_server.restart()
            restarted.append(event.round)

    summary = run_watching(engine, restart)
    assert restarted == [2]
    # What the learner put back after the restart (group, stream, weights) is deleted at the
    # clean end like the rest: no key and no pending entry of the run is left.
    r = redis.Redis.from_url(redis_server.url)
    assert r.keys(f"nitro:{engine.run_id}:*") == []
    assert r.dbsize() == 0
    assert summary["stop_reason"] == "max_rounds", summary
    assert summary["rounds"] == 4
    # Rounds after the restart trained on their batches again.
    assert summary["env_steps"] >= 2 * 2 * 32 * 4
    return summary


def test_redis_restart_mid_run(redis_server: RedisServer, tmp_path: Path) -> None:
    """The learner reconnects, puts the lost weights back, and the run completes its rounds.
    Sync rounds: the restart lands between publishing round 2's weights and the actors
    fetching them, so they are gone."""
    summary = _run_with_restart_at_round_2(redis_server, tmp_path, "sync")
    assert summary["redis_reconnects"] >= 1
    assert summary["weights_republished"] >= 1  # the current version was gone with the restart


def test_redis_restart_mid_pipelined_run_completes(redis_server: RedisServer, tmp_path: Path
                                                   ) -> None:
    """Under the default pipelined rounds the actors fetched their weights a round earlier:
    whatever the restart happens to catch (weights, batches in the stream, or nothing), the
    run completes."""
    _run_with_restart_at_round_2(redis_server, tmp_path, "pipelined")


def _assert_no_secret(out: Path, password: str, output: str) -> None:
    assert password not in output
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"plan.toml", "summary.json", "events.jsonl", "log.jsonl"} <= {p.name for p in files}
    for path in files:
        assert password.encode() not in path.read_bytes(), path


def test_password_in_url_never_reaches_run_files_or_output(tmp_path: Path) -> None:
    password = "s3cret-pw"
    server = RedisServer(tmp_path, password=password)
    server.start()
    try:
        out = tmp_path / "run"
        proc = run_cli("run", str(CARTPOLE), "--out", str(out), "--set", "transport.kind=redis",
                       "--set", f"transport.url={server.url}", "--set", "stop.max_rounds=2",
                       "--set", "actors.steps=32")
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rounds"] == 2 and summary["invocation_errors"] == 0
        assert "redis://:***@127.0.0.1" in (out / "plan.toml").read_text()
        _assert_no_secret(out, password, proc.stdout + proc.stderr)
    finally:
        server.stop()


def test_password_from_environment_reaches_actors_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    password = "s3cret-pw"
    server = RedisServer(tmp_path, password=password)
    server.start()
    try:
        monkeypatch.setenv(PASSWORD_ENV, password)
        out = tmp_path / "run"
        engine = Engine.from_plan(
            CARTPOLE, _overrides(f"redis://127.0.0.1:{server.port}/0", 2,
                                 sinks=[{"name": "console"}]), out_dir=out)
        summary = asyncio.run(engine.run())
        assert summary["rounds"] == 2 and summary["invocation_errors"] == 0
        captured = capfd.readouterr()
        _assert_no_secret(out, password, captured.out + captured.err)
    finally:
        server.stop()
