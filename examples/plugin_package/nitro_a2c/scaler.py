"""The ``warmup`` scaler: boost at the start, when the policy changes fastest, then settle."""

from __future__ import annotations

from kernel.roles import PluginContext, ScaleContext


class WarmupScaler:
    def __init__(self, ctx: PluginContext):
        self.warmup_rounds = int(ctx.config.get("warmup_rounds", 10))
        self.count = int(ctx.plan["actors"]["count"])
        #: Published in ScaleDecided.detail; ``score`` is what reports plot as the boost score.
        self.last_detail: dict[str, float] = {}

    def decide(self, ctx: ScaleContext) -> int:
        boosting = ctx.round < self.warmup_rounds
        self.last_detail = {"score": 1.0 if boosting else 0.0}
        return ctx.n_max if boosting else self.count  # the kernel clips to [n_min, n_max]
