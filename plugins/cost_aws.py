"""The ``aws`` cost model: what a round would cost on AWS Lambda and a learner instance.

Lambda bills GB-seconds (memory in GB times duration rounded up to 1 ms) plus a per-request
price; the learner instance bills its wall time (probe time included — the prototype left that
out). Defaults are us-east-1 list prices, read on the date in ``prices_read``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kernel.roles import PluginContext, Receipt, RoundRecord

PRICES_READ = "2026-11"
GB_S_USD = {"x86_64": 0.0000166667, "arm64": 0.0000133334}
REQUEST_USD = 0.20 / 1_000_000


class AwsCost:
    def __init__(self, ctx: PluginContext):
        cfg = ctx.config
        self.arch = cfg.get("architecture", "x86_64")
        self.gb_s_usd = float(cfg.get("gb_s_usd") or GB_S_USD[self.arch])
        self.request_usd = float(cfg.get("request_usd", REQUEST_USD))
        self.learner_usd_per_hour = float(cfg.get("learner_usd_per_hour", 0.17))
        actors = ctx.plan["actors"]
        self.memory_gb = float(cfg.get("memory_mb") or actors.get("memory_mb") or 1769) / 1024

    def actor_usd(self, duration_ms: float) -> float:
        billed = math.ceil(duration_ms)  # Lambda bills in 1 ms increments, rounded up
        return billed / 1000 * self.memory_gb * self.gb_s_usd + self.request_usd

    def charge(self, record: RoundRecord, receipts: Sequence[Receipt]) -> dict[str, float]:
        actors = sum(self.actor_usd(r.duration_ms) for r in receipts if r.ok)
        failed = sum(self.request_usd for r in receipts if not r.ok)
        learner = record.sim_time_s / 3600 * self.learner_usd_per_hour
        return {"actors_usd": actors + failed, "learner_usd": learner}

    def estimate_actor_usd(self, record: RoundRecord | None) -> float | None:
        if record is None or not record.actor_durations_ms:
            return None
        return self.actor_usd(sum(record.actor_durations_ms) / len(record.actor_durations_ms))

    def estimate_round_usd(self, record: RoundRecord, actors: int) -> float:
        per_actor = self.estimate_actor_usd(record) or 0.0
        learner = record.sim_time_s / 3600 * self.learner_usd_per_hour
        return per_actor * actors + learner
