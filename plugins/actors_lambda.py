"""The ``lambda`` actor backend: each invocation is one aiobotocore ``invoke`` of an AWS Lambda
function (or of the local endpoint, ``python -m kernel lambda serve``, which speaks the same API).

Invocations are asyncio futures under a concurrency cap (a semaphore), so fan-out costs a
signed HTTP request each, never a process. What AWS does and how it is handled here:

- Throttling is HTTP 429 ``TooManyRequestsException`` with ``retryAfterSeconds`` (the
  ``Retry-After`` header); 5xx are service faults where the function did not run. Both are
  retried here, with full-jitter exponential backoff that waits at least ``retryAfterSeconds``,
  until ``max_retries`` or the invocation's deadline.
- botocore's own retries are off for invoke (``total_max_attempts = 1``: botocore's
  ``max_attempts`` counts *retries*, so ``max_attempts = 1`` would still send twice) and its
  ``read_timeout`` is above the function timeout: by default the SDK re-sends a synchronous
  invoke that outlives 60 s, and the function runs a second time (FACTS.md).
- A ``RequestResponse`` call whose reply was lost (read timeout, connection reset) is *not*
  re-sent: the function may have run. An ``Event`` call is safe to re-send, because Lambda may
  deliver an Event twice anyway and the coordinator drops a request id it has already used.
- ``Event`` (202) returns a receipt with ``ok=True`` and no duration: the real receipt rides in
  the batch the function pushes to the transport. ``RequestResponse`` returns the handler's JSON
  receipt, or ``X-Amz-Function-Error`` with the error type and message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
from typing import Any

import structlog
from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from kernel.roles import Invocation, InvocationFailed, PluginContext, Receipt

log = structlog.get_logger("plugins.actors_lambda")

#: Lambda's payload limits (FACTS.md): 1 MB for Event, 6 MB for RequestResponse.
EVENT_PAYLOAD_LIMIT = 1024 * 1024
SYNC_PAYLOAD_LIMIT = 6 * 1024 * 1024
#: The SDK waits this much longer than the function may run before it calls a reply lost.
READ_TIMEOUT_MARGIN_S = 30.0
INVOCATION_TYPES = {"event": "Event", "request_response": "RequestResponse"}


class LambdaBackend:
    def __init__(self, ctx: PluginContext):
        cfg = ctx.config
        self.function = str(cfg.get("function", "nitro-actor"))
        self.region = str(cfg.get("region", "us-east-1"))
        self.endpoint_url: str | None = cfg.get("endpoint_url")
        self.invocation_type = INVOCATION_TYPES[cfg.get("invocation", "request_response")]
        self.concurrency = int(cfg.get("concurrency", 64))
        self.memory_mb = int(cfg.get("memory_mb", 1769))
        self.timeout_s = float(cfg.get("timeout_s", 300.0))
        self.max_retries = int(cfg.get("max_retries", 8))
        self.backoff_s = float(cfg.get("backoff_s", 0.1))
        self.backoff_max_s = float(cfg.get("backoff_max_s", 5.0))
        deadline = cfg.get("invoke_deadline_s") or cfg.get("deadline_s") or 300.0
        self.invoke_deadline_s = float(deadline)
        self.duplicate_fraction = float(cfg.get("duplicate_fraction", 0.0))
        self._rng = random.Random(ctx.seed + 104729)
        self._sem = asyncio.Semaphore(self.concurrency)
        self._stack = contextlib.AsyncExitStack()
        self.client: Any = None
        self._counts = {
            "lambda_requests": 0,
            "lambda_throttles": 0,
            "lambda_retries": 0,
            "lambda_service_errors": 0,
            "lambda_function_errors": 0,
            "lambda_timeouts": 0,
            "lambda_lost_replies": 0,
            "lambda_duplicates_sent": 0,
        }

    async def start(self, ctx: PluginContext) -> None:
        session = get_session()
        config = Config(
            region_name=self.region,
            # Our own loop retries (with deadlines and counts); the SDK must never re-send.
            retries={"total_max_attempts": 1, "mode": "standard"},
            read_timeout=self.timeout_s + READ_TIMEOUT_MARGIN_S,
            connect_timeout=10,
            max_pool_connections=self.concurrency,
        )
        kwargs: dict[str, Any] = {"region_name": self.region, "config": config}
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
            # The local endpoint does not check signatures: run without an AWS profile too.
            if await session.get_credentials() is None:
                kwargs.update(aws_access_key_id="nitro-local", aws_secret_access_key="nitro-local")
        self.client = await self._stack.enter_async_context(session.create_client("lambda",
                                                                                  **kwargs))
        log.info("lambda_backend_started", function=self.function, region=self.region,
                 endpoint_url=self.endpoint_url, invocation=self.invocation_type,
                 concurrency=self.concurrency)

    async def close(self) -> None:
        await self._stack.aclose()
        self.client = None

    def counters(self) -> dict[str, Any]:
        """Backend-side counts, merged into ``summary.json`` (prefixed: the coordinator owns
        ``invocations``, ``throttles`` and ``retries``)."""
        return dict(self._counts)

    # -- invoking ----------------------------------------------------------------------------

    async def invoke(self, invocation: Invocation) -> Receipt:
        if self.client is None:
            raise RuntimeError("lambda backend used before start()")
        payload = json.dumps(invocation.event, separators=(",", ":")).encode()
        limit = EVENT_PAYLOAD_LIMIT if self.invocation_type == "Event" else SYNC_PAYLOAD_LIMIT
        if len(payload) > limit:
            raise InvocationFailed(invocation.request_id,
                                   f"payload_too_large: {len(payload)} > {limit} bytes")
        attempt = _Attempts()
        try:
            async with asyncio.timeout(self.invoke_deadline_s):
                async with self._sem:
                    return await self._invoke_with_retries(invocation, payload, attempt)
        except TimeoutError:
            self._counts["lambda_timeouts"] += 1
            raise InvocationFailed(invocation.request_id, "deadline", attempts=attempt.sent,
                                   throttles=attempt.throttles) from None

    async def _invoke_with_retries(self, invocation: Invocation, payload: bytes,
                                   attempt: _Attempts) -> Receipt:
        rid = invocation.request_id
        while True:
            attempt.sent += 1
            self._counts["lambda_requests"] += 1
            retry_after: float | None = None
            try:
                response = await self.client.invoke(
                    FunctionName=self.function, InvocationType=self.invocation_type,
                    Payload=payload,
                )
                body = await response["Payload"].read()
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
                if code == "TooManyRequestsException" or status == 429:
                    attempt.throttles += 1
                    self._counts["lambda_throttles"] += 1
                    retry_after = _float(exc.response.get("retryAfterSeconds"))
                    reason = f"throttled: {exc.response.get('Reason', code)}"
                elif status >= 500:
                    self._counts["lambda_service_errors"] += 1
                    reason = f"service_error: {code or status}"
                else:  # 4xx other than throttling: our request is wrong; retrying cannot help
                    self._counts["lambda_service_errors"] += 1
                    raise InvocationFailed(rid, f"{code or status}: {_message(exc)}",
                                           attempts=attempt.sent,
                                           throttles=attempt.throttles) from None
            except (EndpointConnectionError, ConnectTimeoutError) as exc:
                reason = f"connect: {type(exc).__name__}"  # never reached the service: safe
            except (ReadTimeoutError, ConnectionClosedError) as exc:
                self._counts["lambda_lost_replies"] += 1
                if self.invocation_type != "Event":
                    # The function may have run: re-sending would run it again.
                    raise InvocationFailed(rid, f"reply_lost: {type(exc).__name__}",
                                           attempts=attempt.sent,
                                           throttles=attempt.throttles) from None
                reason = f"reply_lost: {type(exc).__name__}"
            except NoCredentialsError:
                raise InvocationFailed(rid, "no AWS credentials (standard chain found none)",
                                       attempts=attempt.sent) from None
            else:
                return await self._receipt(invocation, response, body, attempt, payload)
            if attempt.sent > self.max_retries:
                raise InvocationFailed(rid, f"gave up after {attempt.sent} attempts: {reason}",
                                       attempts=attempt.sent, throttles=attempt.throttles)
            self._counts["lambda_retries"] += 1
            await asyncio.sleep(self._backoff(attempt.sent, retry_after))

    def _backoff(self, sent: int, retry_after: float | None) -> float:
        """Full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter"), but never
        sooner than the service asked: a throttled caller that comes back early is throttled
        again and only adds load."""
        cap = min(self.backoff_max_s, self.backoff_s * 2 ** (sent - 1))
        delay = self._rng.uniform(0, cap)
        if retry_after is not None:
            delay = retry_after + self._rng.uniform(0, max(cap, 0.1 * retry_after))
        return delay

    async def _receipt(self, invocation: Invocation, response: dict[str, Any], body: bytes,
                       attempt: _Attempts, payload: bytes) -> Receipt:
        rid = invocation.request_id
        status = int(response.get("StatusCode", 0))
        if self.invocation_type == "Event":
            if status != 202:
                raise InvocationFailed(rid, f"unexpected status {status} for Event",
                                       attempts=attempt.sent, throttles=attempt.throttles)
            await self._maybe_duplicate(payload)
            return Receipt(request_id=rid, ok=True, version=invocation.version,
                           attempts=attempt.sent, throttles=attempt.throttles, accepted_only=True)
        function_error = response.get("FunctionError")
        if function_error:
            self._counts["lambda_function_errors"] += 1
            error_type, message = _function_error(body)
            log.warning("function_error", request_id=rid, kind=function_error,
                        error_type=error_type, message=message[:300])
            raise InvocationFailed(rid, f"{error_type}: {message}", attempts=attempt.sent,
                                   throttles=attempt.throttles)
        try:
            r = json.loads(body)
            return Receipt(
                request_id=rid, ok=True, version=int(r.get("version", invocation.version)),
                env_steps=int(r.get("env_steps", 0)), episodes=int(r.get("episodes", 0)),
                duration_ms=float(r.get("duration_ms", 0.0)),
                billed_ms=math.ceil(float(r.get("duration_ms", 0.0))),
                cold_start=bool(r.get("cold_start", False)),
                bytes_pushed=int(r.get("bytes_pushed", 0)),
                attempts=attempt.sent, throttles=attempt.throttles,
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise InvocationFailed(rid, f"unreadable receipt: {exc}", attempts=attempt.sent,
                                   throttles=attempt.throttles) from None

    async def _maybe_duplicate(self, payload: bytes) -> None:
        """Fault injection: Lambda may deliver an Event twice; send some twice ourselves so
        runs and tests exercise the coordinator's duplicate drop."""
        if self.duplicate_fraction <= 0 or self._rng.random() >= self.duplicate_fraction:
            return
        self._counts["lambda_duplicates_sent"] += 1
        with contextlib.suppress(ClientError, EndpointConnectionError, ReadTimeoutError):
            response = await self.client.invoke(FunctionName=self.function,
                                                 InvocationType="Event", Payload=payload)
            await response["Payload"].read()


class _Attempts:
    __slots__ = ("sent", "throttles")

    def __init__(self) -> None:
        self.sent = 0
        self.throttles = 0


def _float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out >= 0 else None


def _message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", exc))[:300]


def _function_error(body: bytes) -> tuple[str, str]:
    try:
        data = json.loads(body)
        return str(data.get("errorType", "Unhandled")), str(data.get("errorMessage", ""))
    except (ValueError, AttributeError):
        return "Unhandled", body[:300].decode(errors="replace")
