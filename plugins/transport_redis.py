"""The Redis transport: weights out by key, batches in through a stream and a consumer group.

Key layout, namespaced by run id so runs sharing a server never see each other's data:

- ``nitro:{run}:weights:{version}`` — one encoded weights payload per version. The newest
  ``keep_versions`` live for ``weights_ttl_s`` (a crashed run does not leak forever); older ones
  get ``old_weights_ttl_s`` so a straggler can still fetch them for a moment, then expire.
- ``nitro:{run}:batches`` — a stream of ``{"p": payload}`` entries read through the consumer
  group ``group``. An entry is acknowledged (XACK, then XDEL) only after the learner used it, so
  a learner that restarts with the same run id re-reads what it had not used: Redis keeps
  delivered-but-unacknowledged entries in the group's pending list (PEL) and
  ``XREADGROUP ... 0`` returns them. XADD trims with ``MAXLEN ~`` as a safety cap only.

Everything on the wire is a codec payload; this module moves bytes and never decodes them
(the coordinator validates, counts and acknowledges rejects, and drops duplicates by request
id — so duplicates and garbage are delivered here like any entry).

Outages: the learner side turns off redis-py's own retries so it sees every connection error,
backs off exponentially, and when the server answers again (a restarted server without
persistence has lost everything) recreates the group and republishes the current weights.
The password comes from the URL or ``NITRO_REDIS_PASSWORD`` and is kept out of
``public_spec()``, logs and exceptions; actors get it as their environment.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
import structlog
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, AuthorizationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kernel.roles import PluginContext

log = structlog.get_logger("plugins.transport_redis")

PASSWORD_ENV = "NITRO_REDIS_PASSWORD"
URL_ENV = "REDIS_URL"
#: The one field of a stream entry: the codec payload.
FIELD = b"p"
#: Errors after which a command may succeed if sent again (server away, socket dropped).
TRANSIENT = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)
#: ...except these, which redis-py derives from its ConnectionError: a wrong password or a
#: missing ACL permission does not heal by waiting.
FATAL = (AuthenticationError, AuthorizationError)
_SSL_KEYS = ("ssl_ca_certs", "ssl_cert_reqs")

T = TypeVar("T")


class RedisUnavailable(RuntimeError):
    """Redis stayed unreachable past the reconnect window: the run cannot go on."""


class WeightsMissing(LookupError):
    """The requested weights version is not in Redis (expired, or never published)."""


def weights_key(run_id: str, version: int) -> str:
    return f"nitro:{run_id}:weights:{version}"


def batches_key(run_id: str) -> str:
    return f"nitro:{run_id}:batches"


def split_url(url: str) -> tuple[str, str | None]:
    """``(url without password, password or None)``. The username stays: it is not a secret."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"expected a redis://, rediss:// or unix:// URL, got scheme "
                         f"{parts.scheme!r}")
    password = unquote(parts.password) if parts.password is not None else None
    if parts.password is None:
        return url, None
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    if parts.username:
        netloc = f"{parts.username}@{netloc}"
    if password == "***":
        password = None  # the redaction placeholder of a resolved plan: "given elsewhere"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), password


def resolve_password(url_password: str | None) -> str | None:
    """The URL's own password wins; else the environment's; empty means none."""
    return url_password or os.environ.get(PASSWORD_ENV) or None


def _client_kwargs(url: str, cfg: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "socket_timeout": float(cfg.get("socket_timeout_s") or 10.0),
        "socket_connect_timeout": float(cfg.get("connect_timeout_s") or 5.0),
    }
    if url.startswith("rediss://"):
        kwargs.update({k: cfg[k] for k in _SSL_KEYS if cfg.get(k) is not None})
    return kwargs


def validate(section: dict[str, Any], plan: dict[str, Any]) -> None:
    """Plan-time check of the URL (the message never repeats the URL: it may hold a password)."""
    split_url(section["url"])
    block_ms = section.get("block_ms") or 1000
    socket_timeout = section.get("socket_timeout_s") or 10.0
    if block_ms / 1000 >= socket_timeout:
        raise ValueError("block_ms must stay below socket_timeout_s, or a blocking read times out")


class RedisTransport:
    """The learner's side (``redis.asyncio``). One learner per run id reads the stream."""

    def __init__(self, ctx: PluginContext):
        cfg = ctx.config
        self.run_id = ctx.run_id
        self.url, url_password = split_url(cfg["url"])
        self._password = resolve_password(url_password)
        self._cfg = cfg
        self.keep_versions = int(cfg.get("keep_versions") or 3)
        self.weights_ttl_s = cfg.get("weights_ttl_s")
        self.old_weights_ttl_s = float(cfg.get("old_weights_ttl_s") or 30.0)
        self.stream_maxlen = int(cfg.get("stream_maxlen") or 10_000)
        self.block_ms = int(cfg.get("block_ms") or 1000)
        self.read_count = int(cfg.get("read_count") or 16)
        self.reconnect_s = float(cfg.get("reconnect_s") or 60.0)
        self.group = str(cfg.get("group") or "learners")
        self.consumer = str(cfg.get("consumer") or "learner")
        self.stream = batches_key(self.run_id)
        self._redis: aioredis.Redis | None = None
        self._buffer: deque[tuple[str, bytes]] = deque()
        #: Pending entries (delivered before a restart, never acknowledged) are read first,
        #: walking the PEL from this id; None once it is exhausted.
        self._pending_from: str | None = "0"
        self._versions: OrderedDict[int, None] = OrderedDict()
        self._current: tuple[int, bytes] | None = None
        self._down_since: float | None = None
        self._attempts = 0
        self._recover_lock = asyncio.Lock()
        self._counts = {"redis_reconnects": 0, "weights_republished": 0,
                        "redis_pending_reread": 0, "redis_errors": 0}

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, ctx: PluginContext) -> None:
        # redis-py's built-in retry is off: this class retries itself, so it notices every
        # outage and can repair what a restarted server lost.
        self._redis = aioredis.Redis.from_url(
            self.url, password=self._password, retry=aioredis.retry.Retry(NoBackoff(), 0),
            protocol=2,
            **_client_kwargs(self.url, self._cfg),
        )
        await self._call("start", self._ensure_group)
        log.info("redis_transport_started", url=self.url, stream=self.stream, group=self.group)

    def public_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"kind": "redis", "url": self.url, "run_id": self.run_id,
                                "stream_maxlen": self.stream_maxlen}
        spec.update({k: self._cfg[k] for k in _SSL_KEYS if self._cfg.get(k) is not None})
        if self._cfg.get("weights_wait_s") is not None:
            spec["weights_wait_s"] = float(self._cfg["weights_wait_s"])
        return spec

    def actor_environment(self) -> dict[str, str]:
        """What actor processes need in their environment (the way a Lambda gets secrets)."""
        return {PASSWORD_ENV: self._password} if self._password else {}

    def counters(self) -> dict[str, Any]:
        return dict(self._counts)

    async def close(self) -> None:
        if self._redis is not None:
            redis_, self._redis = self._redis, None
            await redis_.aclose()

    # -- weights -----------------------------------------------------------------------------

    async def publish_weights(self, version: int, payload: bytes) -> None:
        self._current = (version, payload)
        self._versions[version] = None
        self._versions.move_to_end(version)
        expiring = []
        while len(self._versions) > self.keep_versions:
            expiring.append(self._versions.popitem(last=False)[0])

        async def publish(r: aioredis.Redis) -> None:
            async with r.pipeline(transaction=False) as pipe:
                pipe.set(weights_key(self.run_id, version), payload, ex=self._ttl())
                for old in expiring:
                    pipe.expire(weights_key(self.run_id, old), int(self.old_weights_ttl_s) or 1)
                await pipe.execute()

        await self._call("publish_weights", publish)

    async def weights_payload(self, version: int) -> bytes | None:
        async def get(r: aioredis.Redis) -> bytes | None:
            return await r.get(weights_key(self.run_id, version))

        found = await self._call("weights_payload", get)
        if found is None and self._current is not None and self._current[0] == version:
            return self._current[1]
        return found

    def _ttl(self) -> int | None:
        return int(self.weights_ttl_s) if self.weights_ttl_s else None

    # -- batches -----------------------------------------------------------------------------

    async def deliver(self, payload: bytes) -> None:
        """XADD a batch a backend handed back itself, so it takes the same path as the rest."""
        async def add(r: aioredis.Redis) -> None:
            await r.xadd(self.stream, {FIELD: payload}, maxlen=self.stream_maxlen,
                         approximate=True)

        await self._call("deliver", add)

    async def next_batch(self, timeout: float) -> tuple[str, bytes] | None:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            if self._buffer:
                return self._buffer.popleft()
            remaining = deadline - time.monotonic()
            try:
                await self._read(remaining)
            except FATAL:
                raise
            except TRANSIENT as exc:
                await self._outage("next_batch", exc, remaining)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                # The stream or its group vanished (a server restarted without persistence
                # between two of our commands): repair as after an outage.
                self._counts["redis_errors"] += 1
                self._down_since = self._down_since or time.monotonic()
            if not self._buffer and time.monotonic() >= deadline:
                return None

    async def _read(self, remaining: float) -> None:
        r = self._client()
        if self._down_since is not None:
            await self._recover(r)
        if self._pending_from is not None:
            reply = await r.xreadgroup(self.group, self.consumer, {self.stream: self._pending_from},
                                       count=self.read_count)
            entries = _entries(reply)
            if not entries:
                self._pending_from = None
                return
            self._pending_from = entries[-1][0]
            self._take(entries, pending=True)
            return
        block = max(1, min(self.block_ms, int(remaining * 1000)))
        reply = await r.xreadgroup(self.group, self.consumer, {self.stream: ">"},
                                   count=self.read_count, block=block)
        self._take(_entries(reply), pending=False)

    def _take(self, entries: list[tuple[str, dict[bytes, bytes]]], pending: bool) -> None:
        for message_id, fields in entries:
            payload = fields.get(FIELD)
            if payload is None:
                # A pending entry whose body is gone (deleted or trimmed): nothing to re-read.
                # An entry with no payload field at all is delivered empty, to be rejected.
                if pending and not fields:
                    continue
                payload = b""
            if pending:
                self._counts["redis_pending_reread"] += 1
            self._buffer.append((message_id, payload))

    async def ack(self, message_ids: Sequence[str]) -> None:
        """XACK, then XDEL: used entries leave both the pending list and the stream."""
        ids = list(message_ids)
        if not ids:
            return

        async def ack(r: aioredis.Redis) -> None:
            async with r.pipeline(transaction=False) as pipe:
                pipe.xack(self.stream, self.group, *ids)
                pipe.xdel(self.stream, *ids)
                await pipe.execute()

        await self._call("ack", ack)

    # -- outages -----------------------------------------------------------------------------

    def _client(self) -> aioredis.Redis:
        if self._redis is None:
            raise RuntimeError("redis transport is not started (or already closed)")
        return self._redis

    async def _call(self, what: str, op: Callable[[aioredis.Redis], Any]) -> Any:
        """Run ``op`` until it succeeds, backing off while Redis is away (``reconnect_s``)."""
        while True:
            r = self._client()
            try:
                if self._down_since is not None:
                    await self._recover(r)
                result = await op(r)
            except FATAL:
                raise
            except TRANSIENT as exc:
                await self._outage(what, exc, None)
                continue
            if self._down_since is not None:
                self._up()
            return result

    async def _outage(self, what: str, exc: BaseException, remaining: float | None) -> None:
        now = time.monotonic()
        self._counts["redis_errors"] += 1
        if self._down_since is None:
            self._down_since = now
            log.warning("redis_unreachable", op=what, error=type(exc).__name__)
        down = now - self._down_since
        if down > self.reconnect_s:
            raise RedisUnavailable(
                f"redis at {self.url} unreachable for {down:.0f} s ({type(exc).__name__})"
            ) from None
        # Stale pooled sockets all point at the old server: drop the idle ones at once.
        if self._redis is not None:
            await self._redis.connection_pool.disconnect(inuse_connections=False)
        # Exponential backoff with jitter, from 50 ms up to 2 s.
        self._attempts += 1
        delay = min(2.0, 0.05 * 2 ** min(self._attempts - 1, 6)) * (0.5 + random.random() / 2)
        if remaining is not None:
            delay = max(0.0, min(delay, remaining))
        await asyncio.sleep(delay)

    async def _recover(self, r: aioredis.Redis) -> None:
        """After an outage: the group and the current weights may be gone; put them back."""
        async with self._recover_lock:
            if self._down_since is None:
                return
            await self._ensure_group(r)
            if self._current is not None:
                version, payload = self._current
                key = weights_key(self.run_id, version)
                if not await r.exists(key):
                    await r.set(key, payload, ex=self._ttl())
                    self._counts["weights_republished"] += 1
                    log.warning("weights_republished", version=version, bytes=len(payload))
            self._up()

    def _up(self) -> None:
        if self._down_since is None:
            return
        self._counts["redis_reconnects"] += 1
        log.info("redis_reconnected", down_s=round(time.monotonic() - self._down_since, 3))
        self._down_since = None
        self._attempts = 0

    async def _ensure_group(self, r: aioredis.Redis) -> None:
        """Create the group at id 0 (MKSTREAM): entries added before it existed are read too."""
        try:
            await r.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise


def _entries(reply: Any) -> list[tuple[str, dict[bytes, bytes]]]:
    """XREADGROUP's RESP2 reply (``[[stream, [(id, fields)]]]``) as ``[(id, fields)]``.

    A pending entry whose body was deleted comes back with empty fields.
    """
    out: list[tuple[str, dict[bytes, bytes]]] = []
    for _name, entries in reply or []:
        for message_id, fields in entries or []:
            mid = message_id.decode() if isinstance(message_id, bytes) else str(message_id)
            out.append((mid, fields or {}))
    return out


class ActorRedisClient:
    """The actor's side: a synchronous client kept warm across invocations of one worker.

    Connection errors are retried a few times with backoff (a push may then land twice: the
    learner drops duplicates by request id). Missing weights are waited for briefly, since a
    learner republishes them right after a Redis restart, then raise ``WeightsMissing``.
    """

    def __init__(self, url: str, password: str | None = None, *, stream_maxlen: int = 10_000,
                 weights_wait_s: float = 5.0, attempts: int = 6,
                 ssl: dict[str, Any] | None = None):
        self.url, url_password = split_url(url)
        self.stream_maxlen = stream_maxlen
        self.weights_wait_s = weights_wait_s
        self.attempts = attempts
        self.redis = redis.Redis.from_url(
            self.url, password=password or url_password, retry=redis.retry.Retry(NoBackoff(), 0),
            protocol=2,
            socket_timeout=30.0, socket_connect_timeout=5.0,
            **({k: v for k, v in (ssl or {}).items() if v is not None}
               if self.url.startswith("rediss://") else {}),
        )

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> ActorRedisClient:
        """``REDIS_URL`` (the function's environment) wins over the event's public URL."""
        url = os.environ.get(URL_ENV) or spec["url"]
        _, url_password = split_url(url)
        return cls(url, resolve_password(url_password),
                   stream_maxlen=int(spec.get("stream_maxlen", 10_000)),
                   weights_wait_s=float(spec.get("weights_wait_s", 5.0)),
                   ssl={k: spec.get(k) for k in _SSL_KEYS})

    def fetch_weights(self, run_id: str, version: int) -> bytes:
        key = weights_key(run_id, version)
        deadline = time.monotonic() + self.weights_wait_s
        delay = 0.05
        while True:
            payload = self._retry(lambda: self.redis.get(key))
            if payload is not None:
                return payload
            if time.monotonic() >= deadline:
                raise WeightsMissing(
                    f"weights version {version} of run {run_id} are not in Redis "
                    f"(expired or never published; waited {self.weights_wait_s:.1f} s)"
                )
            time.sleep(delay)
            delay = min(0.5, delay * 2)

    def push_batch(self, run_id: str, payload: bytes) -> None:
        self._retry(lambda: self.redis.xadd(batches_key(run_id), {FIELD: payload},
                                            maxlen=self.stream_maxlen, approximate=True))

    def _retry(self, op: Callable[[], T]) -> T:
        delay = 0.05
        for attempt in range(1, self.attempts + 1):
            try:
                return op()
            except FATAL:
                raise
            except TRANSIENT:
                if attempt == self.attempts:
                    raise
                time.sleep(delay * (0.5 + random.random() / 2))
                delay = min(2.0, delay * 2)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.redis.close()
