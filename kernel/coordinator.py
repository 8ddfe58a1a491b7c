"""The round: the steps every mode shares, and the synchronous round that runs them in order.

One synchronous round, top to bottom (``Coordinator.run_round``):

1. the round's size is what the scaler chose after the last round, within the budget;
2. the learner's weights are encoded once and published under a new version;
3. N invocations start, and the intake gathers their batches (``kernel.intake``);
4. the learner trains on them in a worker thread; only then are they acknowledged;
5. probes measure the updated policy; the cost model charges the round;
6. the scaler chooses the next round's N, which the budget allocator may shrink;
7. ``RoundFinished`` reports the round's facts.

The overlapped modes (``kernel.overlapped``) schedule the same steps differently; every wait
has a deadline, and a round goes on without actors that fail or are late.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from kernel import codec
from kernel import events as ev
from kernel.contract import ProbeSlot, Roles, blame
from kernel.fleet import cold_starts
from kernel.intake import Intake
from kernel.roles import (
    Batch,
    ProbeContext,
    ProbeRun,
    Receipt,
    RoundRecord,
    ScaleContext,
    SnapshotRequest,
    Weights,
)
from kernel.run_state import RunState, StopRules

log = structlog.get_logger("kernel.coordinator")


@dataclass(eq=False, repr=False)
class Coordinator:
    """The round's steps over the run's parts: what the engine built, the run's state, and
    the bus. The intake it builds shares them, so there is one owner of each."""

    plan: dict[str, Any]
    run_id: str
    roles: Roles
    state: RunState
    publish: Callable[[ev.Event], None]
    stop_requested: asyncio.Event
    rng: np.random.Generator
    rules: StopRules
    intake: Intake = field(init=False)
    #: The weights of the newest version published (a pipelined run checkpoints the ones its
    #: next fan-out was launched with).
    published_weights: Weights | None = field(default=None, init=False)
    #: A decision taken ahead for the round being trained (overlapped modes, scalers that
    #: read no measurements): the round's end must not ask the scaler a second time.
    decided_ahead: int | None = field(default=None, init=False)
    #: Per probe: (finished rounds read, charged seconds in them, its last run's), so ``due``
    #: reads each round once rather than the whole history every round.
    probe_charged: dict[str, tuple[int, float, float]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.intake = Intake(self.plan, self.run_id, self.roles, self.state, self.publish,
                             self.stop_requested)

    # -- one synchronous round ----------------------------------------------------------------

    async def run_round(self) -> RoundRecord | None:
        """Run one round; return its record, or None if a stop request cut it short."""
        s = self.state
        t_round = time.perf_counter()
        number, n = s.round + 1, self.rules.sized(s.actors_next)
        self.publish(ev.RoundStarted(round=number, actors=n, version=s.version + 1))
        version = await self.publish_weights(number)

        t_actors = time.perf_counter()
        self.intake.launch(number, version, n, self.actor_spec())
        gathered = await self.intake.gather(number, version, n, max_lag=0)
        if gathered is None:
            return None
        receipts = await self.intake.settle(gathered)
        actor_s = time.perf_counter() - t_actors

        metrics, learner_s = await self.update(number, version, gathered.batches,
                                               gathered.message_ids)
        return await self.finish_round(
            number, n, gathered.batches, receipts, metrics, t_round=t_round, actor_s=actor_s,
            learner_s=learner_s, actor_idle_s=n * learner_s,
        )

    # -- the steps ----------------------------------------------------------------------------

    def actor_spec(self) -> dict[str, Any]:
        with blame(self.roles.learner):
            return self.roles.learner.actor_spec()

    async def publish_weights(self, number: int, weights: Weights | None = None) -> int:
        """Encode the learner's weights (or a snapshot of them) under the next version."""
        s, roles = self.state, self.roles
        version = s.version + 1
        if weights is None:
            with blame(roles.learner):
                weights = await asyncio.to_thread(roles.learner.weights)
        t0 = time.perf_counter()
        payload = await asyncio.to_thread(
            codec.encode, "weights", {"version": version, "weights": weights}
        )
        encode_ms = (time.perf_counter() - t0) * 1000
        with blame(roles.transport):
            await roles.transport.publish_weights(version, payload)
        s.version = version
        self.published_weights = weights
        self.publish(ev.WeightsPublished(round=number, version=version, bytes=len(payload),
                                         encode_ms=encode_ms))
        return version

    async def update(self, number: int, version: int, batches: list[Batch],
                     message_ids: list[str], snapshot: SnapshotRequest | None = None,
                     ) -> tuple[dict[str, float], float]:
        s, learner = self.state, self.roles.learner
        if not batches:
            s.counters.empty_rounds += 1
            log.warning("round_without_batches", round=number)
            with blame(self.roles.transport):  # rejected or stale entries: never re-read them
                await self.roles.transport.ack(message_ids)
            return {}, 0.0
        t0 = time.perf_counter()
        with blame(learner):
            if snapshot is not None:
                metrics = await asyncio.to_thread(learner.update, batches, snapshot=snapshot)
            else:
                metrics = await asyncio.to_thread(learner.update, batches)
        learner_s = time.perf_counter() - t0
        # Acknowledged only now: a learner that dies mid-update re-reads these batches.
        with blame(self.roles.transport):
            await self.roles.transport.ack(message_ids)
        s.env_steps += sum(int(b["env_steps"]) for b in batches)
        s.counters.empty_rounds = 0
        self.publish(ev.LearnerUpdated(round=number, version=version, learner_s=learner_s,
                                       metrics=finite(metrics)))
        return metrics, learner_s

    async def finish_round(
        self,
        number: int,
        n: int,
        batches: list[Batch],
        receipts: list[Receipt],
        metrics: dict[str, float],
        *,
        t_round: float,
        actor_s: float,
        learner_s: float,
        actor_idle_s: float,
        after_decision: Callable[[RoundRecord], Awaitable[None]] | None = None,
        head_start: float | None = None,
    ) -> RoundRecord:
        """Probes, cost, the scaler's decision and the round's facts. ``after_decision`` runs
        as soon as the next round's size is known (an overlapped mode launches there);
        ``head_start`` is how far ahead of the previous round's end this round's fan-out
        started (``RoundRecord.head_start``)."""
        s, roles = self.state, self.roles
        runs = await self.probe(number, batches)
        probe_values = {k: v for run in runs for k, v in run.values.items()}
        probe_s = sum(run.seconds for run in runs)
        eval_s = sum(run.seconds for run in runs if run.evaluation)
        eval_return = self.score_of(runs)

        round_steps = sum(int(b["env_steps"]) for b in batches)
        episodes = _concat(batches, "episode_returns", np.float64)
        lengths = _concat(batches, "episode_lengths", np.int64)
        round_s = time.perf_counter() - t_round
        record = RoundRecord(
            round=number, actors=n, env_steps=round_steps, batches=len(batches),
            round_s=round_s, learner_s=learner_s, probe_s=probe_s, eval_s=eval_s,
            actor_durations_ms=[r.duration_ms for r in receipts if r.ok],
            cold_starts=sum(r.cold_start for r in receipts),
            eval_return=eval_return,
            episode_return_mean=float(episodes.mean()) if episodes.size else None,
            probes=probe_values, probe_runs=runs,
        )
        # Simulated time is training time: evaluation is measured but left out, as from cost.
        # A pipelined fan-out started during the previous round's training sampled while the
        # learner was busy there, so only the rest of its sampling adds to this round's time.
        previous = s.history[-1] if s.history else None
        if previous is not None and previous.round == number - 1:
            record.head_start = head_start
        if roles.actors.simulate:
            record.sim_cold_starts, record.warm_pool = cold_starts(
                previous.warm_pool if previous is not None else 0, receipts, n)
            sampled_s = roles.actors.simulated_actor_s(receipts,
                                                       cold_starts=record.sim_cold_starts)
            if previous is not None:
                record.overlap_s = record.overlapped_s(
                    sampled_s, previous.learner_s, previous.probe_s - previous.eval_s)
            record.sim_time_s = sampled_s - record.overlap_s + learner_s + probe_s - eval_s
        else:
            record.sim_time_s = round_s - eval_s

        # The estimate this round's invocations started on (an async round may settle more of
        # them than its size, launched up to max_lag rounds ago).
        estimate = self.rules.estimate_ran_on(max(n, len(receipts)))
        with blame(roles.cost):
            items = roles.cost.charge(record, receipts)
        record.cost_usd = float(sum(items.values()))
        s.cost_usd += record.cost_usd
        self.rules.note_charge(estimate, record.cost_usd)
        self.publish(ev.CostCharged(round=number, items=items, round_usd=record.cost_usd,
                                    total_usd=s.cost_usd))

        s.round = number
        s.sim_time_s += record.sim_time_s
        s.actors_per_round.append(n)
        s.history.append(record)
        self.rules.remember_estimates()
        s.note_evaluation(eval_return)

        decided, self.decided_ahead = self.decided_ahead, None
        s.actors_next = decided if decided is not None else self.scale(record)
        if after_decision is not None:
            await after_decision(record)
        self.publish(ev.RoundFinished(
            round=number, actors=n, batches=len(batches), env_steps=s.env_steps,
            round_env_steps=round_steps, episodes=int(episodes.size),
            episode_return_mean=record.episode_return_mean,
            episode_length_mean=float(lengths.mean()) if lengths.size else None,
            eval_return=eval_return, round_s=record.round_s, actor_s=actor_s,
            learner_s=learner_s, probe_s=probe_s, wall_s=self.rules.wall_s(),
            env_steps_per_s=round_steps / round_s if round_s > 0 else None,
            cost_usd=s.cost_usd, sim_time_s=s.sim_time_s, overlap_s=record.overlap_s,
            learner_busy=learner_s / round_s if round_s > 0 else 0.0,
            actor_idle_s=actor_idle_s, probes=finite(probe_values), metrics=finite(metrics),
            trained_fraction=self.intake.last_trained_fraction,
        ))
        return record

    async def probe(self, number: int, batches: list[Batch], *, evaluation_only: bool = False
                    ) -> list[ProbeRun]:
        """Run the probes due this round, each timed on its own (a time model replaces the
        seconds of the probes it knows, and evaluation is measured but not charged)."""
        runs: list[ProbeRun] = []
        ctx = ProbeContext(round=number, learner=self.roles.learner.plugin, batches=batches,
                           seed=self.plan["run"]["seed"] + number)
        for slot in self.roles.probes:
            if evaluation_only and not slot.evaluation:
                continue
            due = evaluation_only or self.due(slot, number)
            if not due and self.scheduled(slot, number):
                self.state.counters.probes_skipped += 1
                log.info("probe_skipped", round=number, probe=slot.name,
                         max_share=slot.max_share)
            if not due or (not batches and not slot.evaluation):
                continue
            t0 = time.perf_counter()
            with blame(slot.probe):
                measured = await asyncio.to_thread(slot.probe.measure, ctx)
            probe_s = time.perf_counter() - t0
            runs.append(ProbeRun(name=slot.name, seconds=probe_s, values=measured,
                                 score=slot.score))
            self.publish(ev.ProbeMeasured(round=number, probe=slot.name, probe_s=probe_s,
                                          values=finite(measured)))
        return runs

    @staticmethod
    def scheduled(slot: ProbeSlot, number: int) -> bool:
        """Whether round ``number`` is one of the ``every``-th rounds ``slot`` measures in."""
        return number % max(1, slot.every) == 0

    def due(self, slot: ProbeSlot, number: int) -> bool:
        """Whether ``slot`` measures in round ``number``: every ``every`` rounds, less those
        its ``max_share`` skips. The share is read from finished rounds only, so the answer
        is the same when an overlapped fan-out asks it before the round ends; a measurement
        is skipped when, at the probe's last charged time, it would take the probe past its
        share even of the time so far (the round's own work only lowers the share after)."""
        if not self.scheduled(slot, number):
            return False
        if slot.max_share is None:
            return True
        history = self.state.history
        read, spent, last = self.probe_charged.get(slot.name, (0, 0.0, 0.0))
        for record in history[read:]:
            for run in record.probe_runs:
                if run.name == slot.name and not run.evaluation:
                    last = run.seconds if run.charged_s is None else run.charged_s
                    spent += last
        self.probe_charged[slot.name] = (len(history), spent, last)
        return spent + last <= slot.max_share * (self.state.sim_time_s + last)

    def decides_on(self, number: int) -> bool:
        """Whether the scaler's decision after round ``number`` reads that round, so the next
        fan-out must wait for it: an adaptive scaler's does, unless it names the probes it
        reads (``reads_probes``) and none of them runs this round."""
        scaler = self.roles.scaler
        if not scaler.adaptive:
            return False
        reads = scaler.reads_probes
        if reads is None:
            return True
        return any(slot.name in reads and self.due(slot, number)
                   for slot in self.roles.probes)

    @staticmethod
    def score_of(runs: list[ProbeRun]) -> float | None:
        """The policy's score this round: the last evaluating probe's, if one reported it."""
        score: float | None = None
        for run in runs:
            if run.score is not None:
                score = run.values.get(run.score, score)
        return score

    def scale(self, record: RoundRecord | None, *, number: int | None = None,
              current: int | None = None, pending_usd: float = 0.0) -> int:
        """The next round's N: the scaler's wish, clipped to the plan's bounds and to what
        the budget left (after ``pending_usd`` not yet charged) can pay for; 0 when no round
        fits. Asked ahead (``record`` None), it decides for the round after ``number``."""
        number = record.round if record is not None else number
        current = record.actors if record is not None else current
        ctx = ScaleContext(
            round=number, current=current, n_min=self.rules.n_min, n_max=self.rules.n_max,
            history=self.state.history, budget_left_usd=self.rules.budget_left(pending_usd),
            cost_per_actor_usd=self.roles.cost.estimate_actor_usd(record),
            rng=self.rng, affordable=self.rules.affordable(pending_usd),
        )
        with blame(self.roles.scaler):
            wanted = int(self.roles.scaler.decide(ctx))
        chosen = self.rules.sized(wanted, pending_usd)
        self.publish(ev.ScaleDecided(round=number, previous=current, actors=chosen,
                                     scaler=self.roles.scaler.name,
                                     detail=finite(self.roles.scaler.last_detail or {})))
        return chosen

    async def evaluate_at_stop(self) -> None:
        """A run's final evaluation return is measured on the policy it ends with, whatever
        round the periodic evaluation last ran in."""
        s = self.state
        if s.round == 0 or not any(slot.evaluation for slot in self.roles.probes):
            return
        if s.history and s.history[-1].eval_return is not None:
            return
        s.note_evaluation(self.score_of(await self.probe(s.round, [], evaluation_only=True)))

    async def close(self) -> None:
        """Give up on what is still in flight, and charge it: on AWS those invocations run
        on, billed, until they end or time out."""
        receipts = await self.intake.close()
        if not receipts:
            return
        s = self.state
        record = RoundRecord(round=s.round, actors=0, env_steps=0, batches=0, round_s=0.0,
                             learner_s=0.0, probe_s=0.0, actor_durations_ms=[], cold_starts=0,
                             eval_return=None, episode_return_mean=None, probes={})
        with blame(self.roles.cost):
            items = self.roles.cost.charge(record, receipts)
        usd = float(sum(items.values()))
        s.cost_usd += usd
        self.publish(ev.CostCharged(round=s.round, items=items, round_usd=usd,
                                    total_usd=s.cost_usd))


def _concat(batches: list[Batch], key: str, dtype: Any) -> np.ndarray:
    parts = [np.asarray(b[key], dtype=dtype) for b in batches if key in b]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def finite(values: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe scalars: NaN and infinities become None rather than invalid JSON."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, (float, np.floating)):
            value = float(value)
            out[key] = value if math.isfinite(value) else None
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            out[key] = int(value)
        else:
            out[key] = value
    return out
