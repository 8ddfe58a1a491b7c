"""A scaler driven by the return itself: more actors on a plateau, fewer while it climbs."""

from __future__ import annotations

import math

import numpy as np

from kernel.roles import PluginContext, RoundRecord, ScaleContext
from plugins.descriptors.boost import REWARD_SLOPE_CONFIG
from plugins.scalers.base import Scaler, finite, scaler_config


class RewardSlopeScaler(Scaler):
    """Add ``step`` actors while the eval return is flat over the window (more samples to get
    off a plateau), remove ``step`` while it climbs (progress is cheap); hold when it falls
    or while the window fills. The slope is a least-squares fit per round, relative to the
    window's mean magnitude (plus 1, so a return near 0 does not blow it up)."""

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = scaler_config(ctx, REWARD_SLOPE_CONFIG)
        self.window = int(cfg["window"])
        self.flat = float(cfg["flat_threshold"])
        self.step = int(cfg["step"])

    def choose(self, ctx: ScaleContext) -> int:
        points = [(r.round, reward_of(r)) for r in ctx.history]
        points = [(t, v) for t, v in points if v is not None][-self.window:]
        if len(points) < max(2, self.window):
            self.last_detail = {"slope": math.nan, "filled": float(len(points))}
            return ctx.current
        t = np.array([p[0] for p in points], dtype=np.float64)
        y = np.array([p[1] for p in points], dtype=np.float64)
        slope = float(np.polyfit(t, y, 1)[0])
        rel = slope / (float(np.abs(y).mean()) + 1.0)
        if abs(rel) <= self.flat:
            n = ctx.current + self.step
        elif rel > self.flat:
            n = ctx.current - self.step
        else:
            n = ctx.current
        self.last_detail = {"slope": slope, "rel_slope": rel}
        return n


def reward_of(record: RoundRecord) -> float | None:
    """The round's evaluation score when it has one, else its training episodes' mean."""
    if record.eval_return is not None:
        return finite(record.eval_return)
    return finite(record.episode_return_mean)
