"""Publishing never waits; full queues follow their stated policy and count what they drop."""

from __future__ import annotations

import asyncio

import pytest

from kernel import events as ev
from kernel.bus import Bus


def _round(i: int) -> ev.RoundStarted:
    return ev.RoundStarted(round=i, actors=1, version=i)


def test_drop_oldest_keeps_the_newest() -> None:
    async def main() -> list[int]:
        bus = Bus()
        sub = bus.subscribe("slow", maxsize=3, policy="drop_oldest")
        for i in range(10):
            bus.publish(_round(i))
        bus.close()
        assert sub.stats.dropped == 7 and sub.stats.peak == 3
        return [e.round async for e in sub]

    assert asyncio.run(main()) == [7, 8, 9]


def test_drop_newest_keeps_history() -> None:
    async def main() -> list[int]:
        bus = Bus()
        sub = bus.subscribe("slow", maxsize=3, policy="drop_newest")
        for i in range(10):
            bus.publish(_round(i))
        bus.close()
        return [e.round async for e in sub]

    assert asyncio.run(main()) == [0, 1, 2]


def test_a_stalled_observer_never_blocks_the_publisher() -> None:
    async def main() -> tuple[int, int]:
        bus = Bus()
        stalled = bus.subscribe("stalled", maxsize=8)
        fast = bus.subscribe("fast", maxsize=100_000)
        seen = 0

        async def reader() -> None:
            nonlocal seen
            async for _ in fast:
                seen += 1

        task = asyncio.create_task(reader())
        for i in range(50_000):  # the stalled subscriber never reads
            bus.publish(_round(i))
            if i % 1000 == 0:
                await asyncio.sleep(0)
        bus.close()
        await asyncio.wait_for(task, 5)
        return seen, stalled.stats.dropped

    seen, dropped = asyncio.run(main())
    assert seen == 50_000
    assert dropped == 50_000 - 8


def test_type_filter_and_threadsafe_publish() -> None:
    async def main() -> list[str]:
        bus = Bus()
        bus.bind(asyncio.get_running_loop())
        sub = bus.subscribe("rounds", types=(ev.RoundFinished, ev.RoundStarted))
        await asyncio.to_thread(bus.publish_threadsafe, _round(1))
        bus.publish(ev.RunStopped(reason="x", rounds=1, env_steps=0, wall_s=0.0))
        await asyncio.sleep(0.01)
        bus.close()
        return [type(e).__name__ async for e in sub]

    assert asyncio.run(main()) == ["RoundStarted"]


def test_bad_subscription_arguments() -> None:
    bus = Bus()
    with pytest.raises(ValueError, match="maxsize"):
        bus.subscribe("x", maxsize=0)
    with pytest.raises(ValueError, match="policy"):
        bus.subscribe("x", policy="block")  # type: ignore[arg-type]


def test_events_serialise_with_their_type() -> None:
    data = ev.RoundFinished(
        round=1, actors=2, batches=2, env_steps=10, round_env_steps=10, episodes=0,
        episode_return_mean=None, eval_return=1.0, round_s=0.1, actor_s=0.1, learner_s=0.0,
        probe_s=0.0, wall_s=0.0, cost_usd=0.0, sim_time_s=0.1,
    ).to_dict()
    assert data["event"] == "RoundFinished" and data["schema"] == 1 and "ts" in data
