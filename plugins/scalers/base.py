"""What every scaler shares: the clip to [actors.min, actors.max] and to the budget, and how a
scaler reads its plan section and its probe values."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kernel.roles import PluginContext, RoundRecord, ScaleContext
from kernel.schema import Field, defaults
from plugins.scalers.validation import SIGNAL_PROBE


def budget_cap(ctx: ScaleContext) -> int | None:
    """Most actors the budget left can pay for next round, or None when there is no limit.

    The kernel's budget allocator computes it from the cost model's one round estimate (so the
    scalers and the stop rule never disagree) and applies it after ``decide`` in any case; the
    adaptive scalers clip to it as well so their ``wanted`` and ``budget_cap`` details show it.
    """
    return ctx.affordable


def finite(value: Any) -> float | None:
    """A probe value as a float, or None when it is missing, not a number or not finite."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def scaler_config(ctx: PluginContext, fields: Mapping[str, Field]) -> dict[str, Any]:
    """The scaler's section with every default its descriptor declares: a plan's section is
    complete already, a hand-made one (tests, embedding) is completed from the same fields."""
    return {**defaults(fields), **ctx.config}


def this_round(ctx: ScaleContext) -> RoundRecord | None:
    """The record of the round the decision follows, or None when the scaler is asked ahead
    of it (an overlapped round still training): the history then ends with the round before,
    whose measurements were read already and must not be read twice."""
    if ctx.history and ctx.history[-1].round == ctx.round:
        return ctx.history[-1]
    return None


def probe_read(signal: str) -> frozenset[str] | None:
    """The probe that reports ``signal`` as a ``reads_probes`` value: a scaler that keeps N in a
    round without its signal reads that probe alone; None for a signal whose probe is unknown
    (a plugin's), so every decision waits for its round."""
    probe = SIGNAL_PROBE.get(signal)
    return None if probe is None else frozenset({probe})


class Scaler:
    """Shared shell: clip to [n_min, n_max], then to the budget cap when ``cap`` is on.

    ``adaptive`` says whether the choice reads the round's measurements: one that does not
    can be asked ahead, while an overlapped round is still being measured. One that reads only
    certain probes names them (``reads_probes``) and is asked ahead in rounds they skip; it
    reads its round through ``this_round``, which is None when asked ahead."""

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
