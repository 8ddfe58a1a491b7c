"""The ``aws`` cost model: what a round would cost on AWS Lambda (or VMs) and a learner instance.

Lambda bills GB-seconds (memory in GB times duration rounded up to 1 ms) plus a per-request
price, and in simulate mode the init phase of each simulated cold start; the learner instance
bills the round's (simulated) wall time, probe time included (the prototype left that out). ``actors_kind = "vm"`` prices the serverful baseline instead: VMs of
``actors_per_vm`` actors billed per hour for the round, plus a start-up delay whenever the VM
count grows. Defaults are us-east-1 list prices, read on the date in ``PRICES_READ``.

Estimates (for the budget rule and the scalers' cap) are deliberately pessimistic: the slowest
actor of the last few rounds billed for every actor, the longest round time of the last few
rounds with its learner time grown with the batch, a cold start when the count exceeds any
seen so far, all times ``estimate_margin``. A round that costs more than its
estimate can still overrun the budget; the margin makes that unlikely, not impossible.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from kernel.roles import PluginContext, Receipt, RoundRecord

#: When the default prices below were read from aws.amazon.com/lambda/pricing (us-east-1).
PRICES_READ = "2026-11"
GB_S_USD = {"x86_64": 0.0000166667, "arm64": 0.0000133334}
REQUEST_USD = 0.20 / 1_000_000


class AwsCost:
    def __init__(self, ctx: PluginContext):
        cfg = ctx.config
        actors = ctx.plan["actors"]
        self.arch = cfg.get("architecture", "x86_64")
        self.gb_s_usd = float(cfg.get("gb_s_usd") or GB_S_USD[self.arch])
        self.request_usd = float(cfg.get("request_usd", REQUEST_USD))
        self.learner_usd_per_hour = float(cfg.get("learner_usd_per_hour", 0.17))
        self.memory_gb = float(cfg.get("memory_mb") or actors.get("memory_mb") or 1769) / 1024
        self.kind = str(cfg.get("actors_kind", "lambda"))
        self.vm_usd_per_hour = float(cfg.get("vm_usd_per_hour", 0.34))
        self.vm_startup_s = float(cfg.get("vm_startup_s", 40.0))
        self.actors_per_vm = int(cfg.get("actors_per_vm", 4))
        self.margin = float(cfg.get("estimate_margin", 1.5))
        self.cold_start_s = float(actors.get("sim_cold_start_s") or 0.0)
        #: Simulated cloud: Lambda bills the init phase of a cold start, so the simulated cold
        #: starts (actors beyond the warm pool, as ``LocalBackend.simulated_actor_s`` counts
        #: them) are billed too.
        self.bill_sim_cold = bool(actors.get("simulate", False))
        self.sim_warm_pool = 0
        self.vms = 0  # VMs running after the last round (serverful baseline)
        self.max_actors = 0
        #: (sim_time_s without VM start-up, learner_s per actor, actors, slowest actor ms) of
        #: recent rounds: one fast round must not make the next estimate optimistic.
        self.recent: deque[tuple[float, float, int, float]] = deque(maxlen=int(
            cfg.get("estimate_rounds", 5)))

    # -- prices -------------------------------------------------------------------------------

    def actor_usd(self, duration_ms: float) -> float:
        """One Lambda invocation: GB-s of the duration rounded up to 1 ms, plus the request."""
        billed_ms = math.ceil(duration_ms)
        return billed_ms / 1000 * self.memory_gb * self.gb_s_usd + self.request_usd

    def learner_usd(self, seconds: float) -> float:
        return seconds / 3600 * self.learner_usd_per_hour

    def vms_for(self, actors: int) -> int:
        return math.ceil(actors / self.actors_per_vm)

    # -- the CostModel role -------------------------------------------------------------------

    def charge(self, record: RoundRecord, receipts: Sequence[Receipt]) -> dict[str, float]:
        self.max_actors = max(self.max_actors, record.actors)
        self.recent.append(_footprint(record))
        if self.kind == "vm":
            vms = self.vms_for(record.actors)
            started = max(0, vms - self.vms)
            self.vms = vms
            vm_s = vms * record.sim_time_s + started * self.vm_startup_s
            if started:
                # The round's actors cannot start before their VM: the start-up delays the
                # round as much as it costs (the coordinator adds sim_time_s after charging).
                record.sim_time_s += self.vm_startup_s
            return {"actors_usd": vm_s / 3600 * self.vm_usd_per_hour,
                    "learner_usd": self.learner_usd(record.sim_time_s)}
        actors = sum(self.actor_usd(r.duration_ms) for r in receipts if r.ok)
        failed = sum(self.request_usd for r in receipts if not r.ok)
        items = {"actors_usd": actors + failed, "learner_usd": self.learner_usd(record.sim_time_s)}
        if self.bill_sim_cold and any(r.ok for r in receipts):
            cold = max(0, len(receipts) - self.sim_warm_pool)
            self.sim_warm_pool = max(self.sim_warm_pool, len(receipts))
            items["cold_start_usd"] = cold * self.init_usd()
        return items

    def init_usd(self) -> float:
        """The billed init phase of one simulated cold start (no request price of its own)."""
        return math.ceil(self.cold_start_s * 1000) / 1000 * self.memory_gb * self.gb_s_usd

    def estimate_actor_usd(self, record: RoundRecord | None) -> float | None:
        """Measured cost of one more actor in a round like ``record`` (mean duration)."""
        if record is None or not record.actor_durations_ms:
            return None
        if self.kind == "vm":
            return record.sim_time_s / self.actors_per_vm / 3600 * self.vm_usd_per_hour
        mean_ms = sum(record.actor_durations_ms) / len(record.actor_durations_ms)
        return self.actor_usd(mean_ms)

    def estimate_round_usd(self, record: RoundRecord, actors: int) -> float:
        """Pessimistic cost of a round like the recent ones (``record`` the last) with
        ``actors`` actors."""
        recent = list(self.recent) or [_footprint(record)]
        # Learner time grows with the batch (N x envs x steps); the actors' time does not.
        sim_s = max(t + per_actor * max(0, actors - n) for t, per_actor, n, _ in recent)
        slowest_ms = max(ms for *_, ms in recent)
        if actors > self.max_actors:
            sim_s += self.cold_start_s
        if self.kind == "vm":
            vms = self.vms_for(actors)
            started = max(0, vms - self.vms)
            vm_s = vms * sim_s + started * self.vm_startup_s
            sim_s += self.vm_startup_s if started else 0.0
            actors_usd = vm_s / 3600 * self.vm_usd_per_hour
        else:
            actors_usd = actors * self.actor_usd(slowest_ms)
            if self.bill_sim_cold:
                actors_usd += max(0, actors - self.sim_warm_pool) * self.init_usd()
        return self.margin * (actors_usd + self.learner_usd(sim_s))


def _footprint(record: RoundRecord) -> tuple[float, float, int, float]:
    return (record.sim_time_s, record.learner_s / max(1, record.actors), record.actors,
            max(record.actor_durations_ms, default=0.0))
