"""What a run carries from round to round, and the one set of rules that ends it.

``RunState`` and ``Counters`` are everything that continues across rounds and across a resume.
``StopRules`` answers the two questions every mode asks — "is another round due?" before a
round, and "may this fan-out start?" before invocations that a later update will train on —
and it sizes rounds against the budget with the cost model's one estimate of a round's cost,
so the scaler's cap and the stop rule can never disagree.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from kernel.roles import CostModel, RoundRecord

log = structlog.get_logger("kernel.run_state")


@dataclass
class Counters:
    """What went wrong, or was paid for twice, over the run: ``summary.json`` lists them."""

    invocations: int = 0
    invocation_errors: int = 0
    """invocations that ended in an error (the function's, the platform's, or a crash)"""
    invocation_timeouts: int = 0
    """invocations still running when their round stopped waiting, then cancelled"""
    invocations_cancelled: int = 0
    throttles: int = 0
    """429 answers from the platform (each retried after a back-off)"""
    retries: int = 0
    cold_starts: int = 0
    rejected_payloads: int = 0
    """payloads that failed to decode or a check, by reason in ``rejected_reasons``"""
    rejected_reasons: dict[str, int] = field(default_factory=dict)
    stale_batches: int = 0
    """sound batches too many weights versions old to train on"""
    duplicate_batches: int = 0
    empty_rounds: int = 0
    """rounds in a row without a batch (`EMPTY_ROUNDS_LIMIT` of them end the run)"""
    lost_batches: int = 0
    """batches of invocations that returned but never reached the transport"""
    sampled_env_steps: int = 0
    """env steps of the batches that reached the intake (trained or dropped as stale); what
    never arrived is not counted, as its size is not known"""
    trained_env_steps: int = 0
    """env steps of the batches handed to the learner"""
    probes_skipped: int = 0
    """due measurements a probe's ``max_share`` skipped"""

    def reject(self, reason: str) -> None:
        self.rejected_payloads += 1
        self.rejected_reasons[reason] = self.rejected_reasons.get(reason, 0) + 1

    def trained_fraction(self) -> float | None:
        """Share of the sampled env steps the learner trained on (None before any arrived):
        what an asynchronous fleet that outruns its learner wastes shows here."""
        if self.sampled_env_steps <= 0:
            return None
        return self.trained_env_steps / self.sampled_env_steps


@dataclass
class RunState:
    """Everything that continues across rounds (and across a resume)."""

    #: The last round that finished.
    round: int = 0
    #: The learner's weights version (one per update).
    version: int = 0
    #: Env steps trained on so far.
    env_steps: int = 0
    #: The best and the latest result of the probe that drives ``stop.target_return``.
    best_eval_return: float | None = None
    final_eval_return: float | None = None
    #: The fan-out the scaler chose for the next round.
    actors_next: int = 1
    #: Spend so far, by the cost model; evaluation time is not part of it.
    cost_usd: float = 0.0
    #: The largest ratio so far of a round's charge to the estimate it ran on (at least 1):
    #: the allocator keeps a repeat of it in hand (``StopRules.reserve_usd``).
    estimate_miss: float = 1.0
    #: Simulated cloud time: what the run would have taken with its fan-out concurrent.
    sim_time_s: float = 0.0
    actors_per_round: list[int] = field(default_factory=list)
    #: Every finished round's record (what scalers and the cost model estimate from).
    history: list[RoundRecord] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    #: Request ids whose batches were accepted: a replayed or duplicated batch is refused.
    seen_requests: set[str] = field(default_factory=set)

    def note_evaluation(self, score: float | None) -> None:
        """An evaluation's score (None: none ran) becomes the latest, and the best if it is."""
        if score is not None:
            self.final_eval_return = score
            if self.best_eval_return is None or score > self.best_eval_return:
                self.best_eval_return = score


#: Empty rounds in a row after which the actors are taken to be failing for good.
EMPTY_ROUNDS_LIMIT = 3
#: The most the allocator keeps in hand against a round dearer than its estimate, as a share of
#: the budget (``StopRules.reserve_usd``). A run stops with less than one smallest round and
#: this left, so it still spends 95 % of a budget that pays for 50 small rounds; one freak round
#: (a machine swapping, a debugger attached) must not strand more. A single stall of a loaded
#: 2-core machine was measured at 2.3 % of a budget billed for about 3 s of the clock.
RESERVE_SHARE = 0.03
#: The least share of its budget a run should stop having spent (when its smallest round costs
#: less than the rest of the budget): a stall kept in hand is a guess at what has not happened,
#: so it gives way before a run would end short of this (``StopRules.reserve_usd``).
SPEND_FLOOR = 0.95


class StopRules:
    """The plan's stop conditions and the budget allocator, in one place.

    The budget is spent by one estimate, ``CostModel.estimate_round_usd`` (or
    ``estimate_first_round_usd`` before anything was measured): a round runs with the largest
    actor count the scaler wants that the estimate says the budget left can pay for, and the run
    stops for the budget only when not even ``actors.min`` actors fit. So a run ends having
    spent its budget down to less than one smallest round, not stranded by a second, more
    cautious rule.

    An estimate from measured durations can be beaten by a round that runs slower than any
    recent one (the machine got busy, a Lambda landed on a slow host). Each charged round's
    miss against the estimate its invocations started on is remembered (``note_charge``;
    overlapped invocations start a round or more ahead, on an older estimate): from then on
    the allocator keeps in hand, beside what it starts, a repeat of the worst miss seen, at
    most ``RESERVE_SHARE`` of the budget (``reserve_usd``). Far from the end this changes
    nothing; at the end it shrinks the last rounds a little earlier. Under a time model the
    estimate bounds the charge and the miss stays 1.

    The first stall cannot be learned from the rounds before it (hundreds of rounds within 3 %
    of their estimates, then one seven times over), so where the bill follows the clock the
    reserve is at least what the cost model says one stall adds to a round (``stall_usd``),
    as far as the run still spends ``SPEND_FLOOR`` of its budget.
    """

    def __init__(self, plan: dict[str, Any], state: RunState, cost: CostModel,
                 wall_s: Callable[[], float]):
        self.limits = plan["stop"]
        self.n_min: int = plan["actors"]["min"]
        self.n_max: int = plan["actors"]["max"]
        self.state = state
        self.cost = cost
        self.wall_s = wall_s
        #: The round whose invocations the allocator let start ahead of it (an overlapped
        #: fan-out, an async fleet): that round runs whatever the budget left now says.
        self.committed: int | None = None
        #: The estimates (by actor count) the allocator held after each recent round, kept only
        #: where invocations start ahead of their round (pipelined one round, an async fleet up
        #: to ``max_lag`` + 1) and so may have started on an older one; a sync round's started
        #: on the estimate still current when it is charged.
        ahead = {"sync": 0, "pipelined": 1}.get(plan["run"]["mode"],
                                                 int(plan["actors"]["max_lag"]) + 1)
        self._estimates: deque[list[float]] = deque(maxlen=ahead + 1 if ahead else 0)

    # -- the budget allocator -----------------------------------------------------------------

    def round_usd(self, actors: int) -> float:
        """The cost model's estimate of one round with ``actors`` actors."""
        history = self.state.history
        if not history:
            return max(0.0, float(self.cost.estimate_first_round_usd(actors) or 0.0))
        return max(0.0, float(self.cost.estimate_round_usd(history[-1], actors)))

    def reserve_usd(self, estimate_usd: float, actors: int = 1) -> float:
        """What to keep in hand beside ``estimate_usd`` of work started in rounds of up to
        ``actors`` actors: that work missing its estimate as badly as the worst round so far
        did, or one stall of such a round if that is more, at most ``RESERVE_SHARE`` of the
        budget (0 without a budget). The stall is kept only as far as the run would still
        stop having spent ``SPEND_FLOOR`` of its budget; a miss seen is kept whatever it costs."""
        budget = self.limits["budget_usd"]
        if budget is None:
            return 0.0
        repeat = (self.state.estimate_miss - 1.0) * estimate_usd
        stall = min(float(self.cost.stall_usd(max(1, actors)) or 0.0),
                    max(0.0, (1.0 - SPEND_FLOOR) * budget - estimate_usd))
        return min(max(repeat, stall), RESERVE_SHARE * budget)

    def fits(self, estimate_usd: float, pending_usd: float = 0.0, actors: int = 1) -> bool:
        """Whether the budget left pays for ``estimate_usd`` of work after ``pending_usd``
        started and not charged yet, with the reserve for both (True without a budget);
        ``actors``: the largest round any of it runs in."""
        left = self.budget_left()
        started = pending_usd + estimate_usd
        return left is None or started + self.reserve_usd(started, actors) <= left

    def remember_estimates(self) -> None:
        """Keep the estimate every round size has now that a round was charged: the next
        rounds' invocations start on it (``estimate_ran_on``)."""
        if self._estimates.maxlen and self.limits["budget_usd"] is not None:
            self._estimates.append([self.round_usd(n) for n in range(1, self.n_max + 1)])

    def estimate_ran_on(self, actors: int) -> float | None:
        """The lowest estimate of a round of ``actors`` that any of its invocations can have
        started on (None before a round was charged: round 1 is priced before anything was
        measured). Larger than ``actors.max`` (an async round settling stragglers): the
        largest count's, in proportion."""
        if not self.state.history:
            return None
        n = max(1, actors)
        return min([self.round_usd(n), *(table[n - 1] if n <= len(table)
                                          else table[-1] * n / len(table)
                                          for table in self._estimates)])

    def note_charge(self, estimate_usd: float | None, charged_usd: float) -> None:
        """Remember how far a round's charge went past the estimate it ran on (None: says
        nothing of the estimate)."""
        if estimate_usd is None or estimate_usd <= 0.0 or charged_usd <= estimate_usd:
            return
        miss = charged_usd / estimate_usd
        if miss > self.state.estimate_miss:
            log.info("round_cost_over_estimate", round=self.state.round + 1,
                     estimate_usd=estimate_usd, charged_usd=charged_usd, miss=round(miss, 3))
            self.state.estimate_miss = miss

    def budget_left(self, pending_usd: float = 0.0) -> float | None:
        """Dollars the budget leaves after what was charged and ``pending_usd`` of work done
        but not charged yet; None without a budget."""
        budget = self.limits["budget_usd"]
        return None if budget is None else budget - self.state.cost_usd - pending_usd

    def affordable(self, pending_usd: float = 0.0) -> int | None:
        """The largest actor count (at most ``actors.max``) whose round the budget left can pay
        for, after ``pending_usd`` of work done but not charged yet; 0 when not even one actor
        fits; None without a budget."""
        if self.limits["budget_usd"] is None:
            return None
        if not self.fits(self.round_usd(1), pending_usd):
            return 0
        lo, hi = 1, self.n_max  # the estimate grows with the actor count: bisect
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.fits(self.round_usd(mid), pending_usd, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def fleet_usd(self, invocations: int, per_round: int) -> float:
        """What ``invocations`` launched and not yet charged will cost by the end of the
        rounds that train on them, ``per_round`` to a round, each round priced as one of that
        many actors (its learner update included)."""
        full, rest = divmod(invocations, max(1, per_round))
        return full * self.round_usd(per_round) + (self.round_usd(rest) if rest else 0.0)

    def launchable(self, wanted: int, uncharged: int, per_round: int) -> int:
        """Async: how many of ``wanted`` more invocations may start while ``uncharged`` are
        launched and not yet charged. The fleet outlives its rounds, so the budget must pay
        for every invocation it holds, not only the coming round's."""
        n = max(0, wanted)
        while n > 0 and not self.fits(self.fleet_usd(uncharged + n, per_round),
                                      actors=per_round):
            n -= 1
        return n

    def sized(self, wanted: int, pending_usd: float = 0.0) -> int:
        """``wanted`` clipped to the plan's bounds and to what the budget can pay for (0: no
        round fits)."""
        n = max(self.n_min, min(self.n_max, wanted))
        cap = self.affordable(pending_usd)
        if cap is None:
            return n
        return min(n, cap) if cap >= self.n_min else 0

    # -- the stop rules -----------------------------------------------------------------------

    def before_round(self) -> str | None:
        """Why no round may start now, or None. Checked on entry too: a resumed run may be
        done already."""
        limits, s = self.limits, self.state
        if limits["max_rounds"] is not None and s.round >= limits["max_rounds"]:
            return "max_rounds"
        if limits["max_env_steps"] is not None and s.env_steps >= limits["max_env_steps"]:
            return "max_env_steps"
        if limits["max_wall_s"] is not None and self.wall_s() >= limits["max_wall_s"]:
            return "max_wall_s"
        if limits["budget_usd"] is not None and not self._paid_ahead() and \
                self.sized(s.actors_next) == 0:
            if s.round == 0:  # nothing to show for it: say why, with the figures
                log.warning("budget_too_small_for_one_round", budget_usd=limits["budget_usd"],
                            actors=self.n_min, round_usd_estimate=self.round_usd(self.n_min),
                            hint="raise stop.budget_usd or lower actors.min")
            return "budget"
        return None

    def _paid_ahead(self) -> bool:
        """Whether the coming round's fan-out already started with the allocator's consent.
        If so the round runs: its actors are billed whatever happens next (on AWS an
        invocation its caller gives up on runs on, and is billed here up to the function
        timeout), so refusing the round would spend more than running it and throw its
        samples away. Only a round charged above its estimate's margin in between can make
        the started one overspend, and then by that miss, not by the timeouts."""
        return self.committed == self.state.round + 1

    def after_round(self, record: RoundRecord) -> str | None:
        """Why the run ends with the round just finished, or None."""
        target = self.limits["target_return"]
        if target is not None and record.eval_return is not None and \
                record.eval_return >= target:
            return "target_return"
        if self.state.counters.empty_rounds >= EMPTY_ROUNDS_LIMIT:
            return "actors_failing"
        return None

    def fan_out_size(self, wanted: int, pending_env_steps: int, pending_usd: float,
                     rounds_pending: int = 1) -> int:
        """How many invocations a fan-out for the next round may start while
        ``rounds_pending`` rounds (the current one, or none once it finished) are not yet
        counted: their ``pending_env_steps`` untrained, their ``pending_usd`` uncharged
        (0: none).

        Overlapped rounds launch before the current update; without this look-ahead the last
        round would pay for invocations never trained on, and a budget would be overspent.
        Wall time and the target return cannot be foreseen: at most one fan-out is cancelled
        (and billed) when they end the run."""
        limits, s = self.limits, self.state
        if limits["max_rounds"] is not None and \
                s.round + rounds_pending >= limits["max_rounds"]:
            return 0
        if limits["max_env_steps"] is not None and \
                s.env_steps + pending_env_steps >= limits["max_env_steps"]:
            return 0
        size = self.sized(wanted, pending_usd)
        if size and limits["budget_usd"] is not None:
            self.committed = s.round + rounds_pending + 1
        return size


def summary_of(s: RunState, *, run_id: str, name: str, reason: str, wall_s: float,
               dropped_events: int, extra: dict[str, Any]) -> dict[str, Any]:
    """What ``summary.json`` says of a run: how it ended, what it trained and spent, and
    every counter, so a counter added to ``Counters`` is reported without a second list (the
    plugins' own in ``extra``)."""
    c = s.counters
    return {
        "run_id": run_id,
        "name": name,
        "stop_reason": reason,
        "rounds": s.round,
        "env_steps": s.env_steps,
        "best_eval_return": s.best_eval_return,
        "final_eval_return": s.final_eval_return,
        "wall_s": wall_s,
        "sim_time_s": s.sim_time_s,
        "cost_usd": s.cost_usd,
        "estimate_miss": s.estimate_miss,
        "actors_per_round": s.actors_per_round,
        **dataclasses.asdict(c),
        "trained_fraction": c.trained_fraction(),
        "dropped_events": dropped_events,
        **extra,
    }
