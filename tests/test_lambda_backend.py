"""The ``lambda`` actor backend over real HTTP: aiobotocore -> local endpoint subprocess ->
handler; and whole PPO rounds through the real actor function and a real Redis."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernel.plan import ACTORS, load_plan
from kernel.roles import Invocation, InvocationFailed, PluginContext, Receipt, Unreachable
from kernel.schema import PlanError, validate_table
from plugins.actors.aws_lambda import LambdaBackend
from plugins.descriptors.aws_lambda import LAMBDA_CONFIG
from tests.conftest import closed_port
from tests.lambda_handlers import Endpoint


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    ep = Endpoint("--handler", "tests.lambda_handlers:dispatch", "--preload", "",
                  "--concurrency", "2", "--timeout-s", "1.5", "--retry-after-s", "0.1").start()
    try:
        yield ep
    finally:
        ep.stop()


def backend(url: str, **config: Any) -> LambdaBackend:
    cfg = validate_table("actors", {"backend": "lambda", "endpoint_url": url, "backoff_s": 0.02,
                                    "backoff_max_s": 0.3, **config},
                         {**ACTORS, **LAMBDA_CONFIG})
    ctx = PluginContext(name="lambda", config=cfg, plan={}, run_id="t", run_dir=None, seed=1,
                        bus=None)
    return LambdaBackend(ctx)


def call(b: LambdaBackend, events: list[dict[str, Any]]) -> list[Receipt | BaseException]:
    """Start the backend, invoke every event concurrently, close; receipts or exceptions."""

    async def main() -> list[Receipt | BaseException]:
        ctx = PluginContext(name="lambda", config={}, plan={}, run_id="t", run_dir=None, seed=1,
                            bus=None)
        await b.start(ctx)
        try:
            return await asyncio.gather(*(
                b.invoke(Invocation(request_id=e.get("request_id", f"req-{i}"), version=3,
                                    round=1, event={"request_id": f"req-{i}", **e}))
                for i, e in enumerate(events)), return_exceptions=True)
        finally:
            await b.close()

    return asyncio.run(main())


def test_request_response_receipt(endpoint: Endpoint) -> None:
    b = backend(endpoint.url)
    [receipt] = call(b, [{"op": "echo", "version": 3, "env_steps": 7}])
    assert isinstance(receipt, Receipt)
    assert receipt.ok and receipt.request_id == "req-0" and receipt.version == 3
    assert receipt.env_steps == 7 and receipt.attempts == 1 and receipt.throttles == 0


def test_throttled_invocations_all_complete_with_retries(endpoint: Endpoint) -> None:
    before = endpoint.stats()
    b = backend(endpoint.url, concurrency=8, max_retries=100)
    receipts = call(b, [{"op": "sleep", "seconds": 0.3} for _ in range(8)])
    after = endpoint.stats()
    assert all(isinstance(r, Receipt) and r.ok for r in receipts), receipts
    throttles = sum(r.throttles for r in receipts if isinstance(r, Receipt))
    assert throttles > 0
    counts = b.counters()
    assert counts["lambda_throttles"] == throttles == after["throttled"] - before["throttled"]
    assert counts["lambda_retries"] == throttles
    # Every request the backend counted reached the endpoint once: the SDK re-sent nothing.
    assert counts["lambda_requests"] == after["requests"] - before["requests"]
    assert after["peak_in_flight"] <= 2


def test_function_error_is_an_invocation_failure(endpoint: Endpoint) -> None:
    b = backend(endpoint.url)
    [err] = call(b, [{"op": "boom", "message": "kaput"}])
    assert isinstance(err, InvocationFailed)
    assert err.reason == "ValueError: kaput" and err.receipt.attempts == 1
    assert b.counters()["lambda_function_errors"] == 1


def test_timed_out_function_and_invocation_deadline(endpoint: Endpoint) -> None:
    b = backend(endpoint.url)
    [err] = call(b, [{"op": "sleep", "seconds": 5}])
    assert isinstance(err, InvocationFailed) and err.reason.startswith("Sandbox.Timedout")
    assert err.receipt.attempts == 1  # a timed-out synchronous invoke is never run again
    b = backend(endpoint.url, invoke_deadline_s=0.4)
    [err] = call(b, [{"op": "sleep", "seconds": 1.0}])
    assert isinstance(err, InvocationFailed) and err.reason == "deadline"
    assert b.counters()["lambda_timeouts"] == 1


def test_client_errors_are_not_retried_and_connection_errors_are(endpoint: Endpoint) -> None:
    b = backend(endpoint.url, function="no-such-function")
    [err] = call(b, [{"op": "echo"}])
    assert isinstance(err, InvocationFailed) and "ResourceNotFoundException" in err.reason
    assert err.receipt.attempts == 1
    with closed_port() as port:
        b = backend(f"http://127.0.0.1:{port}", max_retries=2)
        [err] = call(b, [{"op": "echo"}])
    assert isinstance(err, InvocationFailed) and err.receipt.attempts == 3
    assert "connect" in err.reason


def test_event_mode_returns_at_once_and_can_send_duplicates(endpoint: Endpoint) -> None:
    before = endpoint.stats()["event_invocations"]
    b = backend(endpoint.url, invocation="event", duplicate_fraction=1.0)
    [receipt] = call(b, [{"op": "echo"}])
    assert isinstance(receipt, Receipt) and receipt.ok
    assert receipt.duration_ms == 0.0 and receipt.version == 3
    assert b.counters()["lambda_duplicates_sent"] == 1
    assert endpoint.stats()["event_invocations"] == before + 2


def test_plan_with_memory_transport_is_rejected() -> None:
    with pytest.raises(PlanError) as info:
        load_plan({"env": {"id": "CartPole-v1"}, "stop": {"max_rounds": 1},
                   "actors": {"backend": "lambda"}, "transport": {"kind": "memory"}})
    assert info.value.path == "transport.kind"
    assert "redis" in str(info.value)


# -- end to end: aiobotocore -> endpoint -> plugins.function.handler -> Redis -> learner --------


def run_engine(plan: dict[str, Any], out: Path) -> dict[str, Any]:
    from kernel.engine import Engine

    engine = Engine.from_plan(plan, out_dir=out)
    return asyncio.run(engine.run())


def ppo_plan(endpoint_url: str, redis_url: str, **actors: Any) -> dict[str, Any]:
    return {
        "run": {"name": "lambda-e2e", "seed": 3},
        "stop": {"max_rounds": 3},
        "env": {"id": "CartPole-v1", "num_envs": 2, "normalize_obs": False,
                "normalize_reward": False},
        "algo": {"name": "ppo", "update_epochs": 1, "num_minibatches": 2},
        "actors": {"backend": "lambda", "count": 2, "steps": 32, "endpoint_url": endpoint_url,
                   "deadline_s": 60.0, "concurrency": 2, **actors},
        "transport": {"kind": "redis", "url": redis_url},
        "probes": [],
        "sinks": [],
    }


@pytest.fixture
def actor_endpoint(redis_server: Any) -> Iterator[Endpoint]:
    """The real actor function (plugins.function.handler) behind the endpoint; Redis from its env."""
    ep = Endpoint("--concurrency", "2", "--timeout-s", "60",
                  env={"REDIS_URL": redis_server.url}).start(timeout=120)
    try:
        yield ep
    finally:
        ep.stop()


@pytest.mark.redis
def test_ppo_rounds_through_the_endpoint(actor_endpoint: Endpoint, redis_server: Any,
                                         tmp_path: Path) -> None:
    summary = run_engine(ppo_plan(actor_endpoint.url, redis_server.url), tmp_path / "run")
    assert summary["stop_reason"] == "max_rounds"
    assert summary["rounds"] == 3
    assert summary["invocations"] == 6
    assert summary["invocation_errors"] == 0
    assert summary["env_steps"] == 3 * 2 * 32 * 2
    assert summary["cold_starts"] >= 1
    assert summary["lambda_requests"] >= 6
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["lambda_throttles"] == summary["lambda_throttles"]
    finished = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()
                if '"InvocationFinished"' in line]
    assert len(finished) == 6 and all(e["ok"] for e in finished)


@pytest.mark.redis
def test_event_mode_duplicates_are_used_once(actor_endpoint: Endpoint, redis_server: Any,
                                             tmp_path: Path) -> None:
    plan = ppo_plan(actor_endpoint.url, redis_server.url, invocation="event",
                    duplicate_fraction=1.0)
    summary = run_engine(plan, tmp_path / "run")
    assert summary["rounds"] == 3
    assert summary["invocations"] == 6
    assert summary["lambda_duplicates_sent"] == 6
    assert summary["duplicate_batches"] >= 1
    assert summary["env_steps"] == 3 * 2 * 32 * 2  # each request id's batch counted once


# -- Region, pre-flight, what failures and cold starts bill -------------------------------------


def _started_region(url: str, monkeypatch: pytest.MonkeyPatch, **config: Any) -> str:
    b = backend(url, **config)

    async def main() -> str:
        await b.start(None)  # type: ignore[arg-type]
        try:
            return str(b.client.meta.region_name)
        finally:
            await b.close()

    return asyncio.run(main())


def test_region_comes_from_the_aws_configuration(endpoint: Endpoint, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    assert _started_region(endpoint.url, monkeypatch) == "us-east-1"  # nothing configured
    config = tmp_path / "config"
    config.write_text("[profile nitro-test]\nregion = ap-south-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "nitro-test")
    assert _started_region(endpoint.url, monkeypatch) == "ap-south-1"  # the profile's
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    assert _started_region(endpoint.url, monkeypatch) == "eu-west-3"  # the environment wins
    assert _started_region(endpoint.url, monkeypatch, region="sa-east-1") == "sa-east-1"


def _preflight(b: LambdaBackend) -> float:
    async def main() -> float:
        await b.start(None)  # type: ignore[arg-type]
        t0 = time.monotonic()
        try:
            await b.preflight()
        finally:
            elapsed = time.monotonic() - t0
            await b.close()
        return elapsed

    return asyncio.run(main())


def test_preflight_names_an_unreachable_endpoint_quickly() -> None:
    with closed_port() as port, pytest.raises(Unreachable) as info:
        _preflight(backend(f"http://127.0.0.1:{port}"))
    message = str(info.value)
    assert "\n" not in message
    assert f"cannot reach the Lambda endpoint at http://127.0.0.1:{port}" in message
    assert "is `nitro lambda serve` running?" in message


def test_preflight_runs_nothing_and_names_a_missing_function(endpoint: Endpoint) -> None:
    before = endpoint.stats()
    assert _preflight(backend(endpoint.url)) < 5.0
    after = endpoint.stats()
    assert after["invocations"] == before["invocations"]  # a DryRun: the function never ran
    assert after["dry_runs"] == before["dry_runs"] + 1
    with pytest.raises(Unreachable, match="function 'no-such-function' not found"):
        _preflight(backend(endpoint.url, function="no-such-function"))


def test_failures_keep_the_duration_aws_bills(endpoint: Endpoint) -> None:
    [err] = call(backend(endpoint.url), [{"op": "sleep", "seconds": 5}])
    assert isinstance(err, InvocationFailed) and err.reason.startswith("Sandbox.Timedout")
    # Killed at the 1.5 s function timeout: billed for it, from the REPORT line.
    assert 1500 <= err.receipt.duration_ms < 5000  # type: ignore[attr-defined]
    assert err.receipt.billed_ms >= 1500  # type: ignore[attr-defined]
    [err] = call(backend(endpoint.url, invoke_deadline_s=0.4), [{"op": "sleep", "seconds": 1}])
    assert err.reason == "deadline" and err.receipt.cancelled  # type: ignore[union-attr]
    assert 350 <= err.receipt.duration_ms < 1000  # type: ignore[union-attr]


def test_cold_start_init_and_billed_duration_come_from_the_report_line() -> None:
    ep = Endpoint("--handler", "tests.lambda_handlers:dispatch", "--preload", "",
                  "--concurrency", "1", "--timeout-s", "5").start()
    try:
        first, second = (call(backend(ep.url), [{"op": "sleep", "seconds": 0.05}])[0]
                         for _ in range(2))
    finally:
        ep.stop()
    assert isinstance(first, Receipt) and isinstance(second, Receipt)
    assert first.cold_start and first.init_ms > 0  # Init Duration of the worker's set-up
    assert not second.cold_start and second.init_ms == 0
    for receipt in (first, second):
        assert receipt.duration_ms >= 50
        assert receipt.billed_ms == math.ceil(receipt.duration_ms)
