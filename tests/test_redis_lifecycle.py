"""Redis state never outlives a run: keys, memory and pending entries after a clean run, a
crashed one (once its keys expired) and a run through a Redis restart.

Real redis-server, real actor processes, real CartPole; the crash is a SIGKILL of the CLI.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from kernel.engine import Engine
from plugins.transports.redis_stream import batches_key
from tests.conftest import PYTHON, ROOT, RedisServer, missing

pytestmark = pytest.mark.redis

CARTPOLE = ROOT / "plans" / "cartpole.toml"
FAST = {"actors.steps": 32, "probes": [], "sinks": [], "actors.count": 2}
#: Redis keeps a fixed few hundred KiB after the first clients and streams have come and gone
#: (allocator and client bookkeeping, measured at ~0.4 MiB here whatever the run's length).
MEMORY_SLACK = 1024 * 1024
#: What a longer run may add on top of a short one: nothing per round.
GROWTH_SLACK = 64 * 1024


def _used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def _state(r: redis.Redis, run_id: str) -> dict[str, Any]:
    keys = sorted(k.decode() for k in r.keys(f"nitro:{run_id}:*"))
    stream = batches_key(run_id)
    pending = r.xpending(stream, "learners")["pending"] if r.exists(stream) else 0
    return {"keys": keys, "pending": pending, "ttls": {k: r.ttl(k) for k in keys}}


def _run(url: str, out: Path, rounds: int, mode: str = "sync") -> str:
    engine = Engine.from_plan(CARTPOLE, {**FAST, "transport.kind": "redis",
                                         "transport.url": url, "stop.max_rounds": rounds,
                                         "run.mode": mode}, out_dir=out)
    summary = asyncio.run(engine.run())
    assert summary["rounds"] == rounds and summary["invocation_errors"] == 0
    return engine.run_id


def test_a_clean_run_leaves_nothing_in_redis(redis_server: RedisServer, tmp_path: Path) -> None:
    """No key, no pending entry, and memory that does not grow with the number of rounds."""
    r = redis.Redis.from_url(redis_server.url)
    before = _used_memory(r)
    short = _run(redis_server.url, tmp_path / "short", 2)
    assert _state(r, short) == {"keys": [], "pending": 0, "ttls": {}}
    after_short = _used_memory(r)
    long = _run(redis_server.url, tmp_path / "long", 8)
    assert _state(r, long) == {"keys": [], "pending": 0, "ttls": {}}
    assert r.dbsize() == 0
    assert _used_memory(r) - after_short < GROWTH_SLACK
    assert _used_memory(r) - before < MEMORY_SLACK


def test_a_clean_pipelined_run_leaves_nothing_in_redis(redis_server: RedisServer,
                                                       tmp_path: Path) -> None:
    """Pipelined rounds have a fan-out in flight at the stop: its late batches go too."""
    r = redis.Redis.from_url(redis_server.url)
    before = _used_memory(r)
    run_id = _run(redis_server.url, tmp_path / "run", 4, mode="pipelined")
    assert _state(r, run_id) == {"keys": [], "pending": 0, "ttls": {}}
    assert r.dbsize() == 0
    assert _used_memory(r) - before < MEMORY_SLACK


def test_a_crashed_run_expires(redis_server: RedisServer, tmp_path: Path) -> None:
    """SIGKILL mid-run: nothing is cleaned up, but every key the run created has an expiry
    (stream and consumer group included), so all of it is gone after the TTL."""
    r = redis.Redis.from_url(redis_server.url)
    before = _used_memory(r)
    out = tmp_path / "run"
    ttl = 4
    args = [PYTHON, "-m", "kernel", "run", str(CARTPOLE), "--out", str(out),
            "--set", "transport.kind=redis", "--set", f"transport.url={redis_server.url}",
            "--set", f"transport.stream_ttl_s={ttl}", "--set", f"transport.weights_ttl_s={ttl}",
            "--set", "stop.max_rounds=1000", "--set", "actors.steps=32", "--set", "probes=[]",
            "--set", "actors.count=2"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline
            events = out / "events.jsonl"
            if events.exists() and events.read_text().count('"RoundFinished"') >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    run_id = json.loads((out / "events.jsonl").read_text().splitlines()[0])["run_id"]
    left = _state(r, run_id)
    assert left["keys"], "a killed run cleans nothing up"
    assert all(0 < t <= ttl for t in left["ttls"].values()), left  # none without an expiry
    # DBSIZE still counts a key whose TTL has passed until Redis's expiry cycle reclaims it
    # (KEYS already hides it), so wait for both: the keys gone and their memory given back.
    deadline = time.monotonic() + ttl + 10
    while (r.keys(f"nitro:{run_id}:*") or r.dbsize()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _state(r, run_id) == {"keys": [], "pending": 0, "ttls": {}}
    assert r.dbsize() == 0
    assert _used_memory(r) - before < MEMORY_SLACK


def test_a_test_server_whose_port_was_taken_moves_to_a_free_one(tmp_path: Path) -> None:
    """The suite runs in parallel workers, each finding 'free' ports on its own: a port can
    be taken between the check and redis-server's bind. The test server must then start on
    another port, and never take the holder's server for its own."""
    import shutil
    import socket

    if shutil.which("redis-server") is None:
        missing("redis-server is not installed")
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()  # answers connections, as another worker's server would
    taken = holder.getsockname()[1]
    server = RedisServer(tmp_path)
    server.port = taken
    try:
        server.start()
        assert server.port != taken
        assert redis.Redis.from_url(server.url).ping()
        server.restart()  # a restart keeps its (now free) port
        assert redis.Redis.from_url(server.url).ping()
    finally:
        server.stop()
        holder.close()
