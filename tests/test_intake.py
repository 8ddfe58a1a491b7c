"""The intake's envelope and receipt checks: a forged field is a counted rejection, never an
exception out of the round, and never a negative or absurd charge."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from kernel import codec
from kernel import events as ev
from kernel.acceptance import BatchRejected, check_envelope
from kernel.intake import Intake
from kernel.roles import Receipt
from kernel.run_state import RunState


def body(**changes: Any) -> dict[str, Any]:
    b: dict[str, Any] = {
        "run_id": "run-1", "request_id": "run-1-r1-v1-a0", "version": 1, "env_steps": 512,
        "episode_returns": np.array([10.0, 12.5]), "episode_lengths": np.array([200, 250]),
        "receipt": {"episodes": 2, "duration_ms": 812.5, "billed_ms": 813, "cold_start": False,
                    "bytes_pushed": 4096},
        "data": {},
    }
    for key, value in changes.items():
        if key.startswith("receipt."):
            b["receipt"][key.split(".", 1)[1]] = value
        else:
            b[key] = value
    return b


def test_a_sound_envelope_passes_with_its_receipt() -> None:
    rid, version, receipt = check_envelope(body())
    assert (rid, version) == ("run-1-r1-v1-a0", 1)
    assert receipt.duration_ms == 812.5 and receipt.billed_ms == 813 and receipt.episodes == 2


@pytest.mark.parametrize("changes,reason", [
    ({"receipt.episodes": "x"}, "invalid_receipt"),
    ({"receipt.duration_ms": -1e12}, "invalid_receipt"),
    ({"receipt.duration_ms": float("nan")}, "invalid_receipt"),
    ({"receipt.duration_ms": 1e9}, "invalid_receipt"),
    ({"receipt.billed_ms": -5}, "invalid_receipt"),
    ({"receipt.cold_start": "yes"}, "invalid_receipt"),
    ({"receipt.episodes": 10**6}, "invalid_receipt"),
    ({"receipt": [1, 2]}, "invalid_receipt"),
    ({"env_steps": 10**15}, "invalid_batch"),
    ({"env_steps": -512}, "invalid_batch"),
    ({"env_steps": True}, "invalid_batch"),
    ({"version": "1"}, "invalid_batch"),
    ({"request_id": ""}, "invalid_batch"),
    ({"episode_returns": np.array([np.inf])}, "invalid_batch"),
    ({"episode_returns": np.zeros(600)}, "invalid_batch"),
    ({"episode_lengths": np.array([1])}, "invalid_batch"),
])
def test_a_forged_field_is_rejected_with_its_reason(changes: dict[str, Any], reason: str
                                                    ) -> None:
    with pytest.raises(BatchRejected) as err:
        check_envelope(body(**changes))
    assert err.value.reason == reason


class _Learner:
    def check_batch(self, b: dict[str, Any]) -> None:
        if b["env_steps"] != 512:
            raise ValueError("env_steps is not the rollout's 128 x 4 steps")


class _Roles:
    learner = _Learner()


@pytest.mark.parametrize("changes", [{"receipt.episodes": "x"}, {"env_steps": 1024},
                                     {"receipt.duration_ms": -1e12}])
def test_acceptance_counts_and_never_raises(changes: dict[str, Any]) -> None:
    state = RunState()
    published: list[Any] = []
    intake = Intake({"actors": {"deadline_s": 1.0}}, "run-1", _Roles(), state, published.append,
                    asyncio.Event())
    intake.pending["run-1-r1-v1-a0"] = False
    intake._versions["run-1-r1-v1-a0"] = 1
    payload = codec.encode("batch", body(**changes))
    batches: dict[str, Any] = {}
    asyncio.run(intake.accept(1, 1, ("m-1", payload), batches, ids := [], max_lag=0))
    assert batches == {} and ids == ["m-1"]
    assert state.counters.rejected_payloads == 1
    assert [type(e).__name__ for e in published] == ["PayloadRejected"]
    # The sound batch is then accepted.
    asyncio.run(intake.accept(1, 1, ("m-2", codec.encode("batch", body())), batches, ids,
                              max_lag=0))
    assert list(batches) == ["run-1-r1-v1-a0"]


@pytest.mark.parametrize("changes,counter", [({"version": 0}, "stale_batches"),
                                             ({"run_id": "other"}, "stale_batches"),
                                             ({"request_id": "run-1-r1-v1-a9"},
                                              "stale_batches")])
def test_wrong_version_run_or_request_is_dropped_as_stale(changes: dict[str, Any],
                                                          counter: str) -> None:
    state = RunState()
    intake = Intake({"actors": {"deadline_s": 1.0}}, "run-1", _Roles(), state, lambda e: None,
                    asyncio.Event())
    intake.pending["run-1-r1-v1-a0"] = False
    intake._versions["run-1-r1-v1-a0"] = 1
    batches: dict[str, Any] = {}
    asyncio.run(intake.accept(1, 1, ("m", codec.encode("batch", body(**changes))), batches, [],
                              max_lag=0))
    assert batches == {} and getattr(state.counters, counter) == 1


class _QuickActors:
    async def invoke(self, invocation: Any) -> Receipt:
        return Receipt(request_id=invocation.request_id, ok=True, version=invocation.version,
                       duration_ms=3.0, billed_ms=3)


class _NoTransport:
    def public_spec(self) -> dict[str, Any]:
        return {}


class _FleetRoles:
    actors = _QuickActors()
    transport = _NoTransport()
    env_spec: dict[str, Any] = {}


@pytest.mark.parametrize("how", ["close", "cancel"])
def test_an_invocation_that_finished_just_before_the_stop_is_billed_once(how: str) -> None:
    """An invocation's done-callback runs a loop turn after it returns: a stop (or a gather's
    give-up) that lands in between must find it finished, with its own receipt, and not bill it
    a second time as cancelled."""
    plan = {"run": {"seed": 1}, "actors": {"steps": 8, "deadline_s": 1.0},
            "checkpoint": {"every": 0, "exact_resume": False}}
    finished: list[Receipt] = []
    stops: list[asyncio.Task[list[Receipt]]] = []

    async def run() -> list[Receipt]:
        def publish(event: Any) -> None:
            if isinstance(event, ev.InvocationFinished):
                finished.append(event.receipt)
                if not stops:  # the stop starts before this task's done-callback runs
                    stops.append(asyncio.create_task(
                        intake.close() if how == "close" else intake.cancel()))

        intake = Intake(plan, "run-1", _FleetRoles(), RunState(), publish, asyncio.Event())
        intake.launch(1, 1, 1, {})
        while not stops:
            await asyncio.sleep(0)
        receipts = await stops[0]
        await asyncio.sleep(0)
        return receipts if how == "close" else receipts + intake.drain()[0]

    receipts = asyncio.run(run())
    assert [r.request_id for r in finished] == ["run-1-r1-v1-a0"]
    assert [(r.request_id, r.ok, r.cancelled) for r in receipts] == [
        ("run-1-r1-v1-a0", True, False)]
