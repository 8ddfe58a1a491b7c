"""The Redis transport against a real redis-server: key layout, consumer group, outages, secrets.

No engine here: the learner side (``RedisTransport``) and the actor side
(``ActorRedisClient``) talk through the server started by the ``redis_server`` fixture.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from kernel import codec
from kernel.roles import PluginContext
from plugins.transports.redis_stream import (
    PASSWORD_ENV,
    TLS_ENV,
    URL_ENV,
    ActorRedisClient,
    RedisTransport,
    TransportRefused,
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
    # Used entries leave the stream and the pending list, and a clean close deletes every key
    # of the run (weights, the newest-version marker, the stream with its group).
    assert r.keys(f"nitro:{run_id}:*") == []


def test_old_versions_are_deleted_at_once_and_newest_are_kept(redis_server: RedisServer,
                                                              tmp_path: Path) -> None:
    """Memory is bounded by the versions kept, not by rounds/s x a TTL; a straggler asking
    for a retired version fails at once instead of waiting."""
    run_id = new_run_id()
    r = redis.Redis.from_url(redis_server.url)

    async def body() -> None:
        transport = make_transport(redis_server.url, run_id, tmp_path, keep_versions=2,
                                   weights_ttl_s=0)
        await transport.start(None)  # type: ignore[arg-type]
        for version in range(1, 41):
            await transport.publish_weights(version, b"w%d" % version)
        assert await transport.weights_payload(40) == b"w40"
        ttls = {v: r.ttl(weights_key(run_id, v)) for v in range(1, 41)}
        assert ttls[39] == ttls[40] == -1  # newest two: no expiry (weights_ttl_s = 0)
        assert all(ttls[v] == -2 for v in range(1, 39))  # older ones: gone already
        assert len(r.keys(f"nitro:{run_id}:weights:*")) == 2
        straggler = ActorRedisClient(redis_server.url, weights_wait_s=30)
        t0 = time.monotonic()
        with pytest.raises(WeightsMissing, match="version 3 of run .* retired"):
            straggler.fetch_weights(run_id, 3)
        assert time.monotonic() - t0 < 5  # not the 30 s wait for a version still to come
        assert straggler.fetch_weights(run_id, 39) == b"w39"
        straggler.close()
        await transport.close()

    run(body)


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

        async def body(url: str, actor_env: dict[str, str] | None = None) -> dict[str, Any]:
            """Publish, then (while the run lives) fetch as an actor with ``actor_env``."""
            transport = make_transport(url, run_id, tmp_path)
            await transport.start(None)  # type: ignore[arg-type]
            await transport.publish_weights(1, b"w")
            spec = transport.public_spec()
            env = transport.actor_environment()
            fetched = refused = None
            if actor_env is not None:
                with monkeypatch.context() as m:
                    for name in (PASSWORD_ENV, URL_ENV):
                        m.delenv(name, raising=False)
                    for name, value in actor_env.items():
                        m.setenv(name, value)
                    try:
                        fetched = ActorRedisClient.from_spec(spec).fetch_weights(run_id, 1)
                    except TransportRefused as exc:
                        refused = str(exc)
            await transport.close()
            return {"spec": spec, "env": env, "fetched": fetched, "refused": refused}

        # Password in the URL.
        out = run(lambda: body(server.url))
        assert "s3cret-pw" not in repr(out["spec"])
        assert out["spec"]["url"] == f"redis://127.0.0.1:{server.port}/0"
        public = f"redis://127.0.0.1:{server.port}/0"
        assert out["env"] == {PASSWORD_ENV: "s3cret-pw", URL_ENV: public}
        # The actor gets it from its environment only, with the URL it may send it to.
        out = run(lambda: body(server.url, {PASSWORD_ENV: "s3cret-pw"}))
        assert "REDIS_URL is not" in out["refused"] and out["fetched"] is None
        out = run(lambda: body(server.url, out["env"]))
        assert out["fetched"] == b"w"
        # Password from the environment, URL without one.
        monkeypatch.setenv(PASSWORD_ENV, "s3cret-pw")
        out = run(lambda: body(out["spec"]["url"]))
        assert out["env"] == {PASSWORD_ENV: "s3cret-pw", URL_ENV: public}
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


@pytest.mark.parametrize(
    ("url", "clean", "password"),
    [
        ("redis://h:6379/0?password=pw1", "redis://h:6379/0", "pw1"),
        ("redis://h:6379/0?db=0&password=pw1&x=1", "redis://h:6379/0?db=0&x=1", "pw1"),
        ("unix:///tmp/r.sock?db=2&password=pw1", "unix:///tmp/r.sock?db=2", "pw1"),
        ("redis://:p@ss@host:6379/0", "redis://host:6379/0", "p@ss"),
        ("redis://user:p@ss@w@host:6379/0", "redis://user@host:6379/0", "p@ss@w"),
        ("rediss://:***@host:6380/1", "rediss://host:6380/1", None),
        ("redis://h/0?password=***", "redis://h/0", None),
    ],
)
def test_every_url_form_of_a_password_is_split_off(url: str, clean: str,
                                                   password: str | None) -> None:
    """redis-py's own parser finds the password (user info with an unencoded '@', or a
    ``password=`` query argument); the URL that remains holds none of it."""
    assert split_url(url) == (clean, password)


def test_a_url_redis_py_cannot_parse_is_refused_without_echoing_it() -> None:
    # redis-py's own error would quote "p" (the password's head) as a bad port.
    with pytest.raises(ValueError) as info:
        validate({"url": "redis://:p/ss@host/0"}, {})
    assert "p/ss" not in str(info.value) and "'p'" not in str(info.value)


def _listener() -> tuple[Any, int]:
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(0.5)
    return sock, sock.getsockname()[1]


@pytest.mark.parametrize("change", ["port", "db", "scheme", "host"])
def test_an_event_cannot_send_the_functions_password_elsewhere(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    """With credentials in the function's environment, an event naming another server (a
    listening socket that would collect the password) is refused before any connection."""
    sock, port = _listener()
    try:
        monkeypatch.setenv(URL_ENV, f"redis://127.0.0.1:{redis_server.port}/0")
        monkeypatch.setenv(PASSWORD_ENV, "s3cret-pw")
        hostile = {"port": f"redis://127.0.0.1:{port}/0",
                   "db": f"redis://127.0.0.1:{redis_server.port}/5",
                   "scheme": f"rediss://127.0.0.1:{redis_server.port}/0",
                   "host": f"redis://localhost:{redis_server.port}/0"}[change]
        with pytest.raises(TransportRefused, match="another Redis than this function's REDIS_URL"
                           ) as info:
            ActorRedisClient.from_spec({"kind": "redis", "url": hostile})
        assert "s3cret-pw" not in str(info.value)
        with pytest.raises(OSError):
            sock.accept()  # nobody connected to the listener
        # Only a password in the environment, no URL: the event's URL is not trusted either.
        monkeypatch.delenv(URL_ENV)
        with pytest.raises(TransportRefused, match="REDIS_URL is not"):
            ActorRedisClient.from_spec({"kind": "redis", "url": f"redis://127.0.0.1:{port}/0"})
        with pytest.raises(OSError):
            sock.accept()
    finally:
        sock.close()
    # The same server, written the same way, is accepted (and actually works).
    monkeypatch.setenv(URL_ENV, redis_server.url)
    monkeypatch.delenv(PASSWORD_ENV)
    actor = ActorRedisClient.from_spec({"kind": "redis", "url": redis_server.url})
    actor.push_batch("r-same", b"x")
    actor.close()


def test_tls_policy_comes_from_the_environment_not_the_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An event cannot turn certificate checks off or pick the CA file; hostname checking is
    explicit (redis-py 5 leaves it off by default)."""
    monkeypatch.setenv(URL_ENV, "rediss://cache.internal:6380/0")
    for name in TLS_ENV.values():
        monkeypatch.delenv(name, raising=False)
    event = {"kind": "redis", "url": "rediss://cache.internal:6380/0",
             "ssl_cert_reqs": "none", "ssl_ca_certs": "/etc/hostname"}
    kwargs = ActorRedisClient.from_spec(event).redis.connection_pool.connection_kwargs
    assert kwargs["ssl_cert_reqs"] == "required"
    assert kwargs["ssl_check_hostname"] is True
    assert kwargs.get("ssl_ca_certs") is None
    monkeypatch.setenv(TLS_ENV["ssl_ca_certs"], "/etc/ssl/private-ca.pem")
    kwargs = ActorRedisClient.from_spec(event).redis.connection_pool.connection_kwargs
    assert kwargs["ssl_ca_certs"] == "/etc/ssl/private-ca.pem"
    assert kwargs["ssl_cert_reqs"] == "required"


def test_pending_entries_whose_bodies_were_trimmed_are_acknowledged(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """A learner restarts while entries it had taken were trimmed (MAXLEN) or deleted: they can
    never be re-read, so they must leave the pending list instead of staying there for good."""
    run_id = new_run_id()
    actor = ActorRedisClient(redis_server.url)
    r = redis.Redis.from_url(redis_server.url)

    async def first_learner() -> list[str]:
        transport = make_transport(redis_server.url, run_id, tmp_path)
        await transport.start(None)  # type: ignore[arg-type]
        for i in range(3):
            actor.push_batch(run_id, batch(f"a{i}"))
        got = [await transport.next_batch(2.0) for _ in range(3)]
        await transport.close()  # "crashes" holding all three
        return [m[0] for m in got]  # type: ignore[index]

    ids = run(first_learner)
    assert r.xpending(batches_key(run_id), "learners")["pending"] == 3
    r.xdel(batches_key(run_id), ids[0], ids[1])  # bodies gone, PEL entries remain

    async def second_learner() -> tuple[list[Any], dict[str, Any]]:
        transport = make_transport(redis_server.url, run_id, tmp_path)
        await transport.start(None)  # type: ignore[arg-type]
        got = [await transport.next_batch(1.0), await transport.next_batch(0.2)]
        assert r.xpending(batches_key(run_id), "learners")["pending"] == 1  # only the live one
        await transport.ack([got[0][0]])  # type: ignore[index]
        counters = transport.counters()
        await transport.close()
        return got, counters

    got, counters = run(second_learner)
    assert got[0] == (ids[2], batch("a2")) and got[1] is None
    assert counters["redis_trimmed_acked"] == 2
    assert r.keys(f"nitro:{run_id}:*") == []


def test_start_fails_in_seconds_when_redis_is_not_there(tmp_path: Path) -> None:
    """No minute of silent retries before round 1: one actionable line, no password."""
    from kernel.roles import Unreachable
    from tests.conftest import closed_port

    with closed_port() as port:
        url = f"redis://:s3cret-pw@127.0.0.1:{port}/0"  # nothing listens there
        transport = make_transport(url, new_run_id(), tmp_path)
        t0 = time.monotonic()
        with pytest.raises(Unreachable) as info:
            run(lambda: transport.start(None))  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 10
    assert "is redis-server running" in str(info.value)
    assert "s3cret-pw" not in str(info.value)
