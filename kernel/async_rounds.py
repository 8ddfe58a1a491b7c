"""Rounds that overlap sampling and training: the ``async`` and ``pipelined`` modes.

``async`` (APPO, IMPALA): a fleet keeps the scaler's target number of invocations in flight;
each new invocation takes the newest weights; the learner consumes batches as they arrive, in
learner batches of ``actors.batches_per_update``; every batch carries the policy version it was
sampled with, the lag is reported per update and batches older than ``actors.max_lag`` versions
are dropped and counted.

``pipelined`` (opt-in for synchronous PPO): as soon as a round's N batches are in, the next N
invocations start with the current weights, so they sample while the learner trains and
arrive one version stale.

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
from kernel.coordinator import LOST_BATCH_GRACE_S, Coordinator
from kernel.roles import Batch, Invocation, Receipt

log = structlog.get_logger("kernel.async_rounds")


class Fleet:
    """Invocations in flight. ``fill`` tops them up to ``target`` with the newest version."""

    def __init__(self, coordinator: Coordinator, continuous: bool):
        self.coordinator = coordinator
        self.continuous = continuous
        self.target = coordinator.state.actors_next
        self.tasks: dict[asyncio.Task[Receipt], Invocation] = {}
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
            self.pending.add(inv.request_id)
            c.state.counters.invocations += 1
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Receipt]) -> None:
        inv = self.tasks.pop(task, None)
        self.last_done = time.monotonic()
        if task.cancelled() or inv is None:
            return
        receipt = task.result()
        self.receipts.append(receipt)
        if receipt.ok:
            self.consecutive_failures = 0
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
        self._report_lag(number, batches)
        self._launched_next = None
        if self.mode == "pipelined" and c.another_round_due(
                sum(int(b["env_steps"]) for b in batches)):
            # The next round samples while this one trains (this round's invocations may not
            # have returned yet: their batches are in, which is what counts).
            self.fleet.launch(self.fleet.target, ahead=1)
            self._launched_next = self.fleet.target
        metrics, learner_s = await c.update(number, s.version, batches, message_ids)
        await c.publish_weights(number)
        record = await c.finish_round(
            number, self.fleet.target, batches, receipts, metrics, t_round=t_round,
            actor_s=actor_s, learner_s=learner_s, actor_idle_s=0.0,
        )
        self.fleet.target = s.actors_next
        if self.mode == "async":
            self.fleet.fill()
        return record

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
        return list(batches.values()), message_ids

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
