"""Rounds that overlap sampling and training: only their scheduling lives here.

``async`` (APPO, IMPALA): the learner trains on batches as they arrive,
``actors.batches_per_update`` at a time; each new invocation takes the newest weights; batches
more than ``actors.max_lag`` versions old are dropped and counted, and the lag is reported per
update. The fleet keeps ``in_flight`` invocations outstanding, counting those whose batch has
come back but was not read yet: an invocation is replaced when its batch is read, so a learner
slower than its actors is never buried under batches that will be stale by the time it gets
to them. ``in_flight`` (`FleetSize`) is what keeps the learner fed, no more: the batches one
update takes times the updates an invocation spans, lowered when batches are dropped as stale,
never below ``actors.min`` nor above the scaler's target (which applies from the next launch
after the decision).

``pipelined`` (synchronous PPO): round t+1's invocations sample while round t trains, so they
arrive about one version stale. When they start depends on whether the scaler reads the round's
measurements (``adaptive``):

- a scaler that does not (fixed, schedules, ...) is asked ahead, and the fan-out starts
  part-way through the update, with the weights of that moment (at ``run.snapshot_at``, or,
  unset, as late as lets the batches arrive when the update ends, judged from the last round:
  by the time model's durations where it sets them, else by those measured here);
- an adaptive scaler (the Hessian-driven ones) decides after round t's probes, and round t+1
  launches right then: the curvature of round t steers round t+1, never t+2. In a round where
  none of the probes it reads runs (``Scaler.reads_probes``; the Hessian every 4th round), its
  decision cannot read the round, so it is asked ahead there as a fixed scaler is.

Either way the fan-out is sized by the budget allocator, counting round t's cost not yet
charged, and skipped when the plan's limits rule round t+1 out. A "round" in both modes is one
learner update, so stop rules, probes, scalers and sinks work unchanged.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from typing import Any

import structlog

from kernel import events as ev
from kernel.coordinator import Coordinator
from kernel.fleet import FleetSize, async_head_start
from kernel.roles import Batch, RoundRecord, SnapshotRequest, Weights

log = structlog.get_logger("kernel.overlapped")

#: Snapshot this much earlier than the last round's timings say: estimates drift, and batches
#: that arrive late make the learner wait, while early ones only cost a little freshness.
SNAPSHOT_MARGIN = 1.2
#: Below this fraction of the update done, a snapshot gains nothing over the last weights.
MIN_SNAPSHOT_AT = 0.05
class OverlappedRounds:
    def __init__(self, coordinator: Coordinator, mode: str,
                 resume: dict[str, Any] | None = None):
        self.c = coordinator
        self.intake = coordinator.intake
        self.mode = mode
        plan = coordinator.plan
        self.max_lag = plan["actors"]["max_lag"] if mode == "async" else 1
        self.target = coordinator.rules.sized(coordinator.state.actors_next)
        self._started = False
        #: Pipelined: invocations started for the round after the current one.
        self._launched_next = 0
        self._snapshots = mode == "pipelined" and bool(
            coordinator.roles.learner.supports_snapshots)
        self._snapshot_fixed: float | None = plan["run"]["snapshot_at"]
        self._last_learner_s: float | None = None
        self._snapshot_task: asyncio.Task[None] | None = None
        self._spec: dict[str, Any] | None = None
        self._next_size = 0
        self.intake.per_round = False
        #: Async: invocations kept outstanding (launched, batch not read yet).
        self.fleet = FleetSize(coordinator.rules.n_min, self.target, self.max_lag,
                               plan["actors"]["batches_per_update"] or self.target)
        self._invocation_s: float | None = None
        #: Async: invocations drained into the round now training, charged when it finishes.
        self._drained_uncharged = 0
        #: Async: the invocations out (running, or returned and not drained) when the last
        #: round's update began; the simulated clock credits the next round's sampling with
        #: that update only when every invocation it charges is among them.
        self._out_at_update: set[str] | None = None
        #: Pipelined: the fan-out started ahead for the next round, as a checkpoint keeps it.
        self._ahead: dict[str, Any] | None = None
        self._resume = resume if mode == "pipelined" else None
        if mode == "async":
            self.intake.on_done = self._top_up
            self.intake.on_settled = self._fill

    # -- launching ----------------------------------------------------------------------------

    def _launch(self, number: int, count: int) -> int:
        if self._spec is None:
            self._spec = self.c.actor_spec()
        return self.intake.launch(number, self.c.state.version, count, self._spec)

    def _launch_next(self, number: int, count: int, head_start: float | None) -> int:
        """Pipelined: start round ``number + 1``'s fan-out ahead of its round, and remember
        what it was started with (weights, their version, the first invocation's index) and
        how much of round ``number``'s update was still to run (``RoundRecord.head_start``:
        the simulated clock lets that much of the sampling hide behind the training)."""
        self._ahead = {"round": number + 1, "count": count, "version": self.c.state.version,
                       "first_index": self.intake.run_index, "weights": self.c.published_weights,
                       "head_start": head_start}
        self._launched_next = self._launch(number + 1, count)
        return self._launched_next

    def state(self) -> dict[str, Any] | None:
        """What a checkpoint between rounds keeps: the fan-out already started for the next
        round. A run resumed from it starts the same invocations with the same weights, so it
        replays what the uninterrupted run did (with a fixed snapshot point)."""
        ahead = self._ahead
        if ahead is None or ahead["round"] != self.c.state.round + 1 or ahead["weights"] is None:
            return None
        return {"ahead": ahead}

    async def _relaunch(self, number: int, ahead: dict[str, Any]) -> None:
        """Start again the fan-out a checkpoint says was in flight: its weights republished
        under their version, then the newest weights under theirs (the run's version)."""
        c, s = self.c, self.c.state
        newest = s.version
        s.version = int(ahead["version"]) - 1
        await c.publish_weights(number, ahead["weights"])
        if s.version < newest:
            s.version = newest - 1
            await c.publish_weights(number)
        self.intake.run_index = int(ahead["first_index"])
        self._spec = self._spec or c.actor_spec()
        self._ahead = {**ahead, "round": number}
        self._launched_next = self.intake.launch(number, int(ahead["version"]),
                                                 int(ahead["count"]), self._spec)

    def _top_up(self, ok: bool) -> None:
        """Async mode: keep ``target`` in flight; an actor that fails at once must not turn
        the fleet into a hot loop of failures."""
        if ok:
            self._fill()
        else:
            delay = min(2.0, 0.05 * 2 ** min(self.intake.consecutive_failures, 6))
            asyncio.get_running_loop().call_later(delay, self._fill)

    def _fill(self) -> int:
        """Launch until ``fleet.value`` invocations are outstanding, as far as the budget can
        pay for them and every other invocation not charged yet. An invocation counts until its
        batch is read, not until it returns: batches waiting for a busy learner hold the fleet
        back instead of growing stale in the queue."""
        count = self.c.rules.launchable(self.fleet.value - self._outstanding(),
                                        self._uncharged(), self._per_round())
        return self._launch(self.c.state.round + 1, count) if count > 0 else 0

    def _outstanding(self) -> int:
        running = {inv.request_id for inv, _ in self.intake.tasks.values()}
        return len(running | self.intake.pending.keys())

    def _uncharged(self) -> int:
        """Invocations a round will still charge: running, finished since the last drain, and
        drained into the round now training."""
        intake = self.intake
        return len(intake.tasks) + len(intake.receipts) + self._drained_uncharged

    def _out_now(self) -> set[str]:
        """Request ids of the invocations running or returned since the last drain."""
        return ({inv.request_id for inv, _ in self.intake.tasks.values()}
                | {r.request_id for r in self.intake.receipts})

    def _per_round(self) -> int:
        return self.c.plan["actors"]["batches_per_update"] or self.target

    # -- one round ----------------------------------------------------------------------------

    async def run_round(self) -> RoundRecord | None:
        c, s = self.c, self.c.state
        t_round = time.perf_counter()
        number = s.round + 1
        ahead = self._ahead if self._ahead and self._ahead["round"] == number else None
        if not self._started:
            self._started = True
            resume, self._resume = self._resume, None
            if resume is not None and resume.get("ahead", {}).get("round") == number:
                await self._relaunch(number, resume["ahead"])
                ahead = self._ahead
            else:
                await c.publish_weights(number)
                self._launched_next = (self._fill() if self.mode == "async"
                                       else self._launch(number, self.target))
        c.publish(ev.RoundStarted(round=number, actors=self.target, version=s.version))
        t_actors = time.perf_counter()
        if self.mode == "async":
            wanted = self._per_round()
            if c.rules.launchable(1, self._uncharged(), wanted) == 0:
                # The budget pays for nothing beyond what is out: the last round trains on all
                # of it, rather than leave stragglers to a round of their own that pays the
                # learner's fixed cost once more than the fleet was priced for.
                wanted = max(wanted, self._outstanding())
            refill = lambda missing: self._fill()  # noqa: E731
        else:
            wanted = self._launched_next or self.target
            refill = lambda missing: self._launch(number, missing)  # noqa: E731
        gathered = await self.intake.gather(number, s.version, wanted, max_lag=self.max_lag,
                                            refill=refill)
        if gathered is None:
            return None
        batches, actor_s = gathered.batches, time.perf_counter() - t_actors
        arrived = {b["request_id"] for b in batches}
        # This round's receipts, taken before the next fan-out: its invocations may finish
        # during the update, and they belong (and are charged) to the next round.
        finished, sample_s = self.intake.drain()
        self._drained_uncharged = len(finished)
        receipts = self.intake.receipts_for(arrived, finished)
        self._report_lag(number, batches, gathered.stale, gathered.trained_fraction)

        n = self.target
        self._launched_next = 0
        snapshot = None
        launch_after_decision = False
        if self.mode == "pipelined":
            if c.decides_on(number):
                launch_after_decision = True
            else:
                snapshot = self._launch_ahead(number, n, batches, sample_s)
        head_start = ahead.get("head_start") if ahead else None
        out_at_update = None
        if self.mode == "async":
            out_at_update = self._out_now()
            head_start = async_head_start(self._out_at_update, receipts)
        metrics, learner_s = await c.update(number, s.version, batches, gathered.message_ids,
                                            snapshot=snapshot)
        self._last_learner_s = learner_s or self._last_learner_s
        snapshot_task, self._snapshot_task = self._snapshot_task, None
        if snapshot_task is not None:
            await snapshot_task  # its version must be published before the update's
        await c.publish_weights(number)
        if snapshot is not None and snapshot_task is None:
            # The update ended before the snapshot point (an early KL stop): fresh weights,
            # with only the probes left to hide the sampling behind.
            self._launch_next(number, self._next_size, head_start=0.0)

        async def launch_decided(record: RoundRecord) -> None:
            if c.rules.after_round(record) is None:
                size = c.rules.fan_out_size(s.actors_next, 0, 0.0, rounds_pending=0)
                self._launch_next(number, size, head_start=None)

        record = await c.finish_round(
            number, n, batches, receipts, metrics, t_round=t_round, actor_s=actor_s,
            learner_s=learner_s, actor_idle_s=0.0,
            after_decision=launch_decided if launch_after_decision else None,
            head_start=head_start,
        )
        self._drained_uncharged = 0
        self._out_at_update = out_at_update
        self.target = max(s.actors_next, c.rules.n_min)
        if self.mode == "async":
            busy_s = time.perf_counter() - t_round - actor_s  # the round less its wait
            self._resize(wanted, sample_s, busy_s, gathered.stale)
            self._fill()
            if self.intake.tasks or self.intake.pending:
                # Launched with the budget's consent: the next round trains on them, even
                # when no new invocation fits any more.
                c.rules.committed = number + 1
        return record

    def _resize(self, batches_per_round: int, sample_s: list[float], busy_s: float,
                stale: int) -> None:
        if sample_s:
            self._invocation_s = statistics.median(sample_s)
        before = self.fleet.value
        after = self.fleet.update(target=self.target, batches_per_round=batches_per_round,
                                  invocation_s=self._invocation_s, busy_s=busy_s, stale=stale)
        if after != before:
            log.info("fleet_resized", round=self.c.state.round, in_flight=after, before=before,
                     target=self.target, invocation_s=self._invocation_s, busy_s=busy_s,
                     stale=stale)

    def _launch_ahead(self, number: int, n: int, batches: list[Batch],
                      sample_s: list[float]) -> SnapshotRequest | None:
        """Pipelined, non-adaptive scaler: decide round ``number + 1``'s size now and start
        its fan-out now or at a snapshot point of the coming update."""
        c = self.c
        pending_steps = sum(int(b["env_steps"]) for b in batches)
        pending_usd = c.rules.round_usd(n)
        wanted = c.scale(None, number=number, current=n, pending_usd=pending_usd)
        size = c.rules.fan_out_size(wanted, pending_steps, pending_usd)
        c.decided_ahead = max(wanted, c.rules.n_min)
        self._next_size = size
        if size == 0:
            return None
        at = self._snapshot_at(sample_s)
        if at is None:
            self._launch_next(number, size, head_start=1.0)
            return None
        return self._snapshot_request(number, at)

    def _snapshot_at(self, sample_s: list[float]) -> float | None:
        """Fraction of the update after which the next fan-out starts, or None for now: late
        enough that its batches arrive as the update ends, judged from the last round's
        sampling and update (the time model's where it sets the durations, so the point is
        the modelled machines' and a seeded run replays; else as measured here)."""
        if not self._snapshots:
            return None
        if self._snapshot_fixed is not None:
            return self._snapshot_fixed if self._snapshot_fixed > 0 else None
        timing = self.c.roles.cost.modelled_timing()
        if timing is not None:
            sampling_s, update_s = timing
        elif sample_s and self._last_learner_s:
            sampling_s, update_s = max(sample_s), self._last_learner_s
        else:
            return None
        if update_s <= 0:
            return None
        at = 1.0 - SNAPSHOT_MARGIN * sampling_s / update_s
        return at if at >= MIN_SNAPSHOT_AT else None

    def _snapshot_request(self, number: int, at: float) -> SnapshotRequest:
        loop = asyncio.get_running_loop()

        def start(weights: Weights) -> None:  # on the loop
            self._snapshot_task = asyncio.create_task(
                self._publish_and_launch(number, weights, head_start=1.0 - at))

        def deliver(weights: Weights) -> None:  # in the learner's thread
            loop.call_soon_threadsafe(start, weights)

        return SnapshotRequest(at=at, deliver=deliver)

    async def _publish_and_launch(self, number: int, weights: Weights,
                                  head_start: float) -> None:
        await self.c.publish_weights(number, weights)
        self._launch_next(number, self._next_size, head_start)

    def _report_lag(self, number: int, batches: list[Batch], stale: int,
                    trained_fraction: float | None) -> None:
        if not batches:
            return
        version = self.c.state.version
        lags = [version - int(b["version"]) for b in batches]
        histogram = Counter(str(lag) for lag in lags)
        self.c.publish(ev.VersionLag(
            round=number, mean=sum(lags) / len(lags), max=max(lags),
            histogram=dict(sorted(histogram.items())), dropped_stale=stale,
            in_flight=self.fleet.value if self.mode == "async" else None,
            trained_fraction=trained_fraction,
        ))
