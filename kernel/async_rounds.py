"""Rounds that overlap sampling and training: the ``async`` and ``pipelined`` modes.

``async`` (APPO, IMPALA): a fleet keeps the scaler's target number of invocations in flight;
each new invocation takes the newest weights; the learner consumes batches as they arrive, in
learner batches of ``actors.batches_per_update``; every batch carries the policy version it was
sampled with, the lag is reported per update and batches older than ``actors.max_lag`` versions
are dropped and counted.

``pipelined`` (opt-in for synchronous PPO): the next round's N invocations sample while the
learner trains, so they arrive one version stale. With a learner that supports snapshots
they start part-way through the update, with the weights of that moment: at the fraction
``run.snapshot_at``, or, unset, as late as lets their batches arrive when the update ends,
judged from the last round's sampling and update times. Their policy then lags the learner's
by only that last part of an update instead of a whole one.

A "round" in both modes is one learner update, so stop rules, probes, scalers and sinks work
unchanged.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import structlog

from kernel import events as ev
from kernel.coordinator import LOST_BATCH_GRACE_S, Coordinator, in_request_order
from kernel.roles import Batch, Invocation, Receipt, SnapshotRequest, Weights

log = structlog.get_logger("kernel.async_rounds")

#: Snapshot this much earlier than the last round's timings say: estimates drift, and batches
#: that arrive late make the learner wait, while early ones only cost a little freshness.
SNAPSHOT_MARGIN = 1.2
#: Below this fraction of the update done, a snapshot gains nothing over the last weights.
MIN_SNAPSHOT_AT = 0.05


class Fleet:
    """Invocations in flight. ``fill`` tops them up to ``target`` with the newest version."""

    def __init__(self, coordinator: Coordinator, continuous: bool):
        self.coordinator = coordinator
        self.continuous = continuous
        self.target = coordinator.state.actors_next
        self.tasks: dict[asyncio.Task[Receipt], Invocation] = {}
        self.started: dict[asyncio.Task[Receipt], float] = {}
        #: Seconds from launch to return of the successful invocations since the last drain.
        self.sample_s: list[float] = []
        self.pending: set[str] = set()
        self.receipts: list[Receipt] = []
        self.closing = False
        #: Failed invocations since the last success: refills back off, and a collection gives up.
        self.consecutive_failures = 0
        #: When the last invocation finished: a batch still missing LOST_BATCH_GRACE_S later is lost.
        self.last_done = time.monotonic()
        self._count = 0
        self._spec: dict[str, Any] | None = None

    def fill(self) -> None:
        """Top the invocations in flight up to ``target`` (async mode)."""
        self.launch(self.target - len(self.tasks))

    def launch(self, count: int, ahead: int = 0) -> None:
        """Start ``count`` new invocations with the newest weights, for the round after the
        current one plus ``ahead`` (its number goes into the request id)."""
        c = self.coordinator
        if self._spec is None:
            self._spec = c.actor_spec()
        for _ in range(max(0, count)):
            if self.closing:
                return
            self._count += 1
            inv = c._invocation(c.state.round + 1 + ahead, c.state.version, self._count,
                                self._spec)
            task = asyncio.create_task(c._invoke(inv), name=inv.request_id)
            self.tasks[task] = inv
            self.started[task] = time.monotonic()
            self.pending.add(inv.request_id)
            c.state.counters.invocations += 1
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Receipt]) -> None:
        inv = self.tasks.pop(task, None)
        started = self.started.pop(task, None)
        self.last_done = time.monotonic()
        if task.cancelled() or inv is None:
            return
        receipt = task.result()
        self.receipts.append(receipt)
        if receipt.ok:
            self.consecutive_failures = 0
            if started is not None:
                self.sample_s.append(self.last_done - started)
        else:
            self.pending.discard(inv.request_id)
            self.consecutive_failures += 1
        if not self.continuous:
            return
        if receipt.ok:
            self.fill()
        else:
            # An actor that fails at once must not turn the fleet into a hot loop of failures.
            delay = min(2.0, 0.05 * 2 ** min(self.consecutive_failures, 6))
            asyncio.get_running_loop().call_later(delay, self.fill)

    def drain_receipts(self) -> list[Receipt]:
        out, self.receipts = self.receipts, []
        return out

    def drain_sample_s(self) -> list[float]:
        out, self.sample_s = self.sample_s, []
        return out

    async def close(self) -> None:
        self.closing = True
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()


class OverlappedRounds:
    def __init__(self, coordinator: Coordinator, mode: str):
        self.c = coordinator
        self.mode = mode
        cfg = coordinator.plan["actors"]
        self.max_lag = cfg["max_lag"] if mode == "async" else 1
        self.fleet = Fleet(coordinator, continuous=(mode == "async"))
        self._started = False
        self._stale = 0  # batches dropped as too old during the last collection
        #: Pipelined: invocations already started for the next round (its batches to collect).
        self._launched_next: int | None = None
        self._snapshots = mode == "pipelined" and bool(
            getattr(coordinator.roles.learner, "supports_snapshots", False))
        #: A fixed snapshot point (replayable), or None to time it from the last round.
        self._snapshot_fixed: float | None = coordinator.plan["run"]["snapshot_at"]
        self._last_learner_s: float | None = None
        self._snapshot_task: asyncio.Task[None] | None = None

    def _batches_wanted(self) -> int:
        per_update = self.c.plan["actors"]["batches_per_update"]
        if self.mode == "async":
            return per_update or self.fleet.target
        return self._launched_next or self.fleet.target

    async def run_round(self) -> Any:
        c, s = self.c, self.c.state
        t_round = time.perf_counter()
        number = s.round + 1
        if not self._started:
            await c.publish_weights(number)
            self._started = True
            self.fleet.launch(self.fleet.target)
            self._launched_next = self.fleet.target
        self.c.publish(ev.RoundStarted(round=number, actors=self.fleet.target,
                                       version=s.version))
        t_actors = time.perf_counter()
        gathered = await self._collect(number, self._batches_wanted())
        if gathered is None:
            return None
        batches, message_ids = gathered
        actor_s = time.perf_counter() - t_actors
        # This round's receipts, before the pipelined fill: the next fan-out's invocations may
        # finish during the update and belong to (and are charged to) the next round.
        receipts = self.fleet.drain_receipts()
        sample_s = self.fleet.drain_sample_s()
        self._report_lag(number, batches)
        self._launched_next = None
        snapshot = None
        if self.mode == "pipelined" and c.another_round_due(
                sum(int(b["env_steps"]) for b in batches)):
            # The next round samples while this one trains (this round's invocations may not
            # have returned yet: their batches are in, which is what counts).
            self._launched_next = self.fleet.target
            at = self._snapshot_at(sample_s)
            if at is None:
                self.fleet.launch(self.fleet.target, ahead=1)
            else:
                snapshot = self._snapshot_request(number, at)
        metrics, learner_s = await c.update(number, s.version, batches, message_ids,
                                            snapshot=snapshot)
        self._last_learner_s = learner_s or self._last_learner_s
        snapshot_task, self._snapshot_task = self._snapshot_task, None
        if snapshot_task is not None:
            await snapshot_task  # its version must be published before the update's
        await c.publish_weights(number)
        if snapshot is not None and snapshot_task is None:
            # The update ended before the snapshot point (an early KL stop): fresh weights.
            self.fleet.launch(self.fleet.target, ahead=1)
        record = await c.finish_round(
            number, self.fleet.target, batches, receipts, metrics, t_round=t_round,
            actor_s=actor_s, learner_s=learner_s, actor_idle_s=0.0,
        )
        self.fleet.target = s.actors_next
        if self.mode == "async":
            self.fleet.fill()
        return record

    def _snapshot_at(self, sample_s: list[float]) -> float | None:
        """Fraction of the update after which the next fan-out starts, or None for now."""
        if not self._snapshots:
            return None
        if self._snapshot_fixed is not None:
            return self._snapshot_fixed if self._snapshot_fixed > 0 else None
        if not sample_s or not self._last_learner_s:
            return None
        at = 1.0 - SNAPSHOT_MARGIN * max(sample_s) / self._last_learner_s
        return at if at >= MIN_SNAPSHOT_AT else None

    def _snapshot_request(self, number: int, at: float) -> SnapshotRequest:
        loop = asyncio.get_running_loop()

        def start(weights: Weights) -> None:  # on the loop
            self._snapshot_task = asyncio.create_task(self._publish_and_launch(number, weights))

        def deliver(weights: Weights) -> None:  # in the learner's thread
            loop.call_soon_threadsafe(start, weights)

        return SnapshotRequest(at=at, deliver=deliver)

    async def _publish_and_launch(self, number: int, weights: Weights) -> None:
        await self.c.publish_weights(number, weights)
        self.fleet.launch(self.fleet.target, ahead=1)

    async def _collect(self, number: int, wanted: int) -> tuple[list[Batch], list[str]] | None:
        c, s = self.c, self.c.state
        batches: dict[str, Batch] = {}
        message_ids: list[str] = []
        deadline = time.monotonic() + c.plan["actors"]["deadline_s"]
        stale_before = s.counters.stale_batches
        self.fleet.consecutive_failures = 0
        while len(batches) < wanted:
            if c.stop_requested.is_set():
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("update_deadline", round=number, received=len(batches),
                            wanted=wanted)
                break
            if self.fleet.consecutive_failures >= max(4, 2 * self.fleet.target):
                log.warning("actors_failing", round=number,
                            failures=self.fleet.consecutive_failures)
                break  # an empty round: three of them stop the run (actors_failing)
            if not self.fleet.tasks and not self.fleet.closing and (
                    not self.fleet.pending
                    or time.monotonic() - self.fleet.last_done > LOST_BATCH_GRACE_S):
                # Nothing in flight and no batch on its way (every invocation failed, or what
                # they pushed is lost): start new ones. Batches of finished invocations may
                # still be in the transport (Event invokes, Redis), so those are waited for.
                self.fleet.pending.clear()
                if self.mode == "async":
                    self.fleet.fill()
                else:
                    self.fleet.launch(wanted - len(batches))
            message = await c.roles.transport.next_batch(timeout=min(remaining, 0.5))
            if message is None:
                continue
            rid = c._accept(number, s.version, message, self.fleet.pending, batches,
                            message_ids, max_lag=self.max_lag)
            if rid is not None:
                self.fleet.pending.discard(rid)
        self._stale = s.counters.stale_batches - stale_before
        return in_request_order(batches), message_ids

    def _report_lag(self, number: int, batches: list[Batch]) -> None:
        if not batches:
            return
        version = self.c.state.version
        lags = [version - int(b["version"]) for b in batches]
        histogram = Counter(str(lag) for lag in lags)
        self.c.publish(ev.VersionLag(
            round=number, mean=sum(lags) / len(lags), max=max(lags),
            histogram=dict(sorted(histogram.items())), dropped_stale=self._stale,
        ))

    async def close(self) -> None:
        await self.fleet.close()
