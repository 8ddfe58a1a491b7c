"""Scalers driven by the gradient noise scale (the ``gns`` probe): KungFu's adaptive batch,
a z-score jump rule, the critical batch size priced in dollars, and a band around the plan's
count that grows with the noise scale."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kernel.roles import PluginContext, RoundRecord, ScaleContext
from plugins.descriptors.boost import (
    CRITICAL_BATCH_CONFIG,
    GNS_SCALER_CONFIG,
    GROW_CONFIG,
    KUNGFU_CONFIG,
)
from plugins.scalers.base import Scaler, finite, probe_read, scaler_config, this_round


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

    @property
    def reads_probes(self) -> frozenset[str] | None:
        return probe_read(self.signal)

    def choose(self, ctx: ScaleContext) -> int:
        record = this_round(ctx)
        gns = finite(record.probes.get(self.signal)) if record is not None else None
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

    @property
    def reads_probes(self) -> frozenset[str] | None:
        return probe_read(self.signal)

    def choose(self, ctx: ScaleContext) -> int:
        values = [finite(r.probes.get(self.signal)) for r in ctx.history]
        current = values[-1] if this_round(ctx) is not None else None
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
        self.noise = SmoothedNoiseScale(float(cfg["smoothing"]))

    def choose(self, ctx: ScaleContext) -> int:
        record = ctx.history[-1] if ctx.history else None
        if record is None or not record.batches:
            self.last_detail = {"skipped": 1.0}
            return ctx.current
        self.noise.update(record)
        b_noise = self.noise.value()
        if b_noise is None:
            self.last_detail = {"skipped": 1.0}
            return ctx.current
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
        return self.noise.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.noise.load_state(state)


class SmoothedNoiseScale:
    """B_noise = tr(Sigma) / |G|^2 from exponential averages of its two parts, each smoothed
    on its own: a ratio of two noisy estimates is biased and swings with its denominator, so
    the ratio is taken of the averages. A round without both parts leaves them as they were."""

    def __init__(self, smoothing: float):
        self.smoothing = smoothing
        self.ema_g2: float | None = None
        self.ema_trace: float | None = None

    def update(self, record: RoundRecord) -> bool:
        """Fold in ``record``'s measurement; whether it had one."""
        g2 = finite(record.probes.get("grad_norm_sq"))
        trace = finite(record.probes.get("trace_sigma"))
        if g2 is None or trace is None:
            return False
        a = self.smoothing
        self.ema_g2 = g2 if self.ema_g2 is None else a * self.ema_g2 + (1 - a) * g2
        self.ema_trace = trace if self.ema_trace is None else \
            a * self.ema_trace + (1 - a) * trace
        return True

    def value(self) -> float | None:
        """The smoothed noise scale in samples (0 when tr(Sigma)'s estimate is negative, as it
        can be where the noise is small), or None before a usable measurement."""
        if self.ema_g2 is None or self.ema_trace is None or self.ema_g2 <= 0:
            return None
        return max(self.ema_trace, 0.0) / self.ema_g2

    def state(self) -> dict[str, Any]:
        return {"ema_g2": self.ema_g2, "ema_trace": self.ema_trace}

    def load_state(self, state: dict[str, Any]) -> None:
        self.ema_g2, self.ema_trace = state.get("ema_g2"), state.get("ema_trace")


class GrowScaler(Scaler):
    """Small rounds early, big ones late, paced by the gradient noise scale.

    N_{t+1} = clip(lo * (B_t / B_ref)^exponent, lo, hi) with lo = base / gain and hi = base x
    gain, B_t the smoothed noise scale (``SmoothedNoiseScale``) and B_ref its value once
    ``warmup`` rounds were measured (lo until then).

    Why grow: branching runs into a small and a big round at the same parameters found the big
    round's advantage rising as training goes on (and with the noise scale's trend), while a
    decaying schedule puts its big rounds where they help least. Why the noise scale and not
    the round: it is how far the learning has come, on a task's own clock, with no horizon
    to guess. Why a power of the ratio: with a fixed price per round and per sample, the
    round that buys progress cheapest is sqrt(B_noise c_round / c_sample) samples (McCandlish
    et al. 2018; ``CriticalBatchScaler`` prices it absolutely), so two rounds' best sizes stand
    in a power of their noise scales' ratio whatever the prices. Why a band around the plan's
    count rather than that formula: it rests on prices split from noisy round charges and on
    SGD's trade-off, which PPO's epochs only approximate, while the studies' best fixed N was
    within a factor 2 of every other good one. Why 0.2 and not the formula's 0.5: the noise
    scale grew some 300-fold over a budgeted Hopper run and over 1,000-fold on Humanoid, so
    the square root crossed the band in the first 17 rounds (Humanoid, measured) and the rule
    became a fixed ``hi``; 300^0.2 = 3 and 1,000^0.2 = 4 = gain^2 cross it over the run. A
    missing or unusable measurement keeps N.

    Measured at equal budget it did not pay: below the best fixed N on Hopper, Walker2d and
    Humanoid (docs/boosting.md, study 13), nor with the clip range following its rounds
    (study 17), so it is a baseline to compare, not the default.
    """

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = scaler_config(ctx, GROW_CONFIG)
        base = float(cfg["base"] or ctx.plan["actors"]["count"])
        gain = float(cfg["gain"])
        self.lo, self.hi = max(1.0, base / gain), base * gain
        self.exponent = float(cfg["exponent"])
        self.warmup = int(cfg["warmup"])
        self.noise = SmoothedNoiseScale(float(cfg["smoothing"]))
        self.measured = 0
        self.reference: float | None = None

    #: The gns probe alone: a round without it keeps N.
    reads_probes = frozenset({"gns"})

    def choose(self, ctx: ScaleContext) -> int:
        record = this_round(ctx)
        if record is None or not self.noise.update(record):
            self.last_detail = {"skipped": 1.0}
            return ctx.current
        self.measured += 1
        b_noise = self.noise.value()
        if b_noise is None or b_noise <= 0:
            self.last_detail = {"skipped": 1.0}
            return ctx.current
        if self.reference is None:
            if self.measured < self.warmup:
                self.last_detail = {"b_noise": b_noise, "warmup": 1.0, "skipped": 0.0}
                return round(self.lo)
            self.reference = b_noise
        raw = self.lo * (b_noise / self.reference) ** self.exponent
        raw = min(max(raw, self.lo), self.hi)
        self.last_detail = {"b_noise": b_noise, "b_ref": self.reference, "raw": raw,
                            "warmup": 0.0, "skipped": 0.0}
        return max(1, round(raw))

    def state(self) -> dict[str, Any]:
        return {**self.noise.state(), "measured": self.measured, "reference": self.reference}

    def load_state(self, state: dict[str, Any]) -> None:
        self.noise.load_state(state)
        self.measured = int(state["measured"])
        self.reference = state["reference"]
