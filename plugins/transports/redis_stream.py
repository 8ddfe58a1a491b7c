"""The Redis transport: weights out by key, batches in through a stream and a consumer group.

Key layout, namespaced by run id so runs sharing a server never see each other's data. Every
key a run creates expires, and a clean end deletes them, so Redis state never outlives a run:

- ``nitro:{run}:weights:{version}`` — one encoded weights payload per version. Only the newest
  ``keep_versions`` exist: an older one is deleted as soon as a newer one is published, so
  memory is bounded by the versions in flight, not by rounds/s x a TTL. A straggler asking for
  a deleted version fails at once (``WeightsMissing``), told so by ``nitro:{run}:latest``
  (the newest version number). Kept versions live ``weights_ttl_s`` (a crashed run does not
  leak forever).
- ``nitro:{run}:batches`` — a stream of ``{"p": payload}`` entries read through the consumer
  group ``group`` (the group lives inside the stream key, so it expires with it). An entry is
  acknowledged (XACK, then XDEL) only after the learner used it, so a learner that restarts
  with the same run id re-reads what it had not used: Redis keeps delivered-but-unacknowledged
  entries in the group's pending list (PEL) and ``XREADGROUP ... 0`` returns them. A pending
  entry whose body was trimmed or deleted is acknowledged at once (it can never be re-read).
  XADD trims with ``MAXLEN ~`` as a safety cap only. The stream expires ``stream_ttl_s`` after
  the learner last touched it (refreshed while the run lives).

Everything on the wire is a codec payload; this module moves bytes and never decodes them
(the coordinator validates, counts and acknowledges rejects, and drops duplicates by request
id — so duplicates and garbage are delivered here like any entry).

Outages: the learner side turns off redis-py's own retries so it sees every connection error,
backs off exponentially, and when the server answers again (a restarted server without
persistence has lost everything) recreates the group and republishes the current weights.

Secrets: the password comes from the URL (user info or ``?password=``) or
``NITRO_REDIS_PASSWORD`` and is kept out of ``public_spec()``, logs and exceptions. Actors get
it, the URL and the TLS policy from their environment (the way a Lambda function gets them),
never from the event: a function whose environment names a Redis connects only there, and
refuses an event that names another one.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
import structlog
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.exceptions import AuthenticationError, AuthorizationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kernel.roles import PluginContext, Unreachable
from kernel.schema import defaults
from plugins.descriptors.redis_stream import REDIS_CONFIG

log = structlog.get_logger("plugins.transports.redis_stream")

PASSWORD_ENV = "NITRO_REDIS_PASSWORD"
URL_ENV = "REDIS_URL"
#: The TLS policy of an actor comes from its environment only (an event could otherwise turn
#: certificate checks off or name a CA file of its choosing).
TLS_ENV = {
    "ssl_ca_certs": "NITRO_REDIS_SSL_CA_CERTS",
    "ssl_cert_reqs": "NITRO_REDIS_SSL_CERT_REQS",
    "ssl_check_hostname": "NITRO_REDIS_SSL_CHECK_HOSTNAME",
}
#: The one field of a stream entry: the codec payload.
FIELD = b"p"
#: Errors after which a command may succeed if sent again (server away, socket dropped).
TRANSIENT = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)
#: ...except these, which redis-py derives from its ConnectionError: a wrong password or a
#: missing ACL permission does not heal by waiting.
FATAL = (AuthenticationError, AuthorizationError)
#: What the redaction of a resolved plan leaves where a password was: "given elsewhere".
PLACEHOLDER = "***"
DEFAULT_STREAM_TTL_S = 3600.0
#: Bounds on what an event may ask of the actor's client (the event is not trusted).
_EVENT_BOUNDS = {"stream_maxlen": (100, 1_000_000), "weights_wait_s": (0.0, 60.0),
                 "stream_ttl_s": (1.0, 7 * 86_400.0)}

T = TypeVar("T")


class RedisUnavailable(RuntimeError):
    """Redis stayed unreachable past the reconnect window: the run cannot go on."""


class WeightsMissing(LookupError):
    """The requested weights version is not in Redis (retired, expired, or never published)."""


class TransportRefused(ValueError):
    """An event asked the function to connect somewhere its environment does not allow."""

    reason = "transport_refused"


def weights_key(run_id: str, version: int) -> str:
    return f"nitro:{run_id}:weights:{version}"


def latest_key(run_id: str) -> str:
    return f"nitro:{run_id}:latest"


def batches_key(run_id: str) -> str:
    return f"nitro:{run_id}:batches"


def _parse(url: str) -> dict[str, Any]:
    """redis-py's own reading of ``url`` (so what we strip is what it would send). Its errors
    may quote part of the user info (a password with an unencoded ``/``), so none is kept."""
    try:
        return parse_url(url)
    except Exception:
        raise ValueError("expected a redis://, rediss:// or unix:// URL that redis-py can "
                         "parse (percent-encode '/', '?', '#' and '@' in a password)") from None


def split_url(url: str) -> tuple[str, str | None]:
    """``(url without password, password or None)``. The username stays: it is not a secret.

    The password may sit in the user info (even with an unencoded ``@``: the host starts
    after the last one) or in a ``password=`` query argument; both are removed."""
    password = _parse(url).get("password")
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    username = userinfo.partition(":")[0] if at else ""
    netloc = f"{username}@{hostport}" if username else hostport
    query = "&".join(arg for arg in parts.query.split("&")
                     if arg and unquote(arg.partition("=")[0]) != "password")
    # Built by hand: urlunsplit drops the "//" of ``unix:///path`` (empty netloc).
    clean = f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "") + (
        f"#{parts.fragment}" if parts.fragment else "")
    if password == PLACEHOLDER or password == "":
        password = None
    return clean, password


def endpoint(url: str) -> tuple[str, str, int, int]:
    """What a URL connects to: (scheme, host or socket path, port, db)."""
    parsed = _parse(url)
    scheme = urlsplit(url).scheme.lower()
    where = str(parsed.get("path") or parsed.get("host") or "localhost").lower()
    return scheme, where, int(parsed.get("port") or 6379), int(parsed.get("db") or 0)


def resolve_password(url_password: str | None) -> str | None:
    """The URL's own password wins; else the environment's; empty means none."""
    return url_password or os.environ.get(PASSWORD_ENV) or None


def tls_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """redis-py keyword arguments for TLS. Verification is on unless explicitly turned off, and
    hostname checking is explicit: redis-py 5 leaves it off by default. ``settings`` is the
    plan's section (the learner) or what the actor's environment names, which may leave any
    key unset."""
    reqs = str(settings.get("ssl_cert_reqs") or "required")
    check = settings.get("ssl_check_hostname")
    check_hostname = (True if check is None else bool(check)) and reqs != "none"
    out: dict[str, Any] = {"ssl_cert_reqs": reqs, "ssl_check_hostname": check_hostname}
    if settings.get("ssl_ca_certs"):
        out["ssl_ca_certs"] = str(settings["ssl_ca_certs"])
    return out


def tls_from_environment() -> dict[str, Any]:
    """The actor's TLS policy, read from its environment only."""
    env = {key: os.environ.get(name) for key, name in TLS_ENV.items()}
    check = env["ssl_check_hostname"]
    return tls_settings({
        "ssl_ca_certs": env["ssl_ca_certs"],
        "ssl_cert_reqs": env["ssl_cert_reqs"],
        "ssl_check_hostname": None if check is None else check.strip().lower() not in
        ("0", "false", "no", "off"),
    })


def function_url(event_url: Any) -> str:
    """The URL an actor may connect to, given the event's.

    Where the function's environment holds credentials, it also names the server: an event
    cannot send the password elsewhere. ``REDIS_URL`` set: the event must name the same
    scheme, host (or socket), port and db. Only a password set: refused (no URL to trust).
    Neither: the event's URL (nothing secret would travel with it)."""
    env_url = os.environ.get(URL_ENV)
    if env_url:
        if event_url is not None:
            try:
                same = isinstance(event_url, str) and endpoint(event_url) == endpoint(env_url)
            except ValueError:
                same = False
            if not same:
                raise TransportRefused(
                    "the event's transport.url names another Redis than this function's "
                    "REDIS_URL (scheme, host, port and db must match); not connecting")
        return env_url
    if os.environ.get(PASSWORD_ENV):
        raise TransportRefused(
            f"{PASSWORD_ENV} is set but {URL_ENV} is not: the function sends its password only "
            f"to the Redis its own environment names; set {URL_ENV}")
    if not isinstance(event_url, str):
        raise TransportRefused("the event's transport names no url")
    return event_url


def unreachable_message(url: str, exc: BaseException) -> str:
    """One actionable line (``url`` holds no password: it comes from ``split_url``)."""
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text.lower():
        return (f"redis at {url}: TLS certificate verification failed; set "
                f"transport.ssl_ca_certs to the CA that signed the server's certificate")
    return (f"redis at {url} is unreachable ({type(exc).__name__}); is redis-server running "
            f"and transport.url right?")


def _bounded(spec: dict[str, Any], key: str, default: float) -> float:
    low, high = _EVENT_BOUNDS[key]
    try:
        value = float(spec.get(key, default))
    except (TypeError, ValueError):
        value = default
    return default if value != value else min(high, max(low, value))  # NaN: the default


def _client_kwargs(url: str, cfg: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "socket_timeout": float(cfg["socket_timeout_s"]),
        "socket_connect_timeout": float(cfg["connect_timeout_s"]),
    }
    if url.startswith("rediss://"):
        kwargs.update(tls_settings(cfg))
    return kwargs


def validate(section: dict[str, Any], plan: dict[str, Any]) -> None:
    """Plan-time check of the URL (the message never repeats the URL: it may hold a password)."""
    split_url(section["url"])
    if section["block_ms"] / 1000 >= section["socket_timeout_s"]:
        raise ValueError("block_ms must stay below socket_timeout_s, or a blocking read times out")


class RedisTransport:
    """The learner's side (``redis.asyncio``). One learner per run id reads the stream."""

    def __init__(self, ctx: PluginContext):
        # A plan's section arrives validated; a hand-made one (a test, an embedding) is
        # completed from the descriptor's own defaults.
        cfg = {**defaults(REDIS_CONFIG), **ctx.config}
        self.run_id = ctx.run_id
        self.url, url_password = split_url(cfg["url"])
        self._password = resolve_password(url_password)
        self._cfg = cfg
        self.keep_versions = int(cfg["keep_versions"])
        self.weights_ttl_s = cfg["weights_ttl_s"]
        self.stream_ttl_s = float(cfg["stream_ttl_s"])
        self.stream_maxlen = int(cfg["stream_maxlen"])
        self.block_ms = int(cfg["block_ms"])
        self.read_count = int(cfg["read_count"])
        self.reconnect_s = float(cfg["reconnect_s"])
        self.group = str(cfg["group"])
        self.consumer = str(cfg["consumer"])
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
        self._touched = 0.0
        self._recover_lock = asyncio.Lock()
        self._counts = {"redis_reconnects": 0, "weights_republished": 0,
                        "redis_pending_reread": 0, "redis_errors": 0,
                        "redis_trimmed_acked": 0, "weights_deleted": 0}

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, ctx: PluginContext) -> None:
        # redis-py's built-in retry is off: this class retries itself, so it notices every
        # outage and can repair what a restarted server lost.
        self._redis = aioredis.Redis.from_url(
            self.url, password=self._password, retry=aioredis.retry.Retry(NoBackoff(), 0),
            protocol=2,
            **_client_kwargs(self.url, self._cfg),
        )
        # Reachability before round 1: an absent server or an unverifiable certificate is a
        # one-line error within the connect timeout, not a minute of silent retries.
        try:
            await self._ensure_group(self._redis)
        except FATAL:
            raise
        except TRANSIENT as exc:
            await self._redis.aclose()
            self._redis = None
            raise Unreachable(unreachable_message(self.url, exc)) from None
        log.info("redis_transport_started", url=self.url, stream=self.stream, group=self.group)

    def public_spec(self) -> dict[str, Any]:
        """The URL without password and sizes; the TLS policy is not here: actors take it from
        their environment."""
        spec: dict[str, Any] = {"kind": "redis", "url": self.url, "run_id": self.run_id,
                                "stream_maxlen": self.stream_maxlen,
                                "stream_ttl_s": self.stream_ttl_s}
        if self._cfg["weights_wait_s"] is not None:
            spec["weights_wait_s"] = float(self._cfg["weights_wait_s"])
        return spec

    def actor_environment(self) -> dict[str, str]:
        """What actor processes need in their environment (the way a Lambda gets secrets): the
        URL, the password and the TLS policy."""
        env = {URL_ENV: self.url}
        if self._password:
            env[PASSWORD_ENV] = self._password
        if self.url.startswith("rediss://"):
            for key, value in tls_settings(self._cfg).items():
                env[TLS_ENV[key]] = str(value).lower() if isinstance(value, bool) else value
        return env

    def counters(self) -> dict[str, Any]:
        return dict(self._counts)

    async def close(self) -> None:
        """Delete what the run stored: its weights, and the stream unless a batch was taken
        and not acknowledged (a learner that stopped mid-round leaves those for a resume, and
        the stream's expiry removes them otherwise)."""
        if self._redis is None:
            return
        redis_, self._redis = self._redis, None
        try:
            await asyncio.wait_for(self._cleanup(redis_), timeout=5.0)
        except (TimeoutError, *TRANSIENT, ResponseError) as exc:
            log.warning("redis_cleanup_skipped", error=type(exc).__name__)
        finally:
            await redis_.aclose()

    async def _cleanup(self, r: aioredis.Redis) -> None:
        keys = [key async for key in r.scan_iter(match=f"nitro:{self.run_id}:weights:*",
                                                 count=1000)]
        keys.append(latest_key(self.run_id))
        pending = 0
        if await r.exists(self.stream):
            try:
                pending = int((await r.xpending(self.stream, self.group))["pending"])
            except ResponseError:  # no group: nothing was taken
                pending = 0
            if pending == 0:
                keys.append(self.stream)
        await r.delete(*keys)
        log.info("redis_run_cleaned", keys=len(keys), pending_left=pending)

    # -- weights -----------------------------------------------------------------------------

    async def publish_weights(self, version: int, payload: bytes) -> None:
        """Store ``version`` and delete the versions that fell out of ``keep_versions`` at once
        (an invocation fetches its weights when it starts, so only the newest are in use)."""
        self._current = (version, payload)
        self._versions[version] = None
        self._versions.move_to_end(version)
        retired = []
        while len(self._versions) > self.keep_versions:
            retired.append(self._versions.popitem(last=False)[0])

        async def publish(r: aioredis.Redis) -> None:
            async with r.pipeline(transaction=False) as pipe:
                pipe.set(weights_key(self.run_id, version), payload, ex=self._ttl())
                pipe.set(latest_key(self.run_id), str(version), ex=self._ttl())
                if retired:
                    pipe.delete(*(weights_key(self.run_id, old) for old in retired))
                await pipe.execute()

        await self._call("publish_weights", publish)
        self._counts["weights_deleted"] += len(retired)

    async def weights_payload(self, version: int) -> bytes | None:
        async def get(r: aioredis.Redis) -> bytes | None:
            return await r.get(weights_key(self.run_id, version))

        found = await self._call("weights_payload", get)
        if found is None and self._current is not None and self._current[0] == version:
            return self._current[1]
        return found

    def _ttl(self) -> int | None:
        return max(1, int(self.weights_ttl_s)) if self.weights_ttl_s else None

    async def _touch(self, r: aioredis.Redis) -> None:
        """Push the stream's expiry forward while the run lives (a few times per TTL)."""
        now = time.monotonic()
        if now - self._touched < self.stream_ttl_s / 4:
            return
        self._touched = now
        await r.expire(self.stream, max(1, int(self.stream_ttl_s)))

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
        await self._touch(r)
        if self._pending_from is not None:
            reply = await r.xreadgroup(self.group, self.consumer, {self.stream: self._pending_from},
                                       count=self.read_count)
            entries = _entries(reply)
            if not entries:
                self._pending_from = None
                return
            self._pending_from = entries[-1][0]
            gone = self._take(entries, pending=True)
            if gone:
                # Trimmed or deleted bodies can never be re-read: without XACK they would sit
                # in the pending list for good.
                await r.xack(self.stream, self.group, *gone)
                self._counts["redis_trimmed_acked"] += len(gone)
            return
        block = max(1, min(self.block_ms, int(remaining * 1000)))
        reply = await r.xreadgroup(self.group, self.consumer, {self.stream: ">"},
                                   count=self.read_count, block=block)
        self._take(_entries(reply), pending=False)

    def _take(self, entries: list[tuple[str, dict[bytes, bytes]]], pending: bool) -> list[str]:
        """Buffer the entries; return the ids of pending entries whose body is gone."""
        gone = []
        for message_id, fields in entries:
            payload = fields.get(FIELD)
            if payload is None:
                # A pending entry whose body is gone (deleted or trimmed): nothing to re-read.
                # An entry with no payload field at all is delivered empty, to be rejected.
                if pending and not fields:
                    gone.append(message_id)
                    continue
                payload = b""
            if pending:
                self._counts["redis_pending_reread"] += 1
            self._buffer.append((message_id, payload))
        return gone

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
                    await r.set(latest_key(self.run_id), str(version), ex=self._ttl())
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
        """Create the group at id 0 (MKSTREAM): entries added before it existed are read too.
        The stream gets its expiry here, whoever created it."""
        try:
            await r.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        await r.expire(self.stream, max(1, int(self.stream_ttl_s)))
        self._touched = time.monotonic()


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
    learner republishes them right after a Redis restart, then raise ``WeightsMissing``; a
    version older than the newest published one was retired and fails at once.
    """

    def __init__(self, url: str, password: str | None = None, *, stream_maxlen: int = 10_000,
                 weights_wait_s: float = 5.0, attempts: int = 6,
                 ssl: dict[str, Any] | None = None,
                 stream_ttl_s: float = DEFAULT_STREAM_TTL_S):
        self.url, url_password = split_url(url)
        self.stream_maxlen = stream_maxlen
        self.weights_wait_s = weights_wait_s
        self.stream_ttl_s = max(1, int(stream_ttl_s))
        self.attempts = attempts
        tls = tls_settings(ssl or {}) if self.url.startswith("rediss://") else {}
        self.redis = redis.Redis.from_url(
            self.url, password=password or url_password, retry=redis.retry.Retry(NoBackoff(), 0),
            protocol=2,
            socket_timeout=30.0, socket_connect_timeout=5.0,
            **tls,
        )

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> ActorRedisClient:
        """A client for the event's transport spec, on the environment's terms: the URL is the
        function's ``REDIS_URL`` (the event's must name the same server) and the TLS policy
        comes from the environment alone (see ``function_url``). Raises ``TransportRefused``."""
        url = function_url(spec.get("url"))
        _, url_password = split_url(url)
        return cls(url, resolve_password(url_password),
                   stream_maxlen=int(_bounded(spec, "stream_maxlen", 10_000)),
                   weights_wait_s=_bounded(spec, "weights_wait_s", 5.0),
                   stream_ttl_s=_bounded(spec, "stream_ttl_s", DEFAULT_STREAM_TTL_S),
                   ssl=tls_from_environment())

    def fetch_weights(self, run_id: str, version: int) -> bytes:
        key = weights_key(run_id, version)
        deadline = time.monotonic() + self.weights_wait_s
        delay = 0.05
        while True:
            payload, latest = self._retry(lambda: self.redis.mget(key, latest_key(run_id)))
            if payload is not None:
                return payload
            newest = _int_or_none(latest)
            if newest is not None and newest > version:
                raise WeightsMissing(f"weights version {version} of run {run_id} were retired "
                                     f"(newest is {newest})")
            if time.monotonic() >= deadline:
                raise WeightsMissing(
                    f"weights version {version} of run {run_id} are not in Redis "
                    f"(expired or never published; waited {self.weights_wait_s:.1f} s)"
                )
            time.sleep(delay)
            delay = min(0.5, delay * 2)

    def push_batch(self, run_id: str, payload: bytes) -> None:
        """XADD, and give the stream an expiry if it has none (a straggler pushing after the
        learner deleted it must not leave a key that never expires)."""
        stream = batches_key(run_id)

        def push() -> None:
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(stream, {FIELD: payload}, maxlen=self.stream_maxlen, approximate=True)
                pipe.expire(stream, self.stream_ttl_s, nx=True)
                pipe.execute()

        self._retry(push)

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


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
