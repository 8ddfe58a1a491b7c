"""A local endpoint that speaks AWS Lambda's Invoke HTTP API, backed by warm worker processes.

``POST /2015-03-31/functions/{name}/invocations`` behaves as Lambda's does, so the ``lambda``
actor backend's aiobotocore path (signing, typed errors, retries, timeouts) is exercised end to
end on one machine:

- ``RequestResponse``: 200 and the handler's JSON result; a handler exception is still a 200,
  with ``X-Amz-Function-Error: Unhandled`` and ``{"errorMessage", "errorType", "stackTrace"}``.
- ``Event``: 202 at once; the handler runs in the background, queued for a free slot the way
  Lambda's internal queue holds async invocations (they are never throttled back to the caller).
- ``DryRun``: 204.
- More concurrent synchronous invocations than ``--concurrency`` get HTTP 429
  ``TooManyRequestsException`` (``Reason`` ``ReservedFunctionConcurrentInvocationLimitExceeded``,
  ``Retry-After``) before their body is read; an unknown function or qualifier gets 404
  ``ResourceNotFoundException``.
- The Event queue is bounded (``--max-queued-events`` invocations and ``--max-queued-mb`` of
  bodies): past either, an Event call gets the same 429, so a flood costs the caller retries,
  not this server's memory.
- A body that is not JSON, nests too deep for the parser, or holds values the worker pipe cannot
  carry (an integer beyond 64 bits) gets 400 ``InvalidRequestContentException`` and never takes
  a worker.
- A handler that outlives ``--timeout-s`` has its worker killed, and the caller gets 200 with
  ``errorType`` ``Sandbox.Timedout``, as Lambda reports a timed-out function.

The handler runs in ``plugins.actors.workers.WorkerPool`` processes (one per unit of
concurrency) that stay warm between invocations and inherit this server's environment, so
``REDIS_URL`` and ``NITRO_REDIS_PASSWORD`` reach the handler the way a function's environment
variables would; ``--plan`` (or ``--env-modules``) sets ``NITRO_ENV_MODULES``, the modules an
event's env may import. Request signatures are not checked: this endpoint is for loopback
testing, not a security boundary, so it listens on a loopback address unless
``--allow-remote`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import errno
import ipaddress
import json
import math
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiohttp import web

from plugins.actors.workers import HandlerError, WorkerFailed, WorkerPool, pack_event
from plugins.function.actor_contract import ENV_MODULES_VAR, REFUSED_ERROR, refusal_reason

log = structlog.get_logger("plugins.function.endpoint")

DEFAULT_HANDLER = "plugins.function.handler:handler"
DEFAULT_FUNCTION = "nitro-actor"
INVOKE_PATH = "/2015-03-31/functions/{name}/invocations"
#: Lambda's payload limits: 6 MB for synchronous invocations, 1 MB for asynchronous ones.
SYNC_PAYLOAD_LIMIT = 6 * 1024 * 1024
EVENT_PAYLOAD_LIMIT = 1024 * 1024
#: ``X-Amz-Log-Result`` carries the last 4 KB of the invocation's log.
LOG_TAIL_BYTES = 4096


@dataclass
class EndpointConfig:
    host: str = "127.0.0.1"
    port: int = 9001
    function: str = DEFAULT_FUNCTION
    handler: str = DEFAULT_HANDLER
    concurrency: int = 4
    timeout_s: float = 300.0
    memory_mb: int = 1769
    #: What a throttled caller is told to wait (Lambda sends whole seconds; tests want less).
    retry_after_s: float = 1.0
    preload: Sequence[str] | None = None
    initializer: str | None = None
    region: str = "us-east-1"
    account: str = "000000000000"
    #: Event invocations queued or running at once, and the bytes of their bodies.
    max_queued_events: int = 256
    max_queued_bytes: int = 64 * 1024 * 1024
    #: Modules an event's env may import in the workers (``NITRO_ENV_MODULES``); None leaves
    #: the server's own environment as it is.
    env_modules: Sequence[str] | None = None


@dataclass
class EndpointStats:
    """What the endpoint has seen, served at ``GET /_nitro/stats`` (not part of Lambda's API)."""

    requests: int = 0
    invocations: int = 0
    event_invocations: int = 0
    dry_runs: int = 0
    throttled: int = 0
    event_queue_full: int = 0
    bad_requests: int = 0
    not_found: int = 0
    function_errors: int = 0
    timeouts: int = 0
    cold_starts: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    queued_events: int = 0
    #: Events the actor function refused, by reason (see ``plugins.function.handler.EventRefused``).
    refused: dict[str, int] = field(default_factory=dict)
    request_ids: list[str] = field(default_factory=list)


def default_preload(handler: str) -> tuple[str, ...]:
    """The actor function's heavy modules, preloaded once in the forkserver like the local
    backend does; a custom handler preloads nothing unless asked."""
    if handler == DEFAULT_HANDLER:
        from plugins.actors.local import PRELOAD

        return PRELOAD
    return ()


class LambdaEndpoint:
    """The server's lifecycle shell: ``start`` returns once the pool is warm and the port is
    bound (started means ready), ``close`` drains in-flight invocations, then the pool."""

    def __init__(self, config: EndpointConfig):
        self.config = config
        self.stats = EndpointStats()
        self.pool: WorkerPool | None = None
        self._slots = asyncio.Semaphore(config.concurrency)
        self._background: set[asyncio.Task[None]] = set()
        self._queued_bytes = 0
        self._runner: web.AppRunner | None = None
        self._closing = False

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        preload = cfg.preload if cfg.preload is not None else default_preload(cfg.handler)
        initializer = cfg.initializer
        if initializer is None and cfg.handler == DEFAULT_HANDLER:
            initializer = "plugins.function.handler:init_worker"
        env = dict(os.environ)
        if cfg.env_modules is not None:
            env[ENV_MODULES_VAR] = ",".join(cfg.env_modules)
        self.pool = WorkerPool(cfg.concurrency, preload=preload, initializer=initializer or None,
                               name=f"lambda-{cfg.function}", env=env)
        await self.pool.start()
        app = web.Application(client_max_size=SYNC_PAYLOAD_LIMIT + 1024)
        app.router.add_post(INVOKE_PATH, self._invoke)
        app.router.add_get("/_nitro/stats", self._stats)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, cfg.host, cfg.port)
        await site.start()
        log.info("lambda_endpoint_ready", url=f"http://{cfg.host}:{cfg.port}",
                 function=cfg.function, handler=cfg.handler, concurrency=cfg.concurrency,
                 timeout_s=cfg.timeout_s)

    async def close(self, drain_s: float = 10.0) -> None:
        """Stop accepting, let running invocations finish (up to ``drain_s``), stop workers."""
        self._closing = True
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._background:
            _, pending = await asyncio.wait(self._background, timeout=drain_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self.pool is not None:
            await self.pool.close()
            self.pool = None
        log.info("lambda_endpoint_closed", invocations=self.stats.invocations,
                 throttled=self.stats.throttled, cold_starts=self.stats.cold_starts)

    # -- the Invoke API ----------------------------------------------------------------------

    async def _invoke(self, request: web.Request) -> web.Response:
        self.stats.requests += 1
        name = request.match_info["name"]
        qualifier = request.query.get("Qualifier")
        if ":" in name and not name.startswith("arn:"):  # "name:qualifier"
            name, _, qualifier = name.partition(":")
        if name.startswith("arn:"):  # arn:aws:lambda:region:account:function:name[:qualifier]
            parts = name.split(":")
            name = parts[6] if len(parts) > 6 else ""
            qualifier = parts[7] if len(parts) > 7 else qualifier
        if name != self.config.function or qualifier not in (None, "", "$LATEST"):
            self.stats.not_found += 1
            return _service_error(404, "ResourceNotFoundException", {
                "Type": "User",
                "Message": f"Function not found: {self._arn(name)}"
                           + (f":{qualifier}" if qualifier else ""),
            })
        kind = request.headers.get("X-Amz-Invocation-Type", "RequestResponse")
        if kind not in ("RequestResponse", "Event", "DryRun"):
            return _service_error(400, "InvalidParameterValueException", {
                "Type": "User", "message": f"Unsupported invocation type {kind!r}"})
        if self._closing:
            return _service_error(503, "ServiceException", {
                "Type": "Service", "Message": "endpoint is shutting down"})
        if kind == "Event":
            return await self._invoke_event(request)
        if kind == "DryRun":
            parsed = await self._read_event(request, SYNC_PAYLOAD_LIMIT)
            if isinstance(parsed, web.Response):
                return parsed
            self.stats.dry_runs += 1
            return web.Response(status=204, headers=_version_header())
        # Throttle before reading the body: a caller over the limit must not make this server
        # buffer 6 MB first. locked() false means acquire() takes the slot without yielding.
        if self._slots.locked():
            return self._throttled()
        await self._slots.acquire()
        try:
            parsed = await self._read_event(request, SYNC_PAYLOAD_LIMIT)
            if isinstance(parsed, web.Response):
                return parsed
            request_id = str(uuid.uuid4())
            status, payload, error, tail = await self._execute(parsed[0], request_id)
        finally:
            self._slots.release()
        headers = {"x-amzn-RequestId": request_id, **_version_header(),
                   "Content-Type": "application/json"}
        if error:
            headers["X-Amz-Function-Error"] = "Unhandled"
        if request.headers.get("X-Amz-Log-Type") == "Tail":
            headers["X-Amz-Log-Result"] = base64.b64encode(
                tail.encode()[-LOG_TAIL_BYTES:]).decode()
        return web.Response(status=status, body=payload, headers=headers)

    async def _invoke_event(self, request: web.Request) -> web.Response:
        """Accept an Event into the bounded queue (202), or throttle when it is full."""
        cfg = self.config
        declared = request.content_length or 0
        if (self.stats.queued_events >= cfg.max_queued_events
                or self._queued_bytes + declared > cfg.max_queued_bytes):
            self.stats.event_queue_full += 1
            return self._throttled()
        parsed = await self._read_event(request, EVENT_PAYLOAD_LIMIT)
        if isinstance(parsed, web.Response):
            return parsed
        event, size = parsed
        if (self.stats.queued_events >= cfg.max_queued_events
                or self._queued_bytes + size > cfg.max_queued_bytes):  # filled while reading
            self.stats.event_queue_full += 1
            return self._throttled()
        request_id = str(uuid.uuid4())
        self.stats.event_invocations += 1
        self.stats.queued_events += 1
        self._queued_bytes += size
        task = asyncio.create_task(self._run_event(event, request_id, size), name=request_id)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return web.Response(status=202, headers={"x-amzn-RequestId": request_id})

    async def _read_event(self, request: web.Request, limit: int) -> tuple[Any, int] | web.Response:
        """``(event, body size)``, or the error response Lambda would send for the body."""
        declared = request.content_length or 0
        body = b"" if declared > limit else await request.read()
        if declared > limit or len(body) > limit:
            kind = request.headers.get("X-Amz-Invocation-Type", "RequestResponse")
            return _service_error(413, "RequestTooLargeException", {
                "Type": "User",
                "message": f"Request must be smaller than {limit} bytes for the {kind} invocation"
                           " type"})
        try:
            event = json.loads(body) if body else {}
            pack_event(event)
        except WorkerFailed as exc:
            return self._bad_request(exc.detail)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return self._bad_request("Could not parse request body into json")
        return event, len(body)

    def _bad_request(self, message: str) -> web.Response:
        self.stats.bad_requests += 1
        return _service_error(400, "InvalidRequestContentException", {
            "Type": "User", "message": message})

    def _throttled(self) -> web.Response:
        self.stats.throttled += 1
        return _service_error(429, "TooManyRequestsException", {
            "Reason": "ReservedFunctionConcurrentInvocationLimitExceeded",
            "Type": "User",
            "message": "Rate Exceeded.",
            "retryAfterSeconds": _seconds(self.config.retry_after_s),
        }, headers={"Retry-After": _seconds(self.config.retry_after_s)})

    async def _run_event(self, event: Any, request_id: str, size: int) -> None:
        """An asynchronous invocation waits in line for a slot, as in Lambda's event queue."""
        try:
            async with self._slots:
                _, _, error, _ = await self._execute(event, request_id)
        finally:
            self.stats.queued_events -= 1
            self._queued_bytes -= size
        if error:
            log.warning("event_invocation_failed", request_id=request_id)

    async def _execute(self, event: Any, request_id: str) -> tuple[int, bytes, bool, str]:
        """Run the handler in a warm worker: (status, body, function error?, log text)."""
        assert self.pool is not None
        cfg, stats = self.config, self.stats
        stats.invocations += 1
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
        if len(stats.request_ids) < 10_000:
            stats.request_ids.append(request_id)
        t0 = time.perf_counter()
        lines = [f"START RequestId: {request_id} Version: $LATEST"]
        init_ms: float | None = None
        try:
            result = await self.pool.call(
                cfg.handler, event, request_id=request_id, timeout_s=cfg.timeout_s,
                function=cfg.function, memory_mb=cfg.memory_mb,
            )
            try:
                payload, error = json.dumps(result.result).encode(), False
            except (TypeError, ValueError) as exc:
                payload, error = _error_body("Runtime.MarshalError",
                                             f"Unable to marshal response: {exc}", []), True
            if isinstance(result.result, dict) and result.result.get("cold_start"):
                stats.cold_starts += 1
            init_ms = result.init_ms
        except HandlerError as exc:
            payload, error = _error_body(exc.error_type, exc.message, exc.trace), True
            lines.append(f"[ERROR] {exc.error_type}: {exc.message}")
            init_ms = exc.init_ms
            if exc.error_type == REFUSED_ERROR:
                reason = refusal_reason(exc.message)
                stats.refused[reason] = stats.refused.get(reason, 0) + 1
        except WorkerFailed as exc:
            error = True
            if exc.reason == "timeout":
                stats.timeouts += 1
                message = (f"RequestId: {request_id} Error: Task timed out after "
                           f"{cfg.timeout_s:.2f} seconds")
                payload = _error_body("Sandbox.Timedout", message, [])
            else:
                message = f"RequestId: {request_id} Error: Runtime exited: {exc.detail}"
                payload = _error_body("Runtime.ExitError", message, [])
            lines.append(message)
        finally:
            stats.in_flight -= 1
        if error:
            stats.function_errors += 1
        duration_ms = round((time.perf_counter() - t0) * 1000, 2)  # as the REPORT line shows it
        report = (f"REPORT RequestId: {request_id}\tDuration: {duration_ms:.2f} ms\t"
                  f"Billed Duration: {math.ceil(duration_ms)} ms\tMemory Size: {cfg.memory_mb} MB")
        if init_ms is not None:  # a cold start, reported the way Lambda does
            report += f"\tInit Duration: {init_ms:.2f} ms"
        lines += [f"END RequestId: {request_id}", report]
        return 200, payload, error, "\n".join(lines) + "\n"

    async def _stats(self, request: web.Request) -> web.Response:
        body = {k: v for k, v in vars(self.stats).items() if k != "request_ids"}
        return web.json_response(body)

    def _arn(self, name: str) -> str:
        return f"arn:aws:lambda:{self.config.region}:{self.config.account}:function:{name}"


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _version_header() -> dict[str, str]:
    return {"X-Amz-Executed-Version": "$LATEST"}


def _error_body(error_type: str, message: str, trace: Sequence[str]) -> bytes:
    return json.dumps({"errorMessage": message, "errorType": error_type,
                       "stackTrace": [line.rstrip("\n") for line in trace]}).encode()


def _service_error(status: int, error_type: str, body: dict[str, Any],
                   headers: dict[str, str] | None = None) -> web.Response:
    """A service error as Lambda sends it: the type in ``x-amzn-ErrorType``, details in JSON."""
    return web.Response(
        status=status, body=json.dumps(body).encode(),
        headers={"x-amzn-ErrorType": error_type, "x-amzn-RequestId": str(uuid.uuid4()),
                 "Content-Type": "application/json", **(headers or {})},
    )


async def serve(config: EndpointConfig, stop: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM (or ``stop``), then drain and shut down cleanly."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    endpoint = LambdaEndpoint(config)
    try:
        await endpoint.start()
        await stop.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        with contextlib.suppress(Exception):
            await endpoint.close()


def config_from_args(args: argparse.Namespace) -> EndpointConfig:
    if args.concurrency < 1:
        raise ValueError("--concurrency must be at least 1")
    if args.max_queued_events < 1 or args.max_queued_mb <= 0:
        raise ValueError("--max-queued-events and --max-queued-mb must be positive")
    if not args.allow_remote and not is_loopback(args.host):
        raise ValueError(
            f"--host {args.host} is not a loopback address: this endpoint checks no signatures, "
            "so anyone who reaches it runs the function with its credentials; add "
            "--allow-remote to listen there anyway")
    preload = None if args.preload is None else tuple(
        m.strip() for m in args.preload.split(",") if m.strip())
    return EndpointConfig(
        host=args.host, port=args.port, function=args.function,
        handler=args.function_handler,
        concurrency=args.concurrency, timeout_s=args.timeout_s, memory_mb=args.memory_mb,
        retry_after_s=args.retry_after_s, preload=preload, initializer=args.initializer,
        max_queued_events=args.max_queued_events,
        max_queued_bytes=int(args.max_queued_mb * 1024 * 1024),
        env_modules=_env_modules(args),
    )


def is_loopback(host: str) -> bool:
    """Only literal loopback addresses (and ``localhost``): a name may resolve anywhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _env_modules(args: argparse.Namespace) -> tuple[str, ...] | None:
    """``--env-modules`` plus what ``--plan`` names (``env.id``'s module, ``env.imports``)."""
    if args.plan is None and args.env_modules is None:
        return None
    modules = [m.strip() for m in (args.env_modules or "").split(",") if m.strip()]
    if args.plan is not None:
        from kernel.plan import read_toml
        from plugins.function.actor_contract import plan_env_modules

        modules += plan_env_modules(read_toml(args.plan).get("env", {}))
    return tuple(dict.fromkeys(modules))


def check_port(host: str, port: int) -> None:
    """Fail before the slow part (starting warm workers) when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))


def run_from_args(args: argparse.Namespace) -> int:
    """Exit 2 with one line on stderr for bad arguments or a port that cannot be bound."""
    from kernel import logs
    from kernel.schema import PlanError

    logs.configure("info")
    try:
        config = config_from_args(args)
        check_port(config.host, config.port)
        asyncio.run(serve(config))
    except (ValueError, PlanError) as exc:
        sys.stderr.write(f"nitro lambda serve: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"nitro lambda serve: {_bind_error(args.host, args.port, exc)}\n")
        return 2
    return 0


def _bind_error(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is already in use (another `nitro lambda serve`?); "
                "stop it or pick another --port")
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


def main(argv: Sequence[str] | None = None) -> int:
    from plugins.function.args import add_serve_arguments

    parser = argparse.ArgumentParser(prog="python -m plugins.function.endpoint",
                                     description="Local AWS Lambda Invoke API endpoint.")
    add_serve_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
