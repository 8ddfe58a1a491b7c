"""Scalers driven by the Hessian probe's curvature ratio rho: nitro (the anchored rule by
default, the paper's window rule fixed, or the prototype's rule exactly) and the paper's
no-boost baseline, which computes the same score and keeps N."""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import Any

from kernel.roles import PluginContext, RoundRecord, ScaleContext
from plugins.descriptors.boost import NITRO_CONFIG, NO_BOOST_CONFIG
from plugins.scalers.base import Scaler, finite, probe_read, scaler_config, this_round


class NitroScaler(Scaler):
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
        cfg = scaler_config(ctx, NITRO_CONFIG)
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

    @property
    def reads_probes(self) -> frozenset[str] | None:
        """The Hessian probe alone, when the signal is its ratio: in a round it skips, N is
        kept, so a pipelined run may launch that round's successor ahead (None for a signal
        of another probe's, which may run in any round)."""
        return probe_read(self.signal)

    def choose(self, ctx: ScaleContext) -> int:
        t = ctx.round
        record = this_round(ctx)
        rho = self.rho(record) if record is not None else None
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
        if not self.prototype_compat or self.signal != NITRO_CONFIG["signal"].default:
            return finite(record.probes.get(self.signal))
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
    reported = finite(probes.get("hessian_ratio_prototype"))
    if reported is not None:
        return reported
    lam_max, lam_min = finite(probes.get("lambda_max")), finite(probes.get("lambda_min"))
    if lam_max is None or lam_min is None or lam_min - 0.01 == 0:
        return None
    return finite(-(lam_max + 0.01) / (lam_min - 0.01))


class PrototypeScaler(NitroScaler):
    """``nitro`` with ``prototype_compat = true``: the paper's prototype rule by its own name."""

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        self.prototype_compat = True


class NoBoostScaler(Scaler):
    """The paper's no-boost baseline: the nitro score is computed from the probe every round
    (so probes run and are billed as in a boosted run) but N stays ``count``."""

    cap_to_budget = False

    def __init__(self, ctx: PluginContext):
        super().__init__(ctx)
        cfg = scaler_config(ctx, NO_BOOST_CONFIG)
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
