"""Scalers: how many actors the next round gets."""

from __future__ import annotations

from kernel.roles import PluginContext, ScaleContext


class FixedScaler:
    """Always ``actors.count`` (the paper's fixed baseline)."""

    def __init__(self, ctx: PluginContext):
        self.count = int(ctx.plan["actors"]["count"])
        self.last_detail: dict[str, float] = {}

    def decide(self, ctx: ScaleContext) -> int:
        return self.count
