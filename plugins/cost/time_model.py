"""Round durations as a function of the work done, for the simulated cloud's bill and clock.

Measured durations are the truth of one machine at one moment: on a shared 2-core machine a
neighbour's job makes every invocation and every update slower, so the same budget buys fewer
rounds, and two settings compared at equal budget are compared at unequal machine load. With
``cost.time_model = "model"`` the ``aws`` cost plugin bills and clocks each round from the work
it did instead: an invocation takes ``actor_ms + actor_ms_per_step x env_steps``, the update
``learner_s + learner_s_per_step x env steps trained``, and the Hessian probe
``probe_s + probe_s_per_sample_step x samples x Lanczos steps`` (the probe reports both), and
the gradient-noise-scale probe, when ``gns_s`` and ``gns_s_per_sample`` are given,
``gns_s + gns_s_per_sample x samples``. A seeded sync run then costs the same on any machine
under any load, and replays exactly.

The constants are a model, not a measurement of the cloud: fit them on a quiet machine (the
boosting study's are fitted from its own runs, see docs/boosting.md), or set them to what a
GPU learner is expected to take, and say which. What the model does not cover keeps its
measured time: failed and cancelled invocations, probes it does not know (a plugin's own),
and the gns probe when its two constants are not set (plans written before it was modelled
replay as they ran).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernel.roles import ProbeRun, Receipt

#: Config keys of the model (``cost.model_*``), none of them optional when the model is on.
KEYS = ("model_actor_ms", "model_actor_ms_per_step", "model_learner_s",
        "model_learner_s_per_step", "model_probe_s", "model_probe_s_per_sample_step")
#: The gns probe's keys: both or neither (then that probe keeps its measured time).
GNS_KEYS = ("model_gns_s", "model_gns_s_per_sample")


@dataclass(frozen=True)
class TimeModel:
    actor_ms: float
    actor_ms_per_step: float
    learner_s: float
    learner_s_per_step: float
    probe_s: float
    probe_s_per_sample_step: float
    gns_s: float | None = None
    gns_s_per_sample: float | None = None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> TimeModel | None:
        """The model the cost section asks for, or None for measured durations."""
        if cfg["time_model"] == "measured":
            return None
        missing = [k for k in KEYS if cfg[k] is None]
        if missing:
            raise ValueError(f"time_model = 'model' needs cost.{', cost.'.join(missing)}")
        gns = [k for k in GNS_KEYS if cfg[k] is not None]
        if gns and len(gns) < len(GNS_KEYS):
            lacking = next(k for k in GNS_KEYS if k not in gns)
            raise ValueError(f"cost.{gns[0]} is set but cost.{lacking} is not: the gns "
                             "probe's time model needs both (or neither, to bill it as measured)")
        return cls(**{k.removeprefix("model_"): float(cfg[k]) for k in (*KEYS, *gns)})

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

    def hessian_s(self, samples: float, steps: float) -> float:
        return self.probe_s + self.probe_s_per_sample_step * samples * steps

    @property
    def models_gns(self) -> bool:
        return self.gns_s is not None and self.gns_s_per_sample is not None

    def gns_probe_s(self, samples: float) -> float:
        assert self.gns_s is not None and self.gns_s_per_sample is not None
        return self.gns_s + self.gns_s_per_sample * samples

    def charge_probes(self, runs: Sequence[ProbeRun]) -> float:
        """The round's charged probe time, each run's share recorded in its ``charged_s`` (what
        a probe's ``max_share`` reads): each probe the model knows at its modelled time
        (recognised by the work it reports), any other at its measured time, evaluation left
        out (it is not charged)."""
        for run in runs:
            run.charged_s = 0.0 if run.evaluation else self.one_probe_s(run)
        return sum(run.charged_s for run in runs)

    def one_probe_s(self, run: ProbeRun) -> float:
        v = run.values
        if "lanczos_steps" in v and "hessian_samples" in v:
            return self.hessian_s(v["hessian_samples"], v["lanczos_steps"])
        if "gns_samples" in v and self.models_gns:
            return self.gns_probe_s(v["gns_samples"])
        return run.seconds
