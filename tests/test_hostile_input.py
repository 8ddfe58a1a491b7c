"""Hostile and malformed input: whoever can write to Redis or invoke the function sends junk.

A real run (redis-server, actor processes, CartPole) receives, on its own batch stream, every
kind of bad payload a Redis writer can craft: wrong dtypes, shapes that do not match the bytes,
sizes over the cap, truncated msgpack, pickles, unknown schema versions, well-formed batches
whose arrays do not fit the run, NaNs. Each must be refused with a counted reason
(``rejected_reasons`` in summary.json) while the run finishes its rounds on the honest batches.

The Lambda side: the local endpoint refuses oversized and non-JSON requests the way Lambda
does (413, 400), and the actor function refuses malformed events before doing any work.
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import redis

from kernel import codec
from kernel import events as ev
from kernel.engine import Engine
from plugins.function import handler as actor_function
from plugins.transports.redis_stream import batches_key
from tests.conftest import ROOT, RedisServer, run_watching
from tests.lambda_handlers import Endpoint

CARTPOLE = ROOT / "plans" / "cartpole.toml"
ROUNDS, ACTORS, STEPS, ENVS = 4, 2, 32, 4


def _plan(url: str, **extra: Any) -> dict[str, Any]:
    return {"actors.steps": STEPS, "actors.count": ACTORS, "probes": [], "sinks": [],
            "transport.kind": "redis", "transport.url": url, "stop.max_rounds": ROUNDS,
            "checkpoint.enabled": False, **extra}


def _array(dtype: str, shape: list[int], data: bytes) -> msgpack.ExtType:
    """A codec array extension with an arbitrary (possibly lying) header."""
    return msgpack.ExtType(1, msgpack.packb([dtype, shape]) + data)


def _envelope(body: Any, schema: Any = codec.SCHEMA_VERSION, kind: str = "batch") -> bytes:
    return msgpack.packb({"schema": schema, "kind": kind, "body": body}, use_bin_type=True)


def _junk() -> list[tuple[str, bytes]]:
    """(expected reason, payload) for payloads that fail before any learner check."""
    honest = codec.encode("batch", {"request_id": "x", "version": 1, "env_steps": 1,
                                    "run_id": "r", "episode_returns": np.zeros(3, np.float32)})
    four_tib = _array("float32", [1 << 40], b"\0" * 16)  # claims 4 TiB, carries 16 bytes
    return [
        ("bad_dtype", _envelope({"a": _array("object", [1], b"\0" * 8)})),
        ("bad_dtype", _envelope({"a": _array("complex128", [1], b"\0" * 16)})),
        ("shape_mismatch", _envelope({"a": _array("float32", [10], b"\0" * 12)})),
        ("shape_mismatch", _envelope({"a": four_tib})),
        ("bad_shape", _envelope({"a": _array("float32", [-1], b"")})),
        ("bad_array_header", _envelope({"a": msgpack.ExtType(1, b"\xc1")})),
        ("unknown_ext_type", _envelope({"a": msgpack.ExtType(9, b"xx")})),
        # bin32 header declaring ~4 GiB that never arrive.
        ("malformed_msgpack", b"\xc6\xff\xff\xff\xf0" + b"x" * 10),
        ("malformed_msgpack", honest[: len(honest) // 2]),  # truncated
        ("malformed_msgpack", honest[:-1]),
        ("malformed_msgpack", b""),
        ("malformed_msgpack", b"\x91" * 100_000 + b"\x01"),  # nesting bomb
        ("trailing_bytes", honest + b"\x00"),
        ("pickle_rejected", pickle.dumps({"a": 1}, protocol=2)),  # test-only: must be refused
        ("pickle_rejected", pickle.dumps({"a": 1}, protocol=5)),
        ("trailing_bytes", pickle.dumps({"a": 1}, protocol=0)),  # text pickle: not msgpack
        ("unknown_schema", _envelope({}, schema=99)),
        ("unknown_schema", _envelope({}, schema="1")),
        ("bad_envelope", msgpack.packb([1, 2, 3])),
        ("wrong_kind", codec.encode("weights", {"version": 1})),
        # The intake checks every envelope field and names the one at fault in the detail.
        ("invalid_batch", codec.encode("batch", {"version": 1})),  # no request_id
        ("invalid_batch", codec.encode("batch", {"request_id": "x", "run_id": "r",
                                                 "version": True})),  # a bool for an int
    ]


def _forged(payload: bytes) -> list[tuple[str, bytes]]:
    """Well-formed batches built from an honest one, with arrays that do not fit the run."""
    body = codec.decode(payload, kind="batch")
    forged = []

    def variant(name: str, **changes: np.ndarray) -> None:
        data = {k: np.array(v) for k, v in body["data"].items()}  # writable copies
        data.update(changes)
        forged.append((name, codec.encode("batch", {**body, "data": data,
                                                    "request_id": f"forged-{name}"})))

    d = {k: np.array(v) for k, v in body["data"].items()}
    variant("obs_shape", obs=d["obs"][:, :, :2])
    variant("short_rollout", rewards=d["rewards"][: STEPS // 2])
    variant("env_count", values=d["values"][:, :1])
    nan_rewards = d["rewards"].copy()
    nan_rewards[0, 0] = np.nan
    variant("nan_reward", rewards=nan_rewards)
    inf_obs = d["obs"].copy()
    inf_obs[1, 0, 0] = np.inf
    variant("inf_obs", obs=inf_obs)
    variant("action_range", actions=np.full_like(d["actions"], 7))
    no_obs = {k: v for k, v in d.items() if k != "obs"}
    forged.append(("no_obs", codec.encode("batch", {**body, "data": no_obs,
                                                    "request_id": "forged-no_obs"})))
    forged.append(("no_data", codec.encode("batch", {**body, "data": [1, 2],
                                                     "request_id": "forged-no_data"})))
    return forged




def _honest_payload(r: redis.Redis, stream: str) -> bytes | None:
    for _mid, fields in r.xrange(stream):
        payload = fields.get(b"p", b"")
        try:
            if codec.decode(payload, kind="batch")["request_id"].startswith("forged"):
                continue
        except (codec.CodecError, KeyError, AttributeError):
            continue
        return payload
    return None


@pytest.mark.redis
def test_hostile_payloads_are_counted_and_the_run_finishes(
        redis_server: RedisServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    engine = Engine.from_plan(CARTPOLE, _plan(redis_server.url), out_dir=out)
    r = redis.Redis.from_url(redis_server.url)
    stream = batches_key(engine.run_id)
    sent: dict[str, list[str]] = {"junk": [], "forged": []}
    pending_after: list[int] = []

    async def inject(event: ev.Event) -> None:
        if isinstance(event, ev.RoundFinished) and event.round == 3:
            # Round 2 read (and refused) every injected entry: all acknowledged by now.
            pending_after.append(r.xpending(stream, "learners")["pending"])
        if isinstance(event, ev.BatchArrived) and not sent["forged"]:
            payload = _honest_payload(r, stream)
            if payload is not None:
                for name, forged in _forged(payload):
                    r.xadd(stream, {"p": forged})
                    sent["forged"].append(name)
        if isinstance(event, ev.RoundStarted) and event.round == 2:
            for reason, payload in _junk():
                r.xadd(stream, {"p": payload})
                sent["junk"].append(reason)
            r.xadd(stream, {"not_p": b"an entry without the payload field"})
            sent["junk"].append("malformed_msgpack")
            # Over the 256 MiB cap for real (Redis takes up to 512 MB per value).
            big = b"\x83" + b"\0" * (codec.DEFAULT_MAX_BYTES + 1)
            r.xadd(stream, {"p": big})  # blocking on purpose: in the stream before round 2
            del big
            sent["junk"].append("too_large")

    summary = run_watching(engine, inject)
    assert len(sent["forged"]) == 8 and len(sent["junk"]) == len(_junk()) + 2
    assert summary["stop_reason"] == "max_rounds", summary
    assert summary["rounds"] == ROUNDS
    # Every round trained on exactly its own honest batches.
    assert summary["env_steps"] == ROUNDS * ACTORS * STEPS * ENVS
    assert summary["invocation_errors"] == 0
    expected: dict[str, int] = {}
    for reason in sent["junk"]:
        expected[reason] = expected.get(reason, 0) + 1
    expected["invalid_batch"] = expected.get("invalid_batch", 0) + len(sent["forged"])
    assert summary["rejected_reasons"] == expected
    assert summary["rejected_payloads"] == sum(expected.values())
    saved = json.loads((out / "summary.json").read_text())
    assert saved["rejected_reasons"] == expected
    # Each forged batch was refused for what was wrong with it (the detail is journaled).
    details = [json.loads(line)["detail"] for line in (out / "events.jsonl").open()
               if '"PayloadRejected"' in line]
    assert len(details) == summary["rejected_payloads"]
    for words in ("obs shape", "rewards shape", "values shape", "rewards holds NaN",
                  "obs holds NaN", "action out of range", "lacks array 'obs'", "no data table",
                  "request_id is missing", "version is missing or not a int"):
        assert any(words in d for d in details), (words, details)
    # Rejected entries are acknowledged too: nothing lingers in the PEL while the run goes
    # on, and the clean end leaves no stream behind.
    assert pending_after == [0]
    assert r.exists(stream) == 0


@pytest.mark.redis
def test_well_shaped_batches_that_would_break_the_update_are_refused(
        redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches that pass the shape checks but carry junk normalisation statistics, sent under the request ids the round expects (they are predictable from the run
    id, which a Redis writer sees in the key names) so they reach the learner first: round 2's
    honest actors are slowed down to leave the forger time."""
    monkeypatch.setenv("NITRO_FAULT", json.dumps({"mode": "slow", "rounds": [2], "seconds": 1}))
    # Sync rounds: the forger predicts round 2's request ids and beats its slowed actors. (In
    # pipelined rounds round 2's batches are in before its weights are published.)
    engine = Engine.from_plan(
        CARTPOLE, _plan(redis_server.url, **{"env.normalize_obs": True, "stop.max_rounds": 3,
                                             "actors.handler": "tests.fault_handlers:faulty",
                                             "run.mode": "sync"}),
        out_dir=tmp_path / "run")
    r = redis.Redis.from_url(redis_server.url)
    stream = batches_key(engine.run_id)
    honest: list[dict[str, Any]] = []
    sent: list[str] = []

    async def inject(event: ev.Event) -> None:
        if isinstance(event, ev.BatchArrived) and not honest:
            payload = _honest_payload(r, stream)
            if payload is not None:
                honest.append(codec.decode(payload, kind="batch"))
        if isinstance(event, ev.WeightsPublished) and event.round == 2 and honest:
            body, v = honest[0], event.version
            rid = f"{engine.run_id}-r2-v{v}"
            obs_dim = body["data"]["obs"].shape[-1]
            # NaN means would poison every later observation the actors normalise; a mean of
            # the wrong shape breaks the merge itself.
            nan_stats = {**body, "request_id": f"{rid}-a0", "version": v, "stats": {
                "obs_stats": {"mean": [float("nan")] * obs_dim, "var": [1.0] * obs_dim,
                              "count": 1e6}}}
            bad_shape = {**body, "request_id": f"{rid}-a1", "version": v, "stats": {
                "obs_stats": {"mean": [0.0] * (obs_dim + 1), "var": [1.0], "count": 5}}}
            for forged in (nan_stats, bad_shape):
                r.xadd(stream, {"p": codec.encode("batch", forged)})
                sent.append(forged["request_id"])

    summary = run_watching(engine, inject)
    assert len(sent) == 2
    assert summary["stop_reason"] == "max_rounds", summary
    assert summary["rejected_reasons"].get("invalid_batch") == 2
    # The honest batches of those request ids arrive later and are used.
    assert summary["env_steps"] == 3 * ACTORS * STEPS * ENVS


# -- the Lambda side ---------------------------------------------------------------------------

def _event(**changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"run_id": "r", "request_id": "q", "version": 0, "seed": 1,
                             "steps": 8, "env": {"id": "CartPole-v1"},
                             "algo": {"algo": "ppo", "spaces": {
                                 "obs_shape": [4], "obs_dtype": "float32",
                                 "action": {"kind": "discrete", "n": 2}}},
                             "transport": {"kind": "inline"}}
    event.update(changes)
    return {k: v for k, v in event.items() if v is not _DROP}


_DROP = object()


@pytest.mark.parametrize("field", sorted(actor_function._EVENT_FIELDS))
def test_event_missing_a_field_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=f"missing '{field}'"):
        actor_function.validate_event(_event(**{field: _DROP}))


@pytest.mark.parametrize(("changes", "words"), [
    ({"version": "3"}, "'version' has type str"),
    ({"version": True}, "'version' has type bool"),
    ({"version": 1.5}, "'version' has type float"),
    ({"steps": None}, "'steps' has type NoneType"),
    ({"seed": [1]}, "'seed' has type list"),
    ({"run_id": 7}, "'run_id' has type int"),
    ({"env": "CartPole-v1"}, "'env' has type str"),
    ({"transport": []}, "'transport' has type list"),
    ({"version": -1}, "version must be >= 0"),
    ({"steps": 0}, "out of range"),
    ({"steps": -5}, "out of range"),
    ({"steps": actor_function.MAX_STEPS + 1}, "out of range"),
    ({"steps": 1 << 70}, "out of range"),
])
def test_event_with_a_bad_field_is_refused(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError) as info:
        actor_function.validate_event(_event(**changes))
    assert words in str(info.value)


@pytest.mark.parametrize("event", [[], 3, None, "[1, 2]", b"null"])
def test_event_that_is_not_an_object_is_refused(event: Any) -> None:
    with pytest.raises(ValueError, match="must be a JSON object"):
        actor_function.validate_event(event)


def test_event_as_bad_json_text_is_refused() -> None:
    with pytest.raises(ValueError):
        actor_function.validate_event("{not json")
    assert actor_function.validate_event(json.dumps(_event()))["steps"] == 8


@pytest.fixture(scope="module")
def function_endpoint() -> Iterator[Endpoint]:
    """The real actor function (no torch preloaded: malformed events never reach torch)."""
    ep = Endpoint("--concurrency", "1", "--preload", "", "--initializer", "",
                  "--timeout-s", "30").start()
    try:
        yield ep
    finally:
        ep.stop()


def _post(ep: Endpoint, body: bytes, kind: str = "RequestResponse") -> tuple[int, dict, bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{ep.url}/2015-03-31/functions/nitro-actor/invocations", data=body, method="POST",
        headers={"X-Amz-Invocation-Type": kind, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _padded(size: int) -> bytes:
    """A valid JSON event of exactly ``size`` bytes (padding in an unknown key)."""
    base = json.dumps({**_event(transport={"kind": "none"}), "pad": ""}).encode()
    return base[:-2] + b"x" * (size - len(base)) + base[-2:]


def test_endpoint_payload_limits(function_endpoint: Endpoint) -> None:
    from plugins.function.endpoint import EVENT_PAYLOAD_LIMIT, SYNC_PAYLOAD_LIMIT

    before = function_endpoint.stats()
    status, headers, body = _post(function_endpoint, _padded(SYNC_PAYLOAD_LIMIT + 1))
    assert status == 413 and headers["x-amzn-ErrorType"] == "RequestTooLargeException"
    assert str(SYNC_PAYLOAD_LIMIT) in json.loads(body)["message"]
    status, headers, _ = _post(function_endpoint, _padded(EVENT_PAYLOAD_LIMIT + 1), "Event")
    assert status == 413 and headers["x-amzn-ErrorType"] == "RequestTooLargeException"
    # Way over the limit: refused by the HTTP layer, the server stays up.
    status, _, _ = _post(function_endpoint, b"x" * (3 * SYNC_PAYLOAD_LIMIT))
    assert status == 413
    # At the limit the call is accepted (the handler then refuses the unknown transport kind:
    # a function error, not a 4xx).
    status, headers, body = _post(function_endpoint, _padded(EVENT_PAYLOAD_LIMIT), "Event")
    assert status == 202
    for _ in range(600):  # let the background invocation finish before the next test
        after = function_endpoint.stats()
        if after["invocations"] > before["invocations"] and after["in_flight"] == 0:
            break
        time.sleep(0.05)
    assert after["requests"] == before["requests"] + 4
    assert after["invocations"] == before["invocations"] + 1
    assert after["function_errors"] == before["function_errors"] + 1


def test_endpoint_bad_json(function_endpoint: Endpoint) -> None:
    for body in (b"{not json", b"\xff\xfe\x00", b'{"a": 1', b"[1, 2"):
        status, headers, _ = _post(function_endpoint, body)
        assert status == 400, body
        assert headers["x-amzn-ErrorType"] == "InvalidRequestContentException"


@pytest.mark.parametrize(("event", "words", "reason"), [
    ({"hello": "world"}, "missing 'run_id'", "bad_event"),
    (_event(version=-3), "version must be >= 0", "bad_event"),
    (_event(steps=10**9), "out of range", "bounds"),
    (_event(seed="1"), "'seed' has type str", "bad_event"),
    ([1, 2, 3], "must be a JSON object", "bad_event"),
    (_event(transport={"kind": "pickle"}), "unknown transport kind", "transport"),
])
def test_the_function_refuses_malformed_events(function_endpoint: Endpoint, event: Any,
                                               words: str, reason: str) -> None:
    before = function_endpoint.stats()["refused"].get(reason, 0)
    status, headers, body = _post(function_endpoint, json.dumps(event).encode())
    assert status == 200  # a function error, as Lambda reports it
    assert headers["X-Amz-Function-Error"] == "Unhandled"
    error = json.loads(body)
    assert error["errorType"] == "EventRefused"  # a ValueError, named for what it is
    assert error["errorMessage"].startswith(f"{reason}: ")
    assert words in error["errorMessage"]
    assert function_endpoint.stats()["refused"][reason] == before + 1
