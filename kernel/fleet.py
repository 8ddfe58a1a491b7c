"""The fleet of functions as the simulated cloud sees it: which of a round's functions start
cold, how many invocations async mode keeps out, and what of their sampling the simulated
clock may count as hidden behind training.

Async rounds (APPO, IMPALA) do not launch per round: an invocation is replaced when its batch is
read, so the fleet's size is a standing count, fitted to the learner's pace, and the clock
cannot tie a round's invocations to one update the way a pipelined fan-out is tied to one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kernel.roles import Receipt

#: Rounds without a stale drop after which a lowered fleet may grow by one again.
RECOVER_ROUNDS = 5


def cold_starts(warm_pool: int, receipts: Sequence[Receipt],
                actors: int) -> tuple[int, int]:
    """(functions started cold this round, the warm pool after it) in the simulated cloud.

    A platform keeps a function warm after it ran, so only functions beyond the most that were
    ever busy at once start cold. A round keeps at most its actor count busy at once: an async
    round may settle more invocations than that, but one whose batch was read is followed by
    the next in the same, warm, function. A round with no successful invocation leaves the
    pool as it was. The clock (the actors backend) and the bill (the cost model) both read the
    count this returns, through the round's record."""
    if not any(r.ok for r in receipts):
        return 0, warm_pool
    busy = min(len(receipts), actors)
    return max(0, busy - warm_pool), max(warm_pool, busy)


def async_head_start(out_at_update: set[str] | None, receipts: list[Receipt]) -> float | None:
    """Async: the head start of a round's sampling over the previous update
    (``RoundRecord.head_start``). A fleet's invocations are not launched per round, so the
    credit is the whole update (1.0) only when every invocation the round charges was already
    out (``out_at_update``) as that update began: each sampled while the update and its probes
    ran. One launched later (a fleet grown after the update, a failed call relaunched) might not
    have, so the round gets no credit. Invocations launched rounds earlier sampled longer in the
    background still and are credited as if launched then: the clock stays an upper bound."""
    if out_at_update is None or any(r.request_id not in out_at_update for r in receipts):
        return None
    return 1.0


class FleetSize:
    """How many invocations async mode keeps outstanding.

    A learner that trains on ``B`` batches per round, busy for ``busy_s`` of it, keeps up with
    invocations that take ``invocation_s`` when ``B * ceil(invocation_s / busy_s)`` are
    outstanding: those launched as one round's batches are read come back by the next round
    (or the one after, and so on, for invocations longer than a round). More only wait in the
    queue, growing older by one version per round, until ``max_lag`` drops them: a batch read
    in order waits about size / B rounds, so the size never exceeds ``B * max_lag`` (with
    invocations longer than ``max_lag`` rounds the learner waits for batches rather than drop
    them). Timings drift and the queue's order is not the launch order, so a round with stale
    drops also lowers a ceiling on the size, which rises by one after ``RECOVER_ROUNDS`` clean
    rounds.
    """

    def __init__(self, n_min: int, target: int, max_lag: int, batches_per_round: int):
        self.n_min = n_min
        self.max_lag = max(1, max_lag)
        #: Before anything is measured: the target, within the lag bound.
        self.value = max(n_min, min(target, max(1, batches_per_round) * self.max_lag))
        self.ceiling: int | None = None
        self._clean_rounds = 0

    def update(self, *, target: int, batches_per_round: int, invocation_s: float | None,
               busy_s: float | None, stale: int) -> int:
        """The size after a round with these measurements (None: not measured)."""
        per_round = max(1, batches_per_round)
        needed = self.value
        if invocation_s is not None and busy_s is not None and busy_s > 0:
            needed = per_round * max(1, math.ceil(invocation_s / busy_s))
        needed = min(needed, per_round * self.max_lag)
        if stale > 0:
            self.ceiling = max(self.n_min, min(self.value, needed) - 1)
            self._clean_rounds = 0
        elif self.ceiling is not None:
            self._clean_rounds += 1
            if self._clean_rounds >= RECOVER_ROUNDS:
                self._clean_rounds = 0
                self.ceiling += 1
                if self.ceiling >= target:
                    self.ceiling = None
        if self.ceiling is not None:
            needed = min(needed, self.ceiling)
        self.value = max(self.n_min, min(target, needed))
        return self.value
