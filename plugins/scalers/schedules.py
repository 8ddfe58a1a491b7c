"""Scalers that read no measurement: a count fixed, at an end of the range, random, or on a
schedule of rounds (the paper's Hydrozoa baseline, and nitro's decay without the curvature).
Each is ``adaptive = False``, so an overlapped round may ask it ahead of the measurements."""

from __future__ import annotations

import math

from kernel.roles import PluginContext, ScaleContext
from plugins.descriptors.boost import (
    DECAY_ONLY_CONFIG,
    FIXED_CONFIG,
    HYDROZOA_CONFIG,
    SCHEDULE_CONFIG,
)
from plugins.scalers.base import Scaler, scaler_config


class FixedScaler(Scaler):
    """Always ``scaler.count``, default ``actors.count`` (the paper's fixed baseline)."""

    cap_to_budget = False
    adaptive = False

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        # Unset (None) is the declared default: the plan's start count.
        self.count = int(scaler_config(ctx, FIXED_CONFIG)["count"] or ctx.plan["actors"]["count"])

    def choose(self, ctx: ScaleContext) -> int:
        self.last_detail = {}
        return self.count


class MinScaler(Scaler):
    cap_to_budget = False
    adaptive = False

    def choose(self, ctx: ScaleContext) -> int:
        self.last_detail = {}
        return ctx.n_min


class MaxScaler(Scaler):
    cap_to_budget = False
    adaptive = False

    def choose(self, ctx: ScaleContext) -> int:
        self.last_detail = {}
        return ctx.n_max


class RandomScaler(Scaler):
    """Uniform on [n_min, n_max] from the run's seeded generator."""

    adaptive = False

    def choose(self, ctx: ScaleContext) -> int:
        self.last_detail = {}
        return int(ctx.rng.integers(ctx.n_min, ctx.n_max + 1))


class ScheduleScaler(Scaler):
    """Step schedule. ``steps`` (a list of counts, each held ``every`` rounds, the last one
    kept), or ``step`` actors more (ascend, from N_min) or fewer (descend, from N_max) every
    ``every`` rounds. With ``at`` the steps change with the share of the budget spent instead:
    a budgeted run's rounds have no known count, its dollars do, so a schedule meant to follow
    what each fixed count does best at a given spend is written in dollars."""

    adaptive = False

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = scaler_config(ctx, SCHEDULE_CONFIG)
        self.direction = str(cfg["direction"])
        self.steps = [int(s) for s in cfg["steps"]]
        self.step = int(cfg["step"])
        self.every = int(cfg["every"])
        self.at = [float(x) for x in cfg["at"]]
        self.budget = ctx.plan["stop"]["budget_usd"] if self.at else None

    def choose(self, ctx: ScaleContext) -> int:
        if self.at:
            return self._by_spend(ctx)
        index = ctx.round // self.every  # round ctx.round + 1 is the next one
        if self.steps:
            ordered = sorted(self.steps, reverse=self.direction == "descend")
            n = ordered[min(index, len(ordered) - 1)]
        elif self.direction == "ascend":
            n = ctx.n_min + index * self.step
        else:
            n = ctx.n_max - index * self.step
        self.last_detail = {"index": float(index)}
        return n

    def _by_spend(self, ctx: ScaleContext) -> int:
        """The count whose share of the budget the run is in, read from what it has left
        (the plan validator made sure there is a budget)."""
        left = ctx.budget_left_usd
        spent = 0.0 if left is None or not self.budget else 1.0 - left / float(self.budget)
        index = sum(spent >= x for x in self.at)
        self.last_detail = {"index": float(index), "spent_share": spent}
        return self.steps[index]


class HydrozoaScaler(Scaler):
    """Hydrozoa's schedule as the paper ran it: ``base`` (N_min) actors doubled every ``every``
    rounds. Round r runs base * 2^((r - 1) // every), capped at N_max; round 1 runs the plan's
    count."""

    adaptive = False

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = scaler_config(ctx, HYDROZOA_CONFIG)
        self.base = cfg["base"]  # None: actors.min, read when the first round is decided
        self.every = int(cfg["every"])

    def choose(self, ctx: ScaleContext) -> int:
        step = ctx.round // self.every  # the next round is ctx.round + 1
        base = int(self.base or ctx.n_min)
        self.last_detail = {"step": float(step)}
        return min(base * 2 ** min(step, 30), ctx.n_max)


class DecayOnlyScaler(Scaler):
    """The nitro rule's floor and decay with no curvature: what the Hessian adds is nitro minus
    this. N = ceil(max(N_max * decay^t, N_min)); with ``prototype_compat``, the prototype's
    floor int(clip(N_max * decay^(t^2), N_min, N_max))."""

    adaptive = False

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = scaler_config(ctx, DECAY_ONLY_CONFIG)
        self.decay = float(cfg["decay"])
        self.prototype_compat = bool(cfg["prototype_compat"])

    def choose(self, ctx: ScaleContext) -> int:
        t = ctx.round
        if self.prototype_compat:
            floor_t = min(max(ctx.n_max * self.decay ** (t * t), float(ctx.n_min)),
                          float(ctx.n_max))
            n = int(floor_t)
        else:
            floor_t = max(ctx.n_max * self.decay ** t, float(ctx.n_min))
            n = math.ceil(floor_t - 1e-9)
        self.last_detail = {"floor": floor_t}
        return n
