"""Scalers driven by the gradient noise scale (the ``gns`` probe): KungFu's adaptive batch,
a z-score jump rule, and the critical batch size priced in dollars."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kernel.roles import PluginContext, RoundRecord, ScaleContext
from plugins.descriptors.boost import CRITICAL_BATCH_CONFIG, GNS_SCALER_CONFIG, KUNGFU_CONFIG
from plugins.scalers.base import Scaler, finite, scaler_config


class KungfuScaler(Scaler):
    """KungFu's adaptive batch as the paper ran it: after round 1, N = ``base`` (N_min) and
    g_prev = GNS_1; whenever GNS_t > g_prev, N <- clip(N * GNS_t / g_prev, N_min, N_max) and
    g_prev <- GNS_t (the prototype never updated g_prev, so its N compounded on every round
    above GNS_1). N is kept unrounded between rounds and truncated when returned. A missing,
    non-finite or non-positive GNS holds N."""

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = scaler_config(ctx, KUNGFU_CONFIG)
        self.signal = str(cfg["signal"])
        self.base = cfg["base"]  # None: actors.min, read when the first round is decided
        self.n: float | None = None
        self.previous: float | None = None

    def choose(self, ctx: ScaleContext) -> int:
        gns = finite(ctx.history[-1].probes.get(self.signal)) if ctx.history else None
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


class GnsScaler(Scaler):
    """Boost to N_max when the noise scale's z-score against its recent history crosses
    ``threshold`` (a jump in gradient noise: bigger batches pay), else N_min."""

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = scaler_config(ctx, GNS_SCALER_CONFIG)
        self.window = int(cfg["window"])
        self.threshold = float(cfg["threshold"])
        self.min_history = int(cfg["min_history"])
        self.signal = str(cfg["signal"])

    def choose(self, ctx: ScaleContext) -> int:
        values = [finite(r.probes.get(self.signal)) for r in ctx.history]
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


#: Recent rounds whose charges split a round's price into its fixed and per-actor parts.
PRICE_ROUNDS = 32


class CriticalBatchScaler(Scaler):
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
        cfg = scaler_config(ctx, CRITICAL_BATCH_CONFIG)
        self.smoothing = float(cfg["smoothing"])
        self.ema_g2: float | None = None
        self.ema_trace: float | None = None

    def choose(self, ctx: ScaleContext) -> int:
        record = ctx.history[-1] if ctx.history else None
        if record is None or not record.batches:
            self.last_detail = {"skipped": 1.0}
            return ctx.current
        g2 = finite(record.probes.get("grad_norm_sq"))
        trace = finite(record.probes.get("trace_sigma"))
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
