"""An in-process bus of typed events with one bounded queue per subscriber.

``publish`` never waits: training must not stall because a dashboard is slow. Each subscriber
states what happens when its queue is full:

- ``drop_oldest`` (default): discard the oldest queued event, keep the newest facts;
- ``drop_newest``: discard the event being published, keep history in order.

Every drop is counted per subscriber (``statistics()``), and the run summary reports the totals.
Events published from other threads go through ``publish_threadsafe``.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from kernel.events import Event

Policy = Literal["drop_oldest", "drop_newest"]
_CLOSED = object()


@dataclass(slots=True)
class SubscriptionStats:
    delivered: int = 0
    dropped: int = 0
    peak: int = 0


class Subscription:
    """A bounded queue of events for one observer; iterate it with ``async for``."""

    def __init__(self, name: str, maxsize: int, policy: Policy, types: tuple[type, ...]):
        if maxsize < 1:
            raise ValueError(f"subscription {name!r}: maxsize must be >= 1, got {maxsize}")
        if policy not in ("drop_oldest", "drop_newest"):
            raise ValueError(f"subscription {name!r}: unknown policy {policy!r}")
        self.name = name
        self.maxsize = maxsize
        self.policy = policy
        self.types = types
        self.stats = SubscriptionStats()
        self._queue: collections.deque[object] = collections.deque()
        self._wakeup = asyncio.Event()
        self._closed = False

    def _offer(self, event: Event) -> None:
        if self._closed or (self.types and not isinstance(event, self.types)):
            return
        if len(self._queue) >= self.maxsize:
            self.stats.dropped += 1
            if self.policy == "drop_newest":
                return
            self._queue.popleft()
        self._queue.append(event)
        self.stats.peak = max(self.stats.peak, len(self._queue))
        self._wakeup.set()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.append(_CLOSED)
            self._wakeup.set()

    def pending(self) -> int:
        return len(self._queue)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        while True:
            while not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            item = self._queue.popleft()
            if item is _CLOSED:
                return
            self.stats.delivered += 1
            yield item  # type: ignore[misc]


class Bus:
    def __init__(self) -> None:
        self._subs: list[Subscription] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.published = 0

    def subscribe(
        self,
        name: str,
        *,
        maxsize: int = 1024,
        policy: Policy = "drop_oldest",
        types: tuple[type, ...] = (),
    ) -> Subscription:
        sub = Subscription(name, maxsize, policy, types)
        self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        sub._close()
        if sub in self._subs:
            self._subs.remove(sub)

    def publish(self, event: Event) -> None:
        """Hand ``event`` to every subscriber without waiting (call on the loop's thread)."""
        self.published += 1
        for sub in self._subs:
            sub._offer(event)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def publish_threadsafe(self, event: Event) -> None:
        if self._loop is None:
            raise RuntimeError("bus is not bound to an event loop")
        self._loop.call_soon_threadsafe(self.publish, event)

    def close(self) -> None:
        for sub in self._subs:
            sub._close()
        self._subs.clear()

    def statistics(self) -> dict[str, SubscriptionStats]:
        return {sub.name: sub.stats for sub in self._subs}
