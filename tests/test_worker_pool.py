"""The warm worker pool's placement: which worker serves a call decides what the call's warm
envs continue, so pinned calls must land on their place, in order, whatever finishes first."""

from __future__ import annotations

import asyncio
import time

import pytest

from plugins.actors.workers import WorkerFailed, WorkerPool

SLEEP = "tests.lambda_handlers:sleep"


async def _call(pool: WorkerPool, name: str, seconds: float, slot: int | None,
                done: list[str], timeout_s: float = 30.0) -> int:
    result = await pool.call(SLEEP, {"request_id": name, "seconds": seconds},
                             request_id=name, timeout_s=timeout_s, slot=slot)
    done.append(name)
    return result.worker


def _with_pool(size: int, body, **options):  # noqa: ANN001, ANN003, ANN202 - a test helper
    async def main():  # noqa: ANN202
        pool = WorkerPool(size, name="test-pool", **options)
        await pool.start()
        try:
            return await body(pool)
        finally:
            await pool.close()
    return asyncio.run(main())


def test_pinned_calls_keep_their_place_whatever_finishes_first() -> None:
    """Four calls on two workers, the first slow: the third waits for the first's worker
    (its place, 2 % 2 = 0) instead of taking the worker the quick second call freed."""
    async def body(pool: WorkerPool) -> tuple[list[int], list[str]]:
        done: list[str] = []
        tasks = [asyncio.create_task(_call(pool, f"a{i}", 0.4 if i == 0 else 0.0, i, done))
                 for i in range(4)]
        return list(await asyncio.gather(*tasks)), done

    workers, done = _with_pool(2, body)
    assert workers[0] == workers[2] and workers[1] == workers[3]
    assert workers[0] != workers[1]
    assert done.index("a2") > done.index("a0")  # in the order the calls came, on place 0


def test_an_unpinned_call_is_not_held_behind_one_waiting_for_a_busy_place() -> None:
    async def body(pool: WorkerPool) -> tuple[list[int], list[str]]:
        done: list[str] = []
        slow = asyncio.create_task(_call(pool, "slow", 0.5, 0, done))
        await asyncio.sleep(0.05)
        pinned = asyncio.create_task(_call(pool, "pinned", 0.0, 0, done))
        free = asyncio.create_task(_call(pool, "free", 0.0, None, done))
        return list(await asyncio.gather(slow, pinned, free)), done

    (slow, pinned, free), done = _with_pool(2, body)
    assert pinned == slow and free != slow
    assert done.index("free") < done.index("slow") < done.index("pinned")


def test_a_place_whose_worker_is_killed_gets_a_fresh_worker_and_keeps_serving() -> None:
    async def body(pool: WorkerPool) -> tuple[str, int, int]:
        done: list[str] = []
        first = await _call(pool, "warm", 0.0, 1, done)
        with pytest.raises(WorkerFailed) as failed:
            await _call(pool, "hung", 5.0, 1, done, timeout_s=0.5)
        after = await _call(pool, "after", 0.0, 1, done)
        return failed.value.reason, first, after

    reason, first, after = _with_pool(2, body)
    assert reason == "timeout"
    assert after != first  # a new worker in the same place


def _with_slow_init(init_s: float, body):  # noqa: ANN001, ANN202 - a test helper
    return _with_pool(1, body, initializer="tests.lambda_handlers:slow_init",
                      env={"NITRO_TEST_INIT_S": str(init_s)})


def test_a_worker_s_init_does_not_count_against_its_first_call_s_timeout() -> None:
    """Lambda limits the init phase on its own, apart from the function's timeout: a worker
    whose start-up takes 2 s serves a first call allowed 1 s, and so does the worker that
    replaces one killed for a timeout (the place is free again once its init is done)."""
    async def body(pool: WorkerPool) -> tuple[float | None, str, float | None]:
        done: list[str] = []
        first = await pool.call(SLEEP, {"seconds": 0.0}, request_id="first", timeout_s=1.0)
        with pytest.raises(WorkerFailed) as failed:
            await _call(pool, "hung", 5.0, None, done, timeout_s=0.5)
        after = await pool.call(SLEEP, {"seconds": 0.0}, request_id="after", timeout_s=1.0)
        return first.init_ms, failed.value.reason, after.init_ms

    first_init, reason, after_init = _with_slow_init(2.0, body)
    assert first_init is not None and first_init >= 2000
    assert reason == "timeout"
    assert after_init is not None and after_init >= 2000


def test_an_init_past_its_limit_goes_on_under_the_first_call_s_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``INIT_LIMIT_S`` the pool stops waiting and the rest of the init runs inside the
    first call, as Lambda retries an init that ran over inside the invocation: a call too
    short for it times out, and the worker that replaces it serves a longer one."""
    from plugins.actors import workers

    monkeypatch.setattr(workers, "INIT_LIMIT_S", 0.1)

    async def body(pool: WorkerPool) -> tuple[str, float | None]:
        with pytest.raises(WorkerFailed) as failed:
            await pool.call(SLEEP, {"seconds": 0.0}, request_id="short", timeout_s=0.3)
        served = await pool.call(SLEEP, {"seconds": 0.0}, request_id="long", timeout_s=10.0)
        return failed.value.reason, served.init_ms

    reason, init_ms = _with_slow_init(1.0, body)
    assert reason == "timeout"
    assert init_ms is not None and init_ms >= 1000


def test_calls_waiting_for_a_place_or_a_reply_fail_promptly_when_the_pool_closes() -> None:
    """Closing the pool fails the call waiting for a place and the call in flight at once:
    the pipe the reply would come on is closed, so waiting out the call's 30 s timeout would
    only hold up whoever closes the pool. The call in flight is billed the time it held its
    worker."""
    async def main() -> tuple[str, str, float, float]:
        pool = WorkerPool(1, name="test-pool")
        await pool.start()
        done: list[str] = []
        busy = asyncio.create_task(_call(pool, "busy", 5.0, 0, done))
        await asyncio.sleep(0.3)
        waiting = asyncio.create_task(_call(pool, "waiting", 0.0, 0, done))
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await pool.close()
        with pytest.raises(WorkerFailed) as in_flight:
            await busy
        with pytest.raises(WorkerFailed) as queued:
            await waiting
        return (in_flight.value.reason, queued.value.reason, time.monotonic() - t0,
                in_flight.value.duration_ms)

    busy_reason, waiting_reason, seconds, held_ms = asyncio.run(main())
    assert (busy_reason, waiting_reason) == ("closed", "closed")
    assert seconds < 4.0  # neither waited out the 5 s handler, nor its 30 s timeout
    assert held_ms >= 300


def test_a_worker_whose_reply_cannot_be_read_is_replaced_not_reused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply that does not decode leaves the pipe out of step (a worker of another version
    sent a frame this pool does not expect): reusing the worker would hand each later call the
    reply meant for the one before. The call fails as a dead worker, and its place gets a new
    one that answers the next call with that call's own result."""
    from plugins.actors import workers

    real = workers.msgpack.unpackb
    garbled = iter([True])

    def unpack_once_garbled(data: bytes, **kwargs: object) -> object:
        if next(garbled, False):
            raise ValueError("garbled frame")
        return real(data, **kwargs)

    async def body(pool: WorkerPool) -> tuple[str, int, int, str]:
        done: list[str] = []
        first = await _call(pool, "warm", 0.0, 0, done)
        monkeypatch.setattr(workers.msgpack, "unpackb", unpack_once_garbled)
        with pytest.raises(WorkerFailed) as failed:
            await _call(pool, "garbled", 0.0, 0, done)
        result = await pool.call(SLEEP, {"request_id": "next", "seconds": 0.0},
                                 request_id="next", timeout_s=30.0, slot=0)
        return failed.value.reason, first, result.worker, result.result["request_id"]

    reason, first, after, answered = _with_pool(1, body)
    assert reason == "worker_died"
    assert after != first
    assert answered == "next"
