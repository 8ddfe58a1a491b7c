"""The ``prototype`` cost model: the paper's prototype's arithmetic, to set its numbers beside ours.

The prototype charged every round ``duration x ($3.06 + $0.68)/h`` (a p3.2xlarge learner and
its actors' share), in serverless and serverful runs alike, and ignored Lambda's GB-seconds and
requests. Its round duration left the Hessian probe out; ``charge_probe = true`` adds it.
Evaluation is never charged, as with the ``aws`` model. The estimate the budget allocator uses
is the same envelope of recent rounds' time as the ``aws`` model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernel.roles import PluginContext, Receipt, RoundRecord
from plugins.cost.aws import RoundTimes

#: The prototype's prices, $/h: its learner (p3.2xlarge, us-east-1) and its actors.
LEARNER_USD_PER_H = 3.06
ACTORS_USD_PER_H = 0.68


class PrototypeCost:
    def __init__(self, ctx: PluginContext):
        cfg = ctx.config
        self.learner_usd_per_h = float(cfg["learner_usd_per_h"])
        self.actors_usd_per_h = float(cfg["actors_usd_per_h"])
        self.charge_probe = bool(cfg["charge_probe"])
        self.margin = float(cfg["estimate_margin"])
        self.times = RoundTimes(int(cfg["estimate_rounds"]))
        self.stall_s = float(cfg["stall_s"])

    def duration_s(self, record: RoundRecord) -> float:
        """The round's charged duration: training time, the probe only when asked."""
        probe_s = max(0.0, record.probe_s - record.eval_s)
        seconds = record.sim_time_s if self.charge_probe else record.sim_time_s - probe_s
        return max(0.0, seconds)

    def charge(self, record: RoundRecord, receipts: Sequence[Receipt]) -> dict[str, float]:
        seconds = self.duration_s(record)
        self.times.add(record.actors, seconds)
        return {"learner_usd": seconds / 3600 * self.learner_usd_per_h,
                "actors_usd": seconds / 3600 * self.actors_usd_per_h}

    def estimate_actor_usd(self, record: RoundRecord | None) -> float | None:
        """Actors cost nothing of their own here: only the round's duration is billed."""
        return None

    def estimate_round_usd(self, record: RoundRecord, actors: int) -> float:
        times = self.times
        if not times.points:
            times = RoundTimes(1)
            times.add(record.actors, self.duration_s(record))
        per_s = (self.learner_usd_per_h + self.actors_usd_per_h) / 3600
        return self.margin * times.upper(actors) * per_s

    def estimate_first_round_usd(self, actors: int) -> float:
        return 0.0

    def stall_usd(self, actors: int) -> float:
        """What ``stall_s`` more of the clock adds to a round: every second is billed."""
        return self.stall_s * (self.learner_usd_per_h + self.actors_usd_per_h) / 3600

    def state(self) -> dict[str, Any]:
        return {"times": [list(p) for p in self.times.points]}

    def load_state(self, state: dict[str, Any]) -> None:
        for actors, seconds in state["times"]:
            self.times.add(int(actors), float(seconds))


def bill_of_rounds(sim_time_s: Sequence[float], probe_s: Sequence[float], *,
                   charge_probe: bool = False, learner_usd_per_h: float = LEARNER_USD_PER_H,
                   actors_usd_per_h: float = ACTORS_USD_PER_H) -> list[float]:
    """The running total this model would have charged a run billed by another one.

    ``sim_time_s`` is the run's cumulative simulated time after each round (what
    ``RoundFinished`` reports) and ``probe_s`` each round's seconds in probes other than the
    evaluation. When nothing in a run depends on its bill (no budget stops it, as in the
    paper's 50-round protocol), the training is the same under both models, so one run gives
    both bills and the protocol runs once instead of twice.
    """
    if len(sim_time_s) != len(probe_s):
        raise ValueError(f"{len(sim_time_s)} rounds of time but {len(probe_s)} of probes")
    per_s = (learner_usd_per_h + actors_usd_per_h) / 3600
    total, previous, out = 0.0, 0.0, []
    for cumulative, probe in zip(sim_time_s, probe_s, strict=True):
        seconds = cumulative - previous
        previous = cumulative
        total += max(0.0, seconds if charge_probe else seconds - probe) * per_s
        out.append(total)
    return out
