"""Scalers: how many actors the next round gets. Formulas and choices: ``docs/scalers.md``.

Every scaler reads only the ``ScaleContext`` (the history of ``RoundRecord``s, the budget left,
the measured cost of one actor, a seeded generator) and leaves what it based its choice on in
``last_detail`` (published in ``ScaleDecided.detail``). The adaptive ones also cap the count
at what the budget left can pay for; ``fixed``, ``min`` and ``max`` stay what they say and let
the engine's budget rule stop the run instead.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from kernel.roles import PluginContext, RoundRecord, ScaleContext


def budget_cap(ctx: ScaleContext) -> int | None:
    """Most actors the budget left can pay for next round, or None when there is no limit.

    The round's fixed part (learner and probe time) is taken from the last round's bill less
    its actors, so the cap leaves room for it.
    """
    per_actor = ctx.cost_per_actor_usd
    if ctx.budget_left_usd is None or per_actor is None or not per_actor > 0:
        return None
    fixed = 0.0
    if ctx.history:
        last = ctx.history[-1]
        fixed = max(0.0, last.cost_usd - last.actors * per_actor)
    return max(0, math.floor((ctx.budget_left_usd - fixed) / per_actor))


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class _Scaler:
    """Shared shell: clip to [n_min, n_max], then to the budget cap when ``cap`` is on."""

    cap_to_budget = True

    def __init__(self, ctx: PluginContext):
        self.last_detail: dict[str, float] = {}

    def decide(self, ctx: ScaleContext) -> int:
        wanted = int(self.choose(ctx))
        n = max(ctx.n_min, min(ctx.n_max, wanted))
        if self.cap_to_budget:
            cap = budget_cap(ctx)
            if cap is not None:
                self.last_detail["budget_cap"] = float(cap)
                n = max(ctx.n_min, min(n, cap))
        self.last_detail["wanted"] = float(wanted)
        return n

    def choose(self, ctx: ScaleContext) -> int:
        raise NotImplementedError


class FixedScaler(_Scaler):
    """Always ``scaler.count``, default ``actors.count`` (the paper's fixed baseline)."""

    cap_to_budget = False

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        self.count = int(ctx.config.get("count") or ctx.plan["actors"]["count"])

    def choose(self, ctx: ScaleContext) -> int:
        self.last_detail = {}
        return self.count


class MinScaler(_Scaler):
    cap_to_budget = False

    def choose(self, ctx: ScaleContext) -> int:
        self.last_detail = {}
        return ctx.n_min


class MaxScaler(_Scaler):
    cap_to_budget = False

    def choose(self, ctx: ScaleContext) -> int:
        self.last_detail = {}
        return ctx.n_max


class RandomScaler(_Scaler):
    """Uniform on [n_min, n_max] from the run's seeded generator."""

    def choose(self, ctx: ScaleContext) -> int:
        self.last_detail = {}
        return int(ctx.rng.integers(ctx.n_min, ctx.n_max + 1))


class NitroScaler(_Scaler):
    """The paper's scaler: boost when the loss looks convex (rho high in its recent window).

    x_t = rho_t * decay^t enters a window of ``window`` values; score = (x_t - min) / (max -
    min); N = clip(N_max * score, floor_t, N_max) with floor_t = max(N_max * decay^t, N_min);
    then the budget cap. ``prototype_compat`` reproduces the prototype: raw rho in the window,
    the current decayed value normalised against it (clipped to [0, 1]), and the decay applied
    twice in the floor (N_max * decay^(2t)).
    """

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = ctx.config
        self.window: deque[float] = deque(maxlen=int(cfg.get("window", 6)))
        self.decay = float(cfg.get("decay", 0.96))
        self.flat_score = float(cfg.get("flat_score", 1.0))
        self.prototype_compat = bool(cfg.get("prototype_compat", False))
        self.signal = str(cfg.get("signal", "hessian_ratio"))

    def choose(self, ctx: ScaleContext) -> int:
        t = ctx.round
        rho = _finite(ctx.history[-1].probes.get(self.signal)) if ctx.history else None
        if rho is None:
            # No usable measurement this round: keep N rather than react to a missing value.
            self.last_detail = {"skipped": 1.0, "window": float(len(self.window))}
            return ctx.current
        decayed = rho * self.decay ** t
        if self.prototype_compat:
            self.window.append(rho)
            floor_t = ctx.n_max * self.decay ** (2 * t)
        else:
            self.window.append(decayed)
            floor_t = ctx.n_max * self.decay ** t
        floor_t = max(floor_t, float(ctx.n_min))
        lo, hi = min(self.window), max(self.window)
        if hi - lo <= 1e-12 * max(abs(hi), abs(lo), 1e-30):
            score = self.flat_score  # 0/0: one value, or all equal; see docs/scalers.md
        else:
            score = min(1.0, max(0.0, (decayed - lo) / (hi - lo)))
        raw = min(max(ctx.n_max * score, floor_t), float(ctx.n_max))
        self.last_detail = {"rho": rho, "value": decayed, "score": score, "floor": floor_t,
                            "raw": raw, "skipped": 0.0, "window": float(len(self.window))}
        return math.ceil(raw - 1e-9)


class GnsScaler(_Scaler):
    """Boost to N_max when the noise scale's z-score against its recent history crosses
    ``threshold`` (a jump in gradient noise: bigger batches pay), else N_min."""

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = ctx.config
        self.window = int(cfg.get("window", 10))
        self.threshold = float(cfg.get("threshold", 1.0))
        self.min_history = int(cfg.get("min_history", 3))
        self.signal = str(cfg.get("signal", "gns"))

    def choose(self, ctx: ScaleContext) -> int:
        values = [_finite(r.probes.get(self.signal)) for r in ctx.history]
        current = values[-1] if values else None
        if current is None:
            self.last_detail = {"skipped": 1.0}
            return ctx.current
        past = [v for v in values[:-1] if v is not None][-self.window:]
        if len(past) < self.min_history:
            self.last_detail = {"gns": current, "z": 0.0, "skipped": 0.0}
            return ctx.n_min
        mean, std = float(np.mean(past)), float(np.std(past))
        if std <= 1e-12 * max(abs(mean), 1e-30):
            # A constant history: any change at all is a jump (0/0 only when equal).
            z = 0.0 if current == mean else math.copysign(math.inf, current - mean)
        else:
            z = (current - mean) / std
        self.last_detail = {"gns": current, "z": z, "skipped": 0.0}
        return ctx.n_max if z >= self.threshold else ctx.n_min


class ScheduleScaler(_Scaler):
    """Step schedule. ``steps`` (a list of counts, each held ``every`` rounds, the last one
    kept), or ``step`` actors more (ascend, from N_min) or fewer (descend, from N_max) every
    ``every`` rounds."""

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = ctx.config
        self.direction = str(cfg.get("direction", "ascend"))
        self.steps = [int(s) for s in (cfg.get("steps") or [])]
        self.step = int(cfg.get("step", 1))
        self.every = int(cfg.get("every", 5))

    def choose(self, ctx: ScaleContext) -> int:
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


class RewardSlopeScaler(_Scaler):
    """Add ``step`` actors while the eval return is flat over the window (more samples to get
    off a plateau), remove ``step`` while it climbs (progress is cheap); hold when it falls
    or while the window fills. The slope is a least-squares fit per round, relative to the
    window's mean magnitude (plus 1, so a return near 0 does not blow it up)."""

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = ctx.config
        self.window = int(cfg.get("window", 5))
        self.flat = float(cfg.get("flat_threshold", 0.01))
        self.step = int(cfg.get("step", 1))

    def choose(self, ctx: ScaleContext) -> int:
        points = [(r.round, _reward(r)) for r in ctx.history]
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


def _reward(record: RoundRecord) -> float | None:
    if record.eval_return is not None:
        return _finite(record.eval_return)
    return _finite(record.episode_return_mean)


#: When a plan leaves actors.max unset, an adaptive scaler gets room to boost.
ADAPTIVE_MAX_FACTOR = 8


def validate_adaptive(section: dict[str, Any], plan: dict[str, Any]) -> None:
    """Plan-time defaults for scalers that change N: with actors.max unset they would be pinned
    to the start count, so they get ADAPTIVE_MAX_FACTOR x count; and the probe a scaler reads
    (nitro: hessian, gns: gns) is added with its defaults when the plan has none."""
    actors = plan["actors"]
    if actors["max"] is None:
        actors["max"] = max(actors["min"], ADAPTIVE_MAX_FACTOR * actors["count"])
    probe = {"nitro": "hessian", "gns": "gns"}.get(section["name"])
    signal = section.get("signal")
    if probe is None or (signal is not None and signal != _DEFAULT_SIGNAL[section["name"]]):
        return
    if not any(item["name"] == probe for item in plan["probes"]):
        from kernel.plan import PROBE_ITEM
        from kernel.registry import default_registry
        from kernel.schema import validate_table

        fields = {**PROBE_ITEM, **default_registry().get("probe", probe).config}
        plan["probes"].insert(0, validate_table(f"probes[{probe}]", {"name": probe}, fields))


_DEFAULT_SIGNAL = {"nitro": "hessian_ratio", "gns": "gns"}
