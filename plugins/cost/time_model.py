"""Round durations as a function of the work done, for the simulated cloud's bill and clock.

Measured durations are the truth of one machine at one moment: on a shared 2-core machine a
neighbour's job makes every invocation and every update slower, so the same budget buys fewer
rounds, and two settings compared at equal budget are compared at unequal machine load. With
``cost.time_model = "model"`` the ``aws`` cost plugin bills and clocks each round from the work
it did instead: an invocation takes ``actor_ms + actor_ms_per_step x env_steps``, the update
``learner_s + learner_s_per_step x env steps trained``, and the Hessian probe
``probe_s + probe_s_per_sample_step x samples x Lanczos steps`` (the probe reports both). A
seeded sync run then costs the same on any machine under any load, and replays exactly.

The constants are a model, not a measurement of the cloud: fit them on a quiet machine (the
boosting study's are fitted from its own runs, see docs/boosting.md), or set them to what a
GPU learner is expected to take, and say which. What the model does not cover keeps its
measured time: failed and cancelled invocations, and probes other than the Hessian's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernel.roles import Receipt

#: Config keys of the model (``cost.model_*``), none of them optional when the model is on.
KEYS = ("model_actor_ms", "model_actor_ms_per_step", "model_learner_s",
        "model_learner_s_per_step", "model_probe_s", "model_probe_s_per_sample_step")


@dataclass(frozen=True)
class TimeModel:
    actor_ms: float
    actor_ms_per_step: float
    learner_s: float
    learner_s_per_step: float
    probe_s: float
    probe_s_per_sample_step: float

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> TimeModel | None:
        """The model the cost section asks for, or None for measured durations."""
        if cfg["time_model"] == "measured":
            return None
        missing = [k for k in KEYS if cfg[k] is None]
        if missing:
            raise ValueError(f"time_model = 'model' needs cost.{', cost.'.join(missing)}")
        return cls(**{k.removeprefix("model_"): float(cfg[k]) for k in KEYS})

    def invocation_ms(self, env_steps: int) -> float:
        return self.actor_ms + self.actor_ms_per_step * env_steps

    def receipts(self, receipts: Sequence[Receipt]) -> list[Receipt]:
        """The receipts with the modelled duration for each successful invocation."""
        out = []
        for r in receipts:
            if r.ok and not r.cancelled:
                ms = self.invocation_ms(r.env_steps)
                r = dataclasses.replace(r, duration_ms=ms, billed_ms=math.ceil(ms), init_ms=0.0)
            out.append(r)
        return out

    def update_s(self, env_steps: int) -> float:
        return self.learner_s + self.learner_s_per_step * env_steps

    def probe_time_s(self, probes: Mapping[str, float], measured_s: float) -> float:
        """The Hessian probe's modelled time when it ran this round, else what was measured."""
        steps, samples = probes.get("lanczos_steps"), probes.get("hessian_samples")
        if steps is None or samples is None:
            return measured_s
        return self.probe_s + self.probe_s_per_sample_step * samples * steps
