"""The Redis transport against a real redis-server: key layout, consumer group, outages, secrets.

No engine here: the learner side (``RedisTransport``) and the actor side
(``ActorRedisClient``) talk through the server started by the ``redis_server`` fixture.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from kernel import codec
from kernel.roles import PluginContext
from plugins.transport_redis import (
    PASSWORD_ENV,
    ActorRedisClient,
    RedisTransport,
    WeightsMissing,
    batches_key,
    split_url,
    validate,
    weights_key,
)
from tests.conftest import RedisServer

pytestmark = pytest.mark.redis


def make_transport(url: str, run_id: str, tmp: Path, **config: Any) -> RedisTransport:
    ctx = PluginContext(name="redis", config={"url": url, **config}, plan={}, run_id=run_id,
                        run_dir=tmp, seed=0, bus=None)
    return RedisTransport(ctx)


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())


def batch(request_id: str, version: int = 1) -> bytes:
    return codec.encode("batch", {"run_id": "r", "request_id": request_id, "version": version,
                                  "env_steps": 8, "episode_returns": np.zeros(0, np.float32),
                                  "data": {"obs": np.ones((2, 4), np.float32)}})


def new_run_id() -> str:
    return f"test-{secrets.token_hex(4)}"


def test_weights_and_batches_round_trip(redis_server: RedisServer, tmp_path: Path) -> None:
    run_id = new_run_id()
    weights = codec.encode("weights", {"version": 1, "weights": {"w": np.arange(3.0)}})

    async def body() -> None:
        transport = make_transport(redis_server.url, run_id, tmp_path)
        await transport.start(None)  # type: ignore[arg-type]
        try:
            await transport.publish_weights(1, weights)
            actor = ActorRedisClient.from_spec(transport.public_spec())
            assert actor.fetch_weights(run_id, 1) == weights
            actor.push_batch(run_id, batch("a0"))
            actor.push_batch(run_id, batch("a1"))
            got = [await transport.next_batch(2.0), await transport.next_batch(2.0)]
            assert [p for _, p in got] == [batch("a0"), batch("a1")]  # type: ignore[misc]
            assert await transport.next_batch(0.05) is None
            await transport.ack([mid for mid, _ in got])  # type: ignore[misc]
            actor.close()
        finally:
            await transport.close()

    run(body)
    r = redis.Redis.from_url(redis_server.url)
    # Used entries leave the stream and the pending list: nothing accumulates.
    assert r.xlen(batches_key(run_id)) == 0
    assert r.xpending(batches_key(run_id), "learners")["pending"] == 0
    assert r.exists(weights_key(run_id, 1))


def test_old_versions_expire_and_newest_are_kept(redis_server: RedisServer,
                                                 tmp_path: Path) -> None:
    run_id = new_run_id()

    async def body() -> None:
        transport = make_transport(redis_server.url, run_id, tmp_path, keep_versions=2,
                                   weights_ttl_s=0, old_weights_ttl_s=20)
        await transport.start(None)  # type: ignore[arg-type]
        for version in range(1, 6):
            await transport.publish_weights(version, b"w%d" % version)
        assert await transport.weights_payload(5) == b"w5"
        await transport.close()

    run(body)
    r = redis.Redis.from_url(redis_server.url)
    ttls = {v: r.ttl(weights_key(run_id, v)) for v in range(1, 6)}
    assert ttls[4] == ttls[5] == -1  # newest two: no expiry (weights_ttl_s = 0)
    assert all(0 < ttls[v] <= 20 for v in (1, 2, 3))


def test_restarted_learner_rereads_unacknowledged_batches(redis_server: RedisServer,
                                                          tmp_path: Path) -> None:
    run_id = new_run_id()
    actor = ActorRedisClient(redis_server.url)
    for i in range(3):
        actor.push_batch(run_id, batch(f"a{i}"))

    async def first_learner() -> list[tuple[str, bytes]]:
        transport = make_transport(redis_server.url, run_id, tmp_path, read_count=1)
        await transport.start(None)  # type: ignore[arg-type]
        got = [await transport.next_batch(2.0) for _ in range(3)]
        await transport.ack([got[0][0]])  # type: ignore[index]
        await transport.close()  # "crashes" before using a1 and a2
        return got  # type: ignore[return-value]

    async def second_learner() -> tuple[list[Any], dict[str, Any]]:
        transport = make_transport(redis_server.url, run_id, tmp_path, read_count=1)
        await transport.start(None)  # type: ignore[arg-type]
        actor.push_batch(run_id, batch("a3"))
        got = [await transport.next_batch(2.0) for _ in range(3)]
        assert await transport.next_batch(0.05) is None
        await transport.ack([m[0] for m in got])
        await transport.close()
        return got, transport.counters()

    first = run(first_learner)
    second, counters = run(second_learner)
    assert [m[0] for m in second[:2]] == [m[0] for m in first[1:]]
    assert second[2][1] == batch("a3")
    assert counters["redis_pending_reread"] == 2
    assert redis.Redis.from_url(redis_server.url).xlen(batches_key(run_id)) == 0


def test_duplicates_and_garbage_are_delivered_for_the_coordinator_to_count(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """The transport never decodes: duplicates and junk reach the coordinator, which counts
    and acknowledges them (so they are not re-read either)."""
    run_id = new_run_id()
    actor = ActorRedisClient(redis_server.url)
    actor.push_batch(run_id, batch("a0"))
    actor.push_batch(run_id, batch("a0"))
    actor.push_batch(run_id, b"\x00garbage")
    redis.Redis.from_url(redis_server.url).xadd(batches_key(run_id), {"other": "field"})

    async def body() -> list[Any]:
        transport = make_transport(redis_server.url, run_id, tmp_path)
        await transport.start(None)  # type: ignore[arg-type]
        got = [await transport.next_batch(2.0) for _ in range(4)]
        await transport.ack([m[0] for m in got])
        await transport.close()
        return got

    got = run(body)
    assert [p for _, p in got] == [batch("a0"), batch("a0"), b"\x00garbage", b""]
    assert len({mid for mid, _ in got}) == 4


def test_redis_restart_republishes_weights_and_recreates_the_group(
        redis_server: RedisServer, tmp_path: Path) -> None:
    run_id = new_run_id()

    async def body() -> dict[str, Any]:
        transport = make_transport(redis_server.url, run_id, tmp_path)
        await transport.start(None)  # type: ignore[arg-type]
        await transport.publish_weights(7, b"weights-v7")
        await asyncio.to_thread(redis_server.restart)  # no persistence: everything is gone
        assert await transport.next_batch(1.0) is None
        actor = ActorRedisClient(redis_server.url, weights_wait_s=0)
        assert actor.fetch_weights(run_id, 7) == b"weights-v7"
        actor.push_batch(run_id, batch("after"))
        message = await transport.next_batch(2.0)
        assert message is not None and message[1] == batch("after")
        await transport.ack([message[0]])
        await transport.close()
        return transport.counters()

    counters = run(body)
    assert counters["weights_republished"] == 1
    assert counters["redis_reconnects"] >= 1


def test_actor_client_survives_a_restart_and_reports_missing_weights(
        redis_server: RedisServer) -> None:
    actor = ActorRedisClient(redis_server.url, weights_wait_s=0.2)
    actor.push_batch("r1", b"x")
    redis_server.restart()
    actor.push_batch("r1", b"y")  # the stale socket fails once; the retry reconnects
    assert redis.Redis.from_url(redis_server.url).xlen(batches_key("r1")) == 1
    with pytest.raises(WeightsMissing, match="version 3 of run r1"):
        actor.fetch_weights("r1", 3)


def test_password_stays_out_of_the_public_spec(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    server = RedisServer(tmp_path, password="s3cret-pw")
    server.start()
    try:
        run_id = new_run_id()

        async def body(url: str) -> dict[str, Any]:
            transport = make_transport(url, run_id, tmp_path)
            await transport.start(None)  # type: ignore[arg-type]
            await transport.publish_weights(1, b"w")
            spec = transport.public_spec()
            env = transport.actor_environment()
            await transport.close()
            return {"spec": spec, "env": env}

        # Password in the URL.
        out = run(lambda: body(server.url))
        assert "s3cret-pw" not in repr(out["spec"])
        assert out["spec"]["url"] == f"redis://127.0.0.1:{server.port}/0"
        assert out["env"] == {PASSWORD_ENV: "s3cret-pw"}
        # The actor gets it from its environment only.
        monkeypatch.setenv(PASSWORD_ENV, "s3cret-pw")
        assert ActorRedisClient.from_spec(out["spec"]).fetch_weights(run_id, 1) == b"w"
        # Password from the environment, URL without one.
        out = run(lambda: body(out["spec"]["url"]))
        assert out["env"] == {PASSWORD_ENV: "s3cret-pw"}
        # A wrong password fails at once, without the reconnect loop, and without the secret.
        monkeypatch.setenv(PASSWORD_ENV, "wrong")
        with pytest.raises(redis.AuthenticationError) as info:
            run(lambda: body(f"redis://127.0.0.1:{server.port}/0"))
        assert "wrong" not in str(info.value)
    finally:
        server.stop()


def test_url_checks_never_echo_the_password() -> None:
    assert split_url("rediss://user:p%40ss@host:6380/2") == ("rediss://user@host:6380/2", "p@ss")
    assert split_url("redis://h:1/0") == ("redis://h:1/0", None)
    with pytest.raises(ValueError) as info:
        validate({"url": "http://:hunter2@h/0"}, {})
    assert "hunter2" not in str(info.value)
    with pytest.raises(ValueError, match="block_ms"):
        validate({"url": "redis://h/0", "block_ms": 20_000, "socket_timeout_s": 10.0}, {})
