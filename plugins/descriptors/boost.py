"""Descriptors of the boosting plugins: scalers, the Hessian and noise-scale probes, AWS cost."""

from __future__ import annotations

from kernel.registry import Plugin
from kernel.schema import Field

AWS_COST_CONFIG = {
    "architecture": Field("str", "x86_64", "Lambda architecture.", choices=("x86_64", "arm64")),
    "gb_s_usd": Field("float", None, "Price per GB-second (default: us-east-1 list, read "
                      "2026-11: x86_64 0.0000166667, arm64 0.0000133334).", min=0),
    "request_usd": Field("float", 0.2e-6, "Price per request (us-east-1, 2026-11).", min=0),
    "learner_usd_per_hour": Field("float", 0.17, "Learner instance price per hour.", min=0),
    "memory_mb": Field("int", None, "Function memory (default: actors.memory_mb or 1769).",
                       min=128, max=10240),
    "actors_kind": Field("str", "lambda", "Bill actors as Lambda invocations or as VMs "
                         "(serverful baseline).", choices=("lambda", "vm")),
    "vm_usd_per_hour": Field("float", 0.34, "Price of one actor VM per hour.", min=0),
    "vm_startup_s": Field("float", 40.0, "Seconds a new VM takes to start (billed, and it "
                          "delays the round).", min=0),
    "actors_per_vm": Field("int", 4, "Actors one VM runs at once.", min=1),
    "estimate_margin": Field("float", 1.5, "Safety factor on a round's estimated cost (the "
                             "budget rule).", min=1),
    "estimate_rounds": Field("int", 5, "Recent rounds whose worst case the estimate takes.",
                             min=1),
}

#: Adaptive scalers widen an unset actors.max and add the probe they read (plugins/scalers.py).
ADAPTIVE = "plugins.scalers:validate_adaptive"

HESSIAN_CONFIG = {
    "samples": Field("int", 2048, "Batch samples the Hessian is taken on (0: all).", min=0),
    "max_steps": Field("int", 100, "Most Lanczos steps.", min=2, max=1000),
    "min_steps": Field("int", 8, "Fewest Lanczos steps before the convergence test.", min=1),
    "tol": Field("float", 1e-2, "Residual of both extreme Ritz pairs, relative to the largest "
                 "Ritz value, that stops Lanczos.", min=0, min_exclusive=True),
    "density": Field("bool", False, "Also report spectral-density summaries."),
}

GNS_CONFIG = {
    "samples": Field("int", 4096, "Batch samples used (0: all).", min=0),
    "slices": Field("int", 8, "Slices the batch is cut into (the small batch size).", min=2),
}

NITRO_CONFIG = {
    "window": Field("int", 6, "Values in the min-max window.", min=1),
    "decay": Field("float", 0.96, "Per-round decay of the signal and the floor.", min=0,
                   max=1, min_exclusive=True),
    "flat_score": Field("float", 1.0, "Score when the window has no spread (0/0).", min=0, max=1),
    "prototype_compat": Field("bool", False, "Reproduce the prototype's arithmetic."),
    "signal": Field("str", "hessian_ratio", "Probe value the score is built from."),
}

GNS_SCALER_CONFIG = {
    "window": Field("int", 10, "Past values the z-score is taken against.", min=2),
    "threshold": Field("float", 1.0, "z-score that boosts to actors.max."),
    "min_history": Field("int", 3, "Past values needed before boosting.", min=2),
    "signal": Field("str", "gns", "Probe value to watch."),
}

SCHEDULE_CONFIG = {
    "direction": Field("str", "ascend", "Ascend from actors.min or descend from actors.max.",
                       choices=("ascend", "descend")),
    "steps": Field("list[int]", [], "Counts, each held for `every` rounds (overrides step)."),
    "step": Field("int", 1, "Actors added or removed at each step.", min=0),
    "every": Field("int", 5, "Rounds per step.", min=1),
}

REWARD_SLOPE_CONFIG = {
    "window": Field("int", 5, "Rounds with a return in the slope fit.", min=2),
    "flat_threshold": Field("float", 0.01, "Relative slope per round counted as flat.", min=0),
    "step": Field("int", 1, "Actors added or removed per round.", min=1),
}

PLUGINS = [
    Plugin("fixed", "scaler", "plugins.scalers:FixedScaler",
           "Always scaler.count (default actors.count).",
           config={"count": Field("int", None, "Actors every round (default actors.count).",
                                  min=1)}),
    Plugin("min", "scaler", "plugins.scalers:MinScaler", "Always actors.min."),
    Plugin("max", "scaler", "plugins.scalers:MaxScaler", "Always actors.max."),
    Plugin("random", "scaler", "plugins.scalers:RandomScaler",
           "Uniform in [actors.min, actors.max], seeded; capped by the budget.",
           validator=ADAPTIVE),
    Plugin("nitro", "scaler", "plugins.scalers:NitroScaler",
           "The paper's Hessian-ratio boosting with a decaying floor and a budget cap.",
           config=NITRO_CONFIG, validator=ADAPTIVE),
    Plugin("gns", "scaler", "plugins.scalers:GnsScaler",
           "actors.max when the gradient noise scale jumps (z-score), else actors.min.",
           config=GNS_SCALER_CONFIG, validator=ADAPTIVE),
    Plugin("schedule", "scaler", "plugins.scalers:ScheduleScaler",
           "Ascending or descending step schedule.", config=SCHEDULE_CONFIG,
           validator=ADAPTIVE),
    Plugin("reward_slope", "scaler", "plugins.scalers:RewardSlopeScaler",
           "More actors while the return is flat, fewer while it climbs.", validator=ADAPTIVE,
           config=REWARD_SLOPE_CONFIG),
    Plugin("hessian", "probe", "plugins.probe_hessian:HessianProbe",
           "Extreme Hessian eigenvalues of the loss (Lanczos); reports hessian_ratio.",
           config=HESSIAN_CONFIG),
    Plugin("gns", "probe", "plugins.probe_gns:GnsProbe",
           "Gradient noise scale B_simple (McCandlish et al. 2018); reports gns.",
           config=GNS_CONFIG),
    Plugin("aws", "cost", "plugins.cost_aws:AwsCost",
           "AWS Lambda GB-s + requests (or actor VMs), learner instance per hour.",
           config=AWS_COST_CONFIG),
]
