"""The local Lambda endpoint, as a real subprocess, driven by aiobotocore over HTTP."""

from __future__ import annotations

import asyncio
import base64
import json
import time
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


# -- hostile requests, bounded queues, start-up refusals ------------------------------------------


def _post(ep: Endpoint, body: bytes, kind: str = "RequestResponse") -> tuple[int, dict, bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{ep.url}/2015-03-31/functions/{FUNCTION}/invocations", data=body, method="POST",
        headers={"X-Amz-Invocation-Type": kind})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_hostile_requests_get_400_and_never_take_a_worker() -> None:
    concurrency = 2
    ep = Endpoint("--handler", "tests.lambda_handlers:dispatch", "--preload", "",
                  "--concurrency", str(concurrency), "--timeout-s", "5").start()
    try:
        big_int = b'{"op": "echo", "n": 18446744073709551616}'  # 2**64: msgpack cannot carry it
        hostile = [
            (big_int, "RequestResponse"),
            (big_int, "Event"),
            (b"[" * 100_000 + b"]" * 100_000, "RequestResponse"),  # past the JSON parser's depth
            (b'{"a": ' * 50_000 + b"1" + b"}" * 50_000, "Event"),
        ]
        for body, kind in hostile * concurrency:
            status, headers, reply = _post(ep, body, kind)
            assert status == 400, (kind, reply[:200])
            assert headers["x-amzn-ErrorType"] == "InvalidRequestContentException"
        # Every worker is still there: a valid call runs at once, with no function error.
        status, headers, reply = _post(ep, json.dumps({"op": "echo"}).encode())
        assert status == 200 and "X-Amz-Function-Error" not in headers, reply
        stats = ep.stats()
        assert stats["bad_requests"] == len(hostile) * concurrency
        assert stats["invocations"] == 1 and stats["timeouts"] == 0
    finally:
        ep.stop()


def test_a_throttled_sync_call_is_refused_before_its_body_is_read() -> None:
    import socket
    import threading

    ep = Endpoint("--handler", "tests.lambda_handlers:dispatch", "--preload", "",
                  "--concurrency", "1", "--timeout-s", "10").start()
    try:
        busy = threading.Thread(
            target=_post, args=(ep, json.dumps({"op": "sleep", "seconds": 3}).encode()))
        busy.start()
        for _ in range(200):
            if ep.stats()["in_flight"] == 1:
                break
            time.sleep(0.02)
        # Headers announcing 5 MB, and no body: the server must answer without waiting for it.
        with socket.create_connection(("127.0.0.1", ep.port), timeout=2) as sock:
            sock.sendall(
                f"POST /2015-03-31/functions/{FUNCTION}/invocations HTTP/1.1\r\n"
                f"Host: 127.0.0.1\r\nContent-Length: {5 * 1024 * 1024}\r\n"
                "X-Amz-Invocation-Type: RequestResponse\r\n\r\n".encode())
            head = sock.recv(4096).decode(errors="replace")
        assert head.startswith("HTTP/1.1 429"), head[:200]
        assert "TooManyRequestsException" in head
        busy.join()
    finally:
        ep.stop()


def test_the_event_queue_is_bounded() -> None:
    ep = Endpoint("--handler", "tests.lambda_handlers:dispatch", "--preload", "",
                  "--concurrency", "1", "--timeout-s", "10", "--max-queued-events", "3").start()
    try:
        body = json.dumps({"op": "sleep", "seconds": 1.0}).encode()
        statuses = [_post(ep, body, "Event")[0] for _ in range(6)]
        assert statuses[:3] == [202, 202, 202]
        assert statuses[3:] == [429, 429, 429]
        stats = ep.stats()
        assert stats["event_queue_full"] == 3 and stats["queued_events"] <= 3
        assert stats["event_invocations"] == 3
    finally:
        ep.stop()


def _serve(*args: str) -> Any:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "kernel", "lambda", "serve", *args],
                          capture_output=True, text=True, timeout=60)


def test_a_non_loopback_host_needs_allow_remote() -> None:
    result = _serve("--host", "0.0.0.0", "--port", "9", "--preload", "")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "--allow-remote" in lines[0] and "0.0.0.0" in lines[0]


def test_a_busy_port_is_one_line_and_exit_2() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve("--port", str(port), "--preload", "")
    assert result.returncode == 2
    lines = [line for line in result.stderr.strip().splitlines() if line]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"port {port}" in lines[0] and "already in use" in lines[0]


def test_a_test_endpoint_whose_port_was_taken_moves_to_a_free_one() -> None:
    """The suite runs in parallel workers, each finding 'free' ports on its own: the port can
    be taken before the endpoint binds it. The helper must then start on another port, and
    never take the holder's listener for its own endpoint."""
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()  # accepts connections, as another worker's endpoint would
    taken = holder.getsockname()[1]
    ep = Endpoint("--handler", "tests.lambda_handlers:dispatch", "--preload", "")
    ep.port = taken
    try:
        ep.start()
        assert ep.port != taken
        assert ep.stats()["requests"] == 0
    finally:
        ep.stop()
        holder.close()
