"""The local Lambda endpoint, as a real subprocess, driven by aiobotocore over HTTP."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from aiobotocore.session import get_session
from botocore.config import Config

from tests.lambda_handlers import Endpoint

FUNCTION = "nitro-actor"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    ep = Endpoint("--handler", "tests.lambda_handlers:dispatch", "--preload", "",
                  "--concurrency", "2", "--timeout-s", "1.5", "--retry-after-s", "0.1",
                  env={"NITRO_TEST_MARK": "from-the-server-env"}).start()
    try:
        yield ep
    finally:
        ep.stop()


def with_client(endpoint: Endpoint, body: Callable[[Any], Awaitable[None]]) -> None:
    """Run ``body(client)`` on a fresh loop (no pytest-asyncio here: asyncio.run per test)."""

    async def main() -> None:
        config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, read_timeout=30)
        async with get_session().create_client(
            "lambda", region_name="us-east-1", endpoint_url=endpoint.url,
            aws_access_key_id="test", aws_secret_access_key="test", config=config,
        ) as client:
            await body(client)

    asyncio.run(main())


async def invoke(client: Any, event: dict[str, Any], **kwargs: Any) -> tuple[dict[str, Any], bytes]:
    response = await client.invoke(FunctionName=kwargs.pop("name", FUNCTION),
                                   Payload=json.dumps(event), **kwargs)
    return response, await response["Payload"].read()


def test_request_response_returns_the_handler_result(endpoint: Endpoint) -> None:
    async def check(client: Any) -> None:
        response, body = await invoke(client, {"op": "echo", "x": [1, 2]}, LogType="Tail")
        assert response["StatusCode"] == 200
        assert "FunctionError" not in response
        assert response["ExecutedVersion"] == "$LATEST"
        result = json.loads(body)
        assert result["echoed"] == {"op": "echo", "x": [1, 2]}
        assert result["env"]["NITRO_TEST_MARK"] == "from-the-server-env"  # environment reaches it
        assert 0 < result["remaining_ms"] <= 1500
        tail = base64.b64decode(response["LogResult"]).decode()
        assert tail.startswith(f"START RequestId: {result['aws_request_id']}")
        assert "REPORT RequestId" in tail and "Billed Duration" in tail

    with_client(endpoint, check)


def test_workers_stay_warm_and_report_cold_starts(endpoint: Endpoint) -> None:
    async def check(client: Any) -> None:
        results = [json.loads((await invoke(client, {"op": "echo"}))[1]) for _ in range(6)]
        pids = {r["pid"] for r in results}
        assert len(pids) <= 2  # two warm workers reused, no process per call
        assert sum(r["cold_start"] for r in results) <= 2
        assert endpoint.stats()["cold_starts"] >= 1

    with_client(endpoint, check)


def test_event_is_accepted_then_run(endpoint: Endpoint) -> None:
    async def check(client: Any) -> None:
        before = endpoint.stats()["invocations"]
        response, body = await invoke(client, {"op": "echo"}, InvocationType="Event")
        assert response["StatusCode"] == 202 and body == b""
        for _ in range(100):
            if endpoint.stats()["invocations"] > before:
                break
            await asyncio.sleep(0.05)
        assert endpoint.stats()["invocations"] == before + 1

    with_client(endpoint, check)


def test_dry_run(endpoint: Endpoint) -> None:
    async def check(client: Any) -> None:
        before = endpoint.stats()["invocations"]
        response, _ = await invoke(client, {"op": "boom"}, InvocationType="DryRun")
        assert response["StatusCode"] == 204
        assert endpoint.stats()["invocations"] == before

    with_client(endpoint, check)


def test_unknown_function_or_qualifier_is_not_found(endpoint: Endpoint) -> None:
    async def check(client: Any) -> None:
        with pytest.raises(client.exceptions.ResourceNotFoundException):
            await invoke(client, {}, name="no-such-function")
        with pytest.raises(client.exceptions.ResourceNotFoundException):
            await invoke(client, {}, Qualifier="7")
        response, _ = await invoke(
            client, {"op": "echo"}, name=f"arn:aws:lambda:us-east-1:000000000000:function:{FUNCTION}")
        assert response["StatusCode"] == 200

    with_client(endpoint, check)


def test_handler_exception_is_a_function_error(endpoint: Endpoint) -> None:
    async def check(client: Any) -> None:
        response, body = await invoke(client, {"op": "boom", "message": "kaput"})
        assert response["StatusCode"] == 200
        assert response["FunctionError"] == "Unhandled"
        error = json.loads(body)
        assert error["errorType"] == "ValueError"
        assert error["errorMessage"] == "kaput"
        assert any("raise ValueError" in line for line in error["stackTrace"])

    with_client(endpoint, check)


def test_bad_json_payload_is_rejected(endpoint: Endpoint) -> None:
    async def check(client: Any) -> None:
        with pytest.raises(client.exceptions.InvalidRequestContentException):
            await client.invoke(FunctionName=FUNCTION, Payload=b"{not json")

    with_client(endpoint, check)


def test_throttle_is_a_typed_429_and_the_sdk_does_not_resend(endpoint: Endpoint) -> None:
    async def check(client: Any) -> None:
        busy = [asyncio.create_task(invoke(client, {"op": "sleep", "seconds": 0.8}))
                for _ in range(2)]
        for _ in range(100):
            if endpoint.stats()["in_flight"] == 2:
                break
            await asyncio.sleep(0.02)
        before = endpoint.stats()
        with pytest.raises(client.exceptions.TooManyRequestsException) as info:
            await invoke(client, {"op": "echo"})
        after = endpoint.stats()
        await asyncio.gather(*busy)
        err = info.value.response
        assert err["Reason"] == "ReservedFunctionConcurrentInvocationLimitExceeded"
        assert float(err["retryAfterSeconds"]) == pytest.approx(0.1)
        assert err["ResponseMetadata"]["HTTPStatusCode"] == 429
        # total_max_attempts = 1: botocore sent it once (max_attempts = 1 would have sent twice).
        assert after["requests"] == before["requests"] + 1
        assert after["throttled"] == before["throttled"] + 1

    with_client(endpoint, check)


def test_timed_out_function_is_killed_and_reported(endpoint: Endpoint) -> None:
    async def check(client: Any) -> None:
        response, body = await invoke(client, {"op": "sleep", "seconds": 5})
        assert response["StatusCode"] == 200
        assert response["FunctionError"] == "Unhandled"
        error = json.loads(body)
        assert error["errorType"] == "Sandbox.Timedout"
        assert "Task timed out after 1.50 seconds" in error["errorMessage"]
        assert endpoint.stats()["timeouts"] >= 1
        # The killed worker was replaced: the function still serves.
        response, body = await invoke(client, {"op": "echo"})
        assert response["StatusCode"] == 200 and json.loads(body)["cold_start"] in (True, False)

    with_client(endpoint, check)


def test_sigterm_drains_and_exits_cleanly() -> None:
    import urllib.request

    ep = Endpoint("--handler", "tests.lambda_handlers:dispatch", "--preload", "",
                  "--concurrency", "1").start()
    request = urllib.request.Request(
        f"{ep.url}/2015-03-31/functions/{FUNCTION}/invocations",
        data=json.dumps({"op": "echo"}).encode(), method="POST",
        headers={"X-Amz-Invocation-Type": "RequestResponse"},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200
    assert ep.stop() == 0
    assert "lambda_endpoint_closed" in ep.log()
