"""Scalers: how many actors the next round gets. Formulas and choices: ``docs/scalers.md``.

Every scaler reads only the ``ScaleContext`` (the history of ``RoundRecord``s, the budget left,
the measured cost of one actor, a seeded generator) and leaves what it based its choice on in
``last_detail`` (published in ``ScaleDecided.detail``). The adaptive ones also cap the count
at what the budget left can pay for; ``fixed``, ``min`` and ``max`` stay what they say and let
the engine's budget rule stop the run instead.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from kernel.roles import PluginContext, RoundRecord, ScaleContext
from kernel.schema import Field, defaults
from plugins.descriptors.boost import (
    DECAY_ONLY_CONFIG,
    FIXED_CONFIG,
    GNS_SCALER_CONFIG,
    HYDROZOA_CONFIG,
    KUNGFU_CONFIG,
    NITRO_CONFIG,
    NO_BOOST_CONFIG,
    REWARD_SLOPE_CONFIG,
    SCHEDULE_CONFIG,
)


def budget_cap(ctx: ScaleContext) -> int | None:
    """Most actors the budget left can pay for next round, or None when there is no limit.

    The kernel's budget allocator computes it from the cost model's one round estimate (so the
    scalers and the stop rule never disagree) and applies it after ``decide`` in any case; the
    adaptive scalers clip to it as well so their ``wanted`` and ``budget_cap`` details show it.
    """
    return ctx.affordable


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _config(ctx: PluginContext, fields: Mapping[str, Field]) -> dict[str, Any]:
    """The scaler's section with every default its descriptor declares: a plan's section is
    complete already, a hand-made one (tests, embedding) is completed from the same fields."""
    return {**defaults(fields), **ctx.config}


class _Scaler:
    """Shared shell: clip to [n_min, n_max], then to the budget cap when ``cap`` is on.

    ``adaptive`` says whether the choice reads the round's measurements: one that does not
    can be asked ahead, while an overlapped round is still being measured."""

    cap_to_budget = True
    adaptive = True

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
    adaptive = False

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        # Unset (None) is the declared default: the plan's start count.
        self.count = int(_config(ctx, FIXED_CONFIG)["count"] or ctx.plan["actors"]["count"])

    def choose(self, ctx: ScaleContext) -> int:
        self.last_detail = {}
        return self.count


class MinScaler(_Scaler):
    cap_to_budget = False
    adaptive = False

    def choose(self, ctx: ScaleContext) -> int:
        self.last_detail = {}
        return ctx.n_min


class MaxScaler(_Scaler):
    cap_to_budget = False
    adaptive = False

    def choose(self, ctx: ScaleContext) -> int:
        self.last_detail = {}
        return ctx.n_max


class RandomScaler(_Scaler):
    """Uniform on [n_min, n_max] from the run's seeded generator."""

    adaptive = False

    def choose(self, ctx: ScaleContext) -> int:
        self.last_detail = {}
        return int(ctx.rng.integers(ctx.n_min, ctx.n_max + 1))


class NitroScaler(_Scaler):
    """Boost when the loss looks convex: rho high against its recent past.

    The default, ``rule = "anchored"`` (``anchored_step``), boosts around a fixed count: the
    equal-budget studies found the best fixed N hard to beat and the window rule's N jumping
    between the ends of its range on a noisy rho, so this rule keeps the fan-out at ``base`` on
    average and moves it, by at most a factor ``gain`` either way, by how far log rho sits from
    its own moving average in moving standard deviations.

    ``rule = "window"``, the paper's rule with its bugs fixed: x_t = rho_t * decay^t enters a
    window of ``window`` values; score = (x_t - min) / (max - min); N = ceil(clip(N_max *
    score, floor_t, N_max)) with floor_t = max(N_max * decay^t, N_min); a window without spread
    (0/0) scores ``flat_score``. ``prototype_compat`` runs the paper's prototype rule exactly
    instead (``prototype_step``). Under every rule a missing or non-finite rho keeps N.
    """

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = _config(ctx, NITRO_CONFIG)
        self.window: deque[float] = deque(maxlen=int(cfg["window"]))
        self.decay = float(cfg["decay"])
        self.flat_score = float(cfg["flat_score"])
        self.prototype_compat = bool(cfg["prototype_compat"])
        self.signal = str(cfg["signal"])
        self.rule = str(cfg["rule"])
        self.base = int(cfg["base"] or ctx.plan["actors"]["count"])
        self.gain = float(cfg["gain"])
        self.min_history = int(cfg["min_history"])
        # anchored: moving mean and variance of log rho, and how many values they hold
        self.mean, self.var, self.seen = 0.0, 0.0, 0

    def choose(self, ctx: ScaleContext) -> int:
        t = ctx.round
        rho = self.rho(ctx.history[-1]) if ctx.history else None
        anchored = self.rule == "anchored" and not self.prototype_compat
        if rho is None or (anchored and rho <= 0):
            # No usable measurement this round: keep N rather than react to a missing value.
            self.last_detail = {"skipped": 1.0, "window": float(len(self.window))}
            return ctx.current
        if self.prototype_compat:
            return self.prototype_step(rho, t, ctx.n_min, ctx.n_max)
        if anchored:
            return self.anchored_step(rho)
        decayed = rho * self.decay ** t
        self.window.append(decayed)
        floor_t = max(ctx.n_max * self.decay ** t, float(ctx.n_min))
        score = self.score(decayed)
        raw = min(max(ctx.n_max * score, floor_t), float(ctx.n_max))
        self.last_detail = {"rho": rho, "value": decayed, "score": score, "floor": floor_t,
                            "raw": raw, "skipped": 0.0, "window": float(len(self.window))}
        return math.ceil(raw - 1e-9)

    def rho(self, record: RoundRecord) -> float | None:
        """This round's signal; the prototype's own ratio in prototype mode."""
        if not self.prototype_compat or self.signal != DEFAULT_SIGNAL["nitro"]:
            return _finite(record.probes.get(self.signal))
        return prototype_rho(record.probes)

    def score(self, value: float) -> float:
        """Min-max position of ``value`` in the window, ``flat_score`` when it has no spread."""
        lo, hi = min(self.window), max(self.window)
        if hi - lo <= 1e-12 * max(abs(hi), abs(lo), 1e-30):
            return self.flat_score  # 0/0: one value, or all equal; see docs/scalers.md
        score = (value - lo) / (hi - lo)
        if not math.isfinite(score):  # a spread too wide for floats (inf / inf)
            return self.flat_score
        return min(1.0, max(0.0, score))

    def prototype_step(self, rho: float, t: int, n_min: int, n_max: int) -> int:
        """The prototype's rule, in its order: the decayed value enters the window and is
        scored against it, then the raw rho enters too; the floor decays with t squared; the
        count is truncated, not rounded up."""
        decayed = rho * self.decay ** t
        self.window.append(decayed)
        score = 1.0 if len(self.window) == 1 else self.score(decayed)
        floor_t = min(max(n_max * self.decay ** (t * t), float(n_min)), float(n_max))
        raw = min(max(n_max * score, floor_t), float(n_max))
        self.window.append(rho)
        self.last_detail = {"rho": rho, "value": decayed, "score": score, "floor": floor_t,
                            "raw": raw, "skipped": 0.0, "window": float(len(self.window))}
        return int(raw)

    def anchored_step(self, rho: float) -> int:
        """N = base * gain^clip(z, -1, 1), z = (log rho - m) / s against the moving mean m and
        standard deviation s of the earlier values (exponential, horizon ``window``).

        Logs, because rho spans orders of magnitude over a run and its noise is multiplicative;
        a standardised score, because a min-max window ranks the newest value against
        extremes that one outlier sets; the clip and the anchor, because the studies' best
        fixed N was within a factor 2 of every other good fixed N, so a boost need not reach
        further to help and cannot cost more than that when the signal misleads. The value is
        scored before it enters the moving statistics, so a round is judged against its past.
        """
        x = math.log(rho)
        if self.seen >= self.min_history:
            z = (x - self.mean) / max(math.sqrt(self.var), 1e-6)
            score = min(1.0, max(-1.0, z))
        else:
            z, score = 0.0, 0.0
        alpha = 2.0 / (self.window.maxlen + 1)  # an EMA whose centre of mass is window/2 back
        if self.seen == 0:
            self.mean, self.var = x, 0.0
        else:
            delta = x - self.mean
            self.mean += alpha * delta
            self.var = (1 - alpha) * (self.var + alpha * delta * delta)
        self.seen += 1
        raw = self.base * self.gain ** score
        self.last_detail = {"rho": rho, "z": z, "score": score, "raw": raw, "skipped": 0.0,
                            "mean_log_rho": self.mean, "sd_log_rho": math.sqrt(self.var)}
        return max(1, round(raw))

    def state(self) -> dict[str, Any]:
        return {"window": list(self.window), "mean": self.mean, "var": self.var,
                "seen": self.seen}

    def load_state(self, state: dict[str, Any]) -> None:
        self.window.extend(float(v) for v in state["window"])
        # checkpoints from before the anchored rule hold only the window
        self.mean = float(state.get("mean", 0.0))
        self.var = float(state.get("var", 0.0))
        self.seen = int(state.get("seen", 0))


def prototype_rho(probes: dict[str, float]) -> float | None:
    """rho = -(theta_max + 0.01) / (theta_min - 0.01), as the probe reports it
    (``hessian_ratio_prototype``) or from its extreme eigenvalues."""
    reported = _finite(probes.get("hessian_ratio_prototype"))
    if reported is not None:
        return reported
    lam_max, lam_min = _finite(probes.get("lambda_max")), _finite(probes.get("lambda_min"))
    if lam_max is None or lam_min is None or lam_min - 0.01 == 0:
        return None
    return _finite(-(lam_max + 0.01) / (lam_min - 0.01))


class PrototypeScaler(NitroScaler):
    """``nitro`` with ``prototype_compat = true``: the paper's prototype rule by its own name."""

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        self.prototype_compat = True


class DecayOnlyScaler(_Scaler):
    """The nitro rule's floor and decay with no curvature: what the Hessian adds is nitro minus
    this. N = ceil(max(N_max * decay^t, N_min)); with ``prototype_compat``, the prototype's
    floor int(clip(N_max * decay^(t^2), N_min, N_max))."""

    adaptive = False

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = _config(ctx, DECAY_ONLY_CONFIG)
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


class NoBoostScaler(_Scaler):
    """The paper's no-boost baseline: the nitro score is computed from the probe every round
    (so probes run and are billed as in a boosted run) but N stays ``count``."""

    cap_to_budget = False

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = _config(ctx, NO_BOOST_CONFIG)
        self.count = int(cfg["count"] or ctx.plan["actors"]["count"])
        # the scorer sees no_boost's own defaults (the paper's window rule), not nitro's
        self.rule = NitroScaler(dataclasses.replace(ctx, config=cfg))

    def choose(self, ctx: ScaleContext) -> int:
        would = self.rule.choose(ctx)
        self.last_detail = {**self.rule.last_detail, "would_boost_to": float(would)}
        return self.count

    def state(self) -> dict[str, Any]:
        return self.rule.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.rule.load_state(state)


class KungfuScaler(_Scaler):
    """KungFu's adaptive batch as the paper ran it: after round 1, N = ``base`` (N_min) and
    g_prev = GNS_1; whenever GNS_t > g_prev, N <- clip(N * GNS_t / g_prev, N_min, N_max) and
    g_prev <- GNS_t (the prototype never updated g_prev, so its N compounded on every round
    above GNS_1). N is kept unrounded between rounds and truncated when returned. A missing,
    non-finite or non-positive GNS holds N."""

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = _config(ctx, KUNGFU_CONFIG)
        self.signal = str(cfg["signal"])
        self.base = cfg["base"]  # None: actors.min, read when the first round is decided
        self.n: float | None = None
        self.previous: float | None = None

    def choose(self, ctx: ScaleContext) -> int:
        gns = _finite(ctx.history[-1].probes.get(self.signal)) if ctx.history else None
        if self.n is None:
            self.n = float(self.base or ctx.n_min)
        if gns is None or gns <= 0:
            self.last_detail = {"skipped": 1.0, "n": self.n}
            return int(self.n)
        if self.previous is None:
            self.previous = gns
        elif gns > self.previous:
            self.n = min(max(self.n * gns / self.previous, float(ctx.n_min)), float(ctx.n_max))
            self.previous = gns
        self.last_detail = {"gns": gns, "previous": self.previous, "n": self.n, "skipped": 0.0}
        return int(self.n)

    def state(self) -> dict[str, Any]:
        return {"n": self.n, "previous": self.previous}

    def load_state(self, state: dict[str, Any]) -> None:
        self.n, self.previous = state["n"], state["previous"]


class HydrozoaScaler(_Scaler):
    """Hydrozoa's schedule as the paper ran it: ``base`` (N_min) actors doubled every ``every``
    rounds. Round r runs base * 2^((r - 1) // every), capped at N_max; round 1 runs the plan's
    count."""

    adaptive = False

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = _config(ctx, HYDROZOA_CONFIG)
        self.base = cfg["base"]  # None: actors.min, read when the first round is decided
        self.every = int(cfg["every"])

    def choose(self, ctx: ScaleContext) -> int:
        step = ctx.round // self.every  # the next round is ctx.round + 1
        base = int(self.base or ctx.n_min)
        self.last_detail = {"step": float(step)}
        return min(base * 2 ** min(step, 30), ctx.n_max)


#: Recent rounds whose charges split a round's price into its fixed and per-actor parts.
PRICE_ROUNDS = 32


class CriticalBatchScaler(_Scaler):
    """The round size that buys progress cheapest, from the gradient noise and the prices.

    McCandlish et al. (2018) found that the optimiser steps S and samples E needed to reach a
    given loss trade off as (S / S_min - 1)(E / E_min - 1) = 1, with B_noise = E_min / S_min the
    gradient noise scale tr(Sigma) / |G|^2. A round is one step; if a round costs a fixed
    ``c_round`` (learner start-up, probes, the request floor) plus ``c_sample`` per sample, the
    dollars to reach that loss with rounds of B samples are

        C(B) = S_min (c_round + c_sample B_noise) + S_min (c_round B_noise / B + c_sample B),

    which is least at B* = sqrt(B_noise c_round / c_sample). So the next round gets
    N = B* / (samples per actor) actors. The noise scale comes from the ``gns`` probe, each of
    its two parts smoothed on its own (a ratio of noisy estimates is biased, so it is taken
    of the averages); both prices from what recent rounds of different sizes were charged
    (``prices``: one exploratory round of another size when all had the same), so the rule
    boosts where samples are cheap against rounds (a GPU learner, a slow start-up) and when the
    gradient grows noisy (late in training, or on hard batches), and stays small where updates
    are what pays. A round without a usable measurement keeps N.
    """

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = ctx.config
        self.smoothing = float(cfg["smoothing"])
        self.ema_g2: float | None = None
        self.ema_trace: float | None = None

    def choose(self, ctx: ScaleContext) -> int:
        record = ctx.history[-1] if ctx.history else None
        if record is None or not record.batches:
            self.last_detail = {"skipped": 1.0}
            return ctx.current
        g2 = _finite(record.probes.get("grad_norm_sq"))
        trace = _finite(record.probes.get("trace_sigma"))
        if g2 is not None and trace is not None:
            a = self.smoothing
            self.ema_g2 = g2 if self.ema_g2 is None else a * self.ema_g2 + (1 - a) * g2
            self.ema_trace = trace if self.ema_trace is None else \
                a * self.ema_trace + (1 - a) * trace
        if self.ema_g2 is None or self.ema_trace is None or self.ema_g2 <= 0:
            self.last_detail = {"skipped": 1.0}
            return ctx.current
        b_noise = max(self.ema_trace, 0.0) / self.ema_g2
        prices = self.prices(ctx.history)
        if prices is None:
            # A round's price splits into its fixed and per-actor parts only across rounds
            # of different sizes: one round one actor larger (or smaller) tells them apart.
            self.last_detail = {"b_noise": b_noise, "exploring": 1.0, "skipped": 0.0}
            return ctx.current + 1 if ctx.current < ctx.n_max else ctx.current - 1
        c_round, c_actor = prices
        per_actor_samples = record.env_steps / record.batches
        c_sample = c_actor / per_actor_samples
        b_star = math.sqrt(b_noise * c_round / c_sample)
        self.last_detail = {"b_noise": b_noise, "b_star": b_star, "c_round_usd": c_round,
                            "c_sample_usd": c_sample, "exploring": 0.0, "skipped": 0.0}
        return max(1, round(b_star / per_actor_samples))

    def prices(self, history: list[RoundRecord]) -> tuple[float, float] | None:
        """(c_round, c_actor): the fixed and per-actor parts of what recent rounds were
        charged, by least squares over their sizes; None until two sizes were seen. A central
        split, not the budget's upper envelope (which, while N has not varied, grows in
        proportion to N and would read the fixed part as nothing)."""
        recent = [r for r in history[-PRICE_ROUNDS:] if r.batches and r.cost_usd > 0]
        sizes = np.array([r.actors for r in recent], dtype=np.float64)
        if len(recent) < 2 or np.ptp(sizes) == 0:
            return None
        costs = np.array([r.cost_usd for r in recent], dtype=np.float64)
        c_actor, c_round = np.polyfit(sizes, costs, 1)
        floor = 1e-3 * float(costs.mean())  # a fit through noise must not zero either part
        return max(float(c_round), floor), max(float(c_actor), floor)

    def state(self) -> dict[str, Any]:
        return {"ema_g2": self.ema_g2, "ema_trace": self.ema_trace}

    def load_state(self, state: dict[str, Any]) -> None:
        self.ema_g2, self.ema_trace = state.get("ema_g2"), state.get("ema_trace")


class GnsScaler(_Scaler):
    """Boost to N_max when the noise scale's z-score against its recent history crosses
    ``threshold`` (a jump in gradient noise: bigger batches pay), else N_min."""

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = _config(ctx, GNS_SCALER_CONFIG)
        self.window = int(cfg["window"])
        self.threshold = float(cfg["threshold"])
        self.min_history = int(cfg["min_history"])
        self.signal = str(cfg["signal"])

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

    adaptive = False

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = _config(ctx, SCHEDULE_CONFIG)
        self.direction = str(cfg["direction"])
        self.steps = [int(s) for s in cfg["steps"]]
        self.step = int(cfg["step"])
        self.every = int(cfg["every"])

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
        cfg = _config(ctx, REWARD_SLOPE_CONFIG)
        self.window = int(cfg["window"])
        self.flat = float(cfg["flat_threshold"])
        self.step = int(cfg["step"])

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

#: The probe value each measuring scaler reads by default (its descriptor's ``signal``;
#: critical_batch has no such key and always reads the gns probe's parts), and the probe
#: that reports it.
DEFAULT_SIGNAL = {"nitro": NITRO_CONFIG["signal"].default,
                  "prototype": NITRO_CONFIG["signal"].default,
                  "no_boost": NO_BOOST_CONFIG["signal"].default,
                  "gns": GNS_SCALER_CONFIG["signal"].default,
                  "kungfu": KUNGFU_CONFIG["signal"].default, "critical_batch": "gns"}
SIGNAL_PROBE = {"hessian_ratio": "hessian", "gns": "gns"}


def validate_adaptive(section: dict[str, Any], plan: dict[str, Any]) -> None:
    """Plan-time defaults for scalers that change N: with actors.max unset they would be pinned
    to the start count, so they get ADAPTIVE_MAX_FACTOR x count; and the probe they read is
    added (``validate_probe``)."""
    actors = plan["actors"]
    if actors["max"] is None:
        actors["max"] = max(actors["min"], ADAPTIVE_MAX_FACTOR * actors["count"])
    validate_probe(section, plan)


def validate_probe(section: dict[str, Any], plan: dict[str, Any]) -> None:
    """Add the probe a scaler reads (nitro, prototype, no_boost: hessian; gns, kungfu: gns) with
    its defaults when the plan has none and the scaler reads its default signal."""
    default = DEFAULT_SIGNAL.get(section["name"])
    signal = section.get("signal")
    if default is None or (signal is not None and signal != default):
        return
    probe = SIGNAL_PROBE[default]
    if not any(item["name"] == probe for item in plan["probes"]):
        from kernel.plan import PROBE_ITEM
        from kernel.registry import default_registry
        from kernel.schema import validate_table

        fields = {**PROBE_ITEM, **default_registry().get("probe", probe).config}
        item: dict[str, Any] = {"name": probe}
        if (section["name"] == "nitro" and section.get("rule") == "anchored"
                and not section.get("prototype_compat")):
            item["every"] = ANCHORED_PROBE_EVERY
        plan["probes"].insert(0, validate_table(f"probes[{probe}]", item, fields))


#: The anchored rule holds N between measurements, so the Hessian it adds to a plan measures
#: every 4th round: in the equal-budget studies probing every round cost 4-15 % of a run's
#: dollars, and the window rule did better measured every 4th round in all four of them.
ANCHORED_PROBE_EVERY = 4
