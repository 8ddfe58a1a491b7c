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
  invoke that outlives 60 s, and the function runs a second time (measured here).
- A ``RequestResponse`` call whose reply was lost (read timeout, connection reset) is *not*
  re-sent: the function may have run. An ``Event`` call is safe to re-send, because Lambda may
  deliver an Event twice anyway and the coordinator drops a request id it has already used.
- ``Event`` (202) returns a receipt with ``ok=True`` and no duration: the real receipt rides in
  the batch the function pushes to the transport. ``RequestResponse`` returns the handler's JSON
  receipt, or ``X-Amz-Function-Error`` with the error type and message.
- ``RequestResponse`` asks for ``LogType=Tail``: the ``REPORT`` line in ``X-Amz-Log-Result`` holds
  what AWS bills (``Duration``, ``Billed Duration``, and on a cold start ``Init Duration``, which
  AWS bills for image functions). A function error or timeout is billed for its duration too,
  so a failure carries those numbers as well (``duration_ms``, ``billed_ms``, ``init_ms``
  attributes of the ``InvocationFailed``).
- The Region is the plan's ``actors.region`` when set, else the AWS configuration's
  (``AWS_REGION``, ``AWS_DEFAULT_REGION``, the profile), else us-east-1.
- ``preflight`` checks, before round 1 and within a few seconds, that the function can be
  reached, with a ``DryRun`` invoke (Lambda checks the function and the caller's permission
  and runs nothing).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import random
import time
from typing import Any
from urllib.parse import urlsplit

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

from kernel.plan import ACTORS
from kernel.roles import Invocation, InvocationFailed, PluginContext, Receipt, Unreachable
from kernel.schema import defaults
from plugins.descriptors.aws_lambda import LAMBDA_CONFIG

log = structlog.get_logger("plugins.actors.aws_lambda")

#: Lambda's payload limits (AWS quotas): 1 MB for Event, 6 MB for RequestResponse.
EVENT_PAYLOAD_LIMIT = 1024 * 1024
SYNC_PAYLOAD_LIMIT = 6 * 1024 * 1024
#: The SDK waits this much longer than the function may run before it calls a reply lost.
READ_TIMEOUT_MARGIN_S = 30.0
INVOCATION_TYPES = {"event": "Event", "request_response": "RequestResponse"}
#: The Region when neither the plan nor the AWS configuration names one.
FALLBACK_REGION = "us-east-1"
#: How long ``preflight`` may take before it calls the function unreachable.
PREFLIGHT_S = 5.0


def resolve_region(session: Any, configured: str | None) -> str:
    """The plan's Region, else ``AWS_REGION`` (which botocore does not read, but Lambda's own
    runtime and the other AWS SDKs set and honour), else botocore's configuration
    (``AWS_DEFAULT_REGION``, the profile's ``region``), else us-east-1."""
    return (configured or os.environ.get("AWS_REGION") or session.get_config_variable("region")
            or FALLBACK_REGION)


def parse_report(log_result: str | None) -> dict[str, float]:
    """The ``REPORT`` line of a base64 ``LogResult``: ``{"Duration": ms, "Billed Duration": ms,
    "Init Duration": ms, ...}``; empty when there is none."""
    if not log_result:
        return {}
    try:
        text = base64.b64decode(log_result).decode(errors="replace")
    except ValueError:
        return {}
    report = next((line for line in reversed(text.splitlines())
                   if line.startswith("REPORT RequestId:")), "")
    out: dict[str, float] = {}
    for part in report.split("\t")[1:]:
        key, _, value = part.partition(":")
        number = _float(value.strip().removesuffix("ms").removesuffix("MB").strip())
        if number is not None:
            out[key.strip()] = number
    return out


class LambdaBackend:
    def __init__(self, ctx: PluginContext):
        # A plan's section arrives validated; a hand-made one (a benchmark, a test) is completed
        # from the declared defaults (the kernel's actors keys, this backend's), not from a
        # second copy of them here.
        cfg = {**defaults(ACTORS), **defaults(LAMBDA_CONFIG), **ctx.config}
        self.function = str(cfg["function"])
        self.region: str | None = cfg["region"]
        self.endpoint_url: str | None = cfg["endpoint_url"]
        self.invocation_type = INVOCATION_TYPES[cfg["invocation"]]
        self.concurrency = int(cfg["concurrency"])
        self.memory_mb = int(cfg["memory_mb"])
        self.timeout_s = float(cfg["timeout_s"])
        self.max_retries = int(cfg["max_retries"])
        self.backoff_s = float(cfg["backoff_s"])
        self.backoff_max_s = float(cfg["backoff_max_s"])
        # The invocation's own deadline, else the round's (a core actors key, always > 0).
        self.invoke_deadline_s = float(cfg["invoke_deadline_s"] or cfg["deadline_s"])
        self.duplicate_fraction = float(cfg["duplicate_fraction"])
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
            "lambda_events_refused": 0,
        }

    async def start(self, ctx: PluginContext) -> None:
        session = get_session()
        # Never a hard-coded Region: AWS_REGION and profiles must win over our fallback.
        self.region = resolve_region(session, self.region)
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

    async def preflight(self) -> None:
        """Raise ``Unreachable`` (one line with a hint) within ``PREFLIGHT_S`` when the function
        cannot be reached. Runs nothing: a TCP connect to a custom endpoint, then a ``DryRun``
        invoke, which Lambda answers after checking the function and the caller's rights."""
        if self.client is None:
            raise RuntimeError("lambda backend preflight before start()")
        where = (f"the Lambda endpoint at {self.endpoint_url}" if self.endpoint_url
                 else f"AWS Lambda in {self.region}")
        hint = (" — is `nitro lambda serve` running?" if self.endpoint_url
                else " — check the network and the Region (actors.region, AWS_REGION)")
        try:
            async with asyncio.timeout(PREFLIGHT_S):
                if self.endpoint_url:
                    await _tcp_probe(self.endpoint_url)
                await self.client.invoke(FunctionName=self.function, InvocationType="DryRun",
                                         Payload=b"{}")
        except TimeoutError:
            raise Unreachable(f"cannot reach {where} within {PREFLIGHT_S:.0f} s{hint}") from None
        except (OSError, EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError,
                ConnectionClosedError) as exc:
            raise Unreachable(f"cannot reach {where} ({type(exc).__name__}){hint}") from None
        except NoCredentialsError:
            raise Unreachable("no AWS credentials found for the lambda backend — set "
                              "AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY") from None
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "ResourceNotFoundException":
                raise Unreachable(f"function {self.function!r} not found at {where} — deploy it "
                                  "with `nitro lambda deploy` or set actors.function") from None
            raise Unreachable(f"{where} refused a DryRun invoke of {self.function!r}: "
                              f"{code}: {_message(exc)}") from None
        log.info("lambda_preflight_ok", function=self.function, where=where)

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
            # The function may still be running on AWS, billed until it ends: the caller only
            # knows how long it waited since the last send.
            waited = (time.perf_counter() - attempt.sent_at) * 1000 if attempt.sent_at else 0.0
            raise InvocationFailed(invocation.request_id, "deadline", attempts=attempt.sent,
                         throttles=attempt.throttles, duration_ms=waited,
                         cancelled=attempt.sent_at is not None) from None

    async def _invoke_with_retries(self, invocation: Invocation, payload: bytes,
                                   attempt: _Attempts) -> Receipt:
        rid = invocation.request_id
        while True:
            attempt.sent += 1
            attempt.sent_at = time.perf_counter()
            self._counts["lambda_requests"] += 1
            retry_after: float | None = None
            tail = {"LogType": "Tail"} if self.invocation_type == "RequestResponse" else {}
            try:
                response = await self.client.invoke(
                    FunctionName=self.function, InvocationType=self.invocation_type,
                    Payload=payload, **tail,
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
        report = parse_report(response.get("LogResult"))
        function_error = response.get("FunctionError")
        if function_error:
            self._counts["lambda_function_errors"] += 1
            error_type, message = _function_error(body)
            if error_type == "EventRefused":
                self._counts["lambda_events_refused"] += 1
            log.warning("function_error", request_id=rid, kind=function_error,
                        error_type=error_type, message=message[:300])
            duration = report.get("Duration", 0.0)
            raise InvocationFailed(rid, f"{error_type}: {message}", attempts=attempt.sent,
                         throttles=attempt.throttles, duration_ms=duration,
                         billed_ms=int(report.get("Billed Duration", math.ceil(duration))),
                         init_ms=report.get("Init Duration", 0.0))
        try:
            r = json.loads(body)
            duration = report.get("Duration", float(r.get("duration_ms", 0.0)))
            return Receipt(
                request_id=rid, ok=True, version=int(r.get("version", invocation.version)),
                env_steps=int(r.get("env_steps", 0)), episodes=int(r.get("episodes", 0)),
                duration_ms=duration,
                billed_ms=int(report.get("Billed Duration", math.ceil(duration))),
                init_ms=report.get("Init Duration", 0.0),
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
    __slots__ = ("sent", "sent_at", "throttles")

    def __init__(self) -> None:
        self.sent = 0
        self.throttles = 0
        #: ``perf_counter`` of the last send, None before the first.
        self.sent_at: float | None = None


async def _tcp_probe(url: str) -> None:
    """Open and close a TCP connection to the endpoint's host and port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    _, writer = await asyncio.open_connection(parts.hostname, port)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


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
