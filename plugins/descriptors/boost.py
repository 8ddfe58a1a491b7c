"""Descriptors of the boosting plugins: scalers, the Hessian and noise-scale probes, AWS cost."""

from __future__ import annotations

from kernel.registry import Plugin
from kernel.schema import Field

AWS_COST_CONFIG = {
    "architecture": Field("str", "x86_64", "Lambda architecture.", choices=("x86_64", "arm64")),
    "gb_s_usd": Field("float", None, "Price per GB-second (default: us-east-1 list, read "
                      "2026-11: x86_64 0.0000166667, arm64 0.0000133334).", min=0),
    "request_usd": Field("float", 0.2e-6, "Price per request (us-east-1, 2026-11).", min=0),
    "learner": Field("str", None, "Learner instance price: 'cpu' (c7i.large, $0.08925/h; "
                     "the default), 'gpu' (p3.2xlarge, $3.06/h; us-east-1, read 2026-11) or "
                     "'custom' (learner_usd_per_h).", choices=("cpu", "gpu", "custom")),
    "learner_usd_per_h": Field("float", None, "Learner price per hour (set alone, it is the "
                               "price; a 'cpu' or 'gpu' preset named beside it is an error).",
                               min=0),
    "redis_usd_per_hour": Field("float", 0.016, "Redis node price per hour, billed when "
                                "transport.kind = 'redis' (cache.t4g.micro, us-east-1, "
                                "2026-11).", min=0),
    "function_timeout_s": Field("float", None, "Function timeout a cancelled or timed-out "
                                "invocation is billed up to (default: actors.timeout_s, else "
                                "actors.deadline_s).", min=0, min_exclusive=True),
    "memory_mb": Field("int", None, "Function memory (default: actors.memory_mb or 1769).",
                       min=128, max=10240),
    "actors_kind": Field("str", "lambda", "Bill actors as Lambda invocations or as VMs "
                         "(serverful baseline).", choices=("lambda", "vm")),
    "vm_usd_per_hour": Field("float", 0.34, "Price of one actor VM per hour.", min=0),
    "vm_startup_s": Field("float", 40.0, "Seconds a new VM takes to start (billed, and it "
                          "delays the round).", min=0),
    "actors_per_vm": Field("int", 4, "Actors one VM runs at once.", min=1),
    "estimate_margin": Field("float", 1.2, "Factor on the upper envelope of recent rounds "
                             "that makes a round's estimated cost (the budget allocator).",
                             min=1),
    "estimate_rounds": Field("int", 8, "Recent rounds the estimate's envelope is fitted on.",
                             min=1),
    "stall_s": Field("float", 0.25, "Seconds of a stall of the machine (a busy scheduler, a "
                     "garbage-collector pause) the budget keeps in hand when durations are "
                     "measured: the first one cannot be foreseen from the rounds before it. "
                     "Unused under the time model.", min=0),
    "time_model": Field("str", "measured", "Durations the bill and the simulated clock use: "
                        "'measured', or 'model' (the model_* keys: a function of the work "
                        "done, the same under any machine load).", choices=("measured", "model")),
    "model_actor_ms": Field("float", None, "Time model: fixed milliseconds of an invocation.",
                            min=0),
    "model_actor_ms_per_step": Field("float", None, "Time model: an invocation's milliseconds "
                                     "per env step.", min=0),
    "model_learner_s": Field("float", None, "Time model: fixed seconds of an update.", min=0),
    "model_learner_s_per_step": Field("float", None, "Time model: update seconds per env "
                                      "step trained.", min=0),
    "model_probe_s": Field("float", None, "Time model: fixed seconds of a Hessian probe.",
                           min=0),
    "model_probe_s_per_sample_step": Field("float", None, "Time model: Hessian probe seconds "
                                           "per batch sample per Lanczos step.", min=0),
    "model_gns_s": Field("float", None, "Time model: fixed seconds of a gns probe (with "
                         "model_gns_s_per_sample; unset: that probe is billed as measured).",
                         min=0),
    "model_gns_s_per_sample": Field("float", None, "Time model: gns probe seconds per batch "
                                    "sample.", min=0),
}

#: Adaptive scalers widen an unset actors.max and add the probe they read (plugins/scalers/validation.py).
ADAPTIVE = "plugins.scalers.validation:validate_adaptive"

HESSIAN_CONFIG = {
    "samples": Field("int", 2048, "Batch samples the Hessian is taken on, drawn at random from "
                     "the round's batch (0: all, as the paper). rho rises with the samples it "
                     "is taken on, so a fixed count keeps it comparable across round sizes.",
                     min=0),
    "max_steps": Field("int", 100, "Most Lanczos steps (fewer when the basis would exceed "
                       "basis_mb).", min=2, max=1000),
    "min_steps": Field("int", 8, "Fewest Lanczos steps before the convergence test.", min=1),
    "tol": Field("float", 1e-2, "Lanczos stops when each extreme Ritz pair's residual is below "
                 "tol times its own Ritz value (or times floor x the largest, if more).",
                 min=0, min_exclusive=True),
    "floor": Field("float", 1e-3, "Fraction of the largest Ritz value below which an extreme "
                   "counts as zero for its convergence test.", min=0, min_exclusive=True,
                   max=1),
    "rho_eps": Field("float", 1e-2, "Regularisation of hessian_ratio: negative curvature below "
                     "this fraction of lambda_max counts as none; the ratio stays under 1/rho_eps "
                     "and rises, not flips sign, for a convex round.", min=0,
                     min_exclusive=True, max=1),
    "basis_mb": Field("float", 256.0, "Memory cap of the Lanczos basis (float64 while it fits, "
                      "else float32 and fewer steps).", min=1),
    "warm_start": Field("bool", True, "Start Lanczos from the previous measurement's extreme "
                        "Ritz vectors (plus a random part)."),
    "max_s": Field("float", None, "Wall-clock cap of one measurement's Lanczos (unset: none); "
                   "a capped run reports hessian_converged = 0.", min=0, min_exclusive=True),
    "density": Field("bool", False, "Also report spectral-density summaries."),
}

GNS_CONFIG = {
    "samples": Field("int", 4096, "Batch samples used (0: all).", min=0),
    "slices": Field("int", 8, "Slices the batch is cut into (the small batch size).", min=2),
    "at": Field("str", "before", "Parameters the noise is measured at: those the update "
                "started from, or those it ended with (where the batch's gradient is ~0).",
                choices=("before", "after")),
}

NITRO_CONFIG = {
    "window": Field("int", 6, "Values in the min-max window (anchored: the horizon of its "
                    "moving mean and variance).", min=1),
    "decay": Field("float", 0.96, "Per-round decay of the signal and the floor.", min=0,
                   max=1, min_exclusive=True),
    "flat_score": Field("float", 1.0, "Score when the window has no spread (0/0).", min=0, max=1),
    "prototype_compat": Field("bool", False, "Reproduce the prototype's arithmetic."),
    "signal": Field("str", "hessian_ratio", "Probe value the score is built from."),
    "rule": Field("str", "anchored", "anchored: base x gain^z around a fixed count, z from "
                  "a smoothed log signal; window: the paper's min-max window over a decaying "
                  "signal.", choices=("anchored", "window")),
    "base": Field("int", None, "anchored: the count the rule boosts around (default "
                  "actors.count).", min=1),
    "gain": Field("float", 2.0, "anchored: N runs from base / gain to base x gain.", min=1),
    "min_history": Field("int", 3, "anchored: measurements before the first boost.", min=1),
}

DECAY_ONLY_CONFIG = {
    "decay": NITRO_CONFIG["decay"],
    "prototype_compat": Field("bool", False, "Use the prototype's floor (decay^(t^2), "
                              "truncated)."),
}

FIXED_CONFIG = {
    "count": Field("int", None, "Actors every round (default actors.count).", min=1),
}

#: The paper's no-boost baseline computes the paper's score (the window rule) by default.
NO_BOOST_CONFIG = {**NITRO_CONFIG, **FIXED_CONFIG,
                   "rule": Field("str", "window", "Rule whose score is computed (and not "
                                 "followed).", choices=("anchored", "window"))}

KUNGFU_CONFIG = {
    "base": Field("int", None, "Actors from round 2 on, before any rise (default actors.min).",
                  min=1),
    "signal": Field("str", "gns", "Probe value to follow."),
}

HYDROZOA_CONFIG = {
    "base": Field("int", None, "Actors before the first doubling (default actors.min).", min=1),
    "every": Field("int", 10, "Rounds between doublings.", min=1),
}

PROTOTYPE_COST_CONFIG = {
    "learner_usd_per_h": Field("float", 3.06, "The prototype's learner price per hour "
                               "(p3.2xlarge).", min=0),
    "actors_usd_per_h": Field("float", 0.68, "The prototype's price per hour for its actors.",
                              min=0),
    "charge_probe": Field("bool", False, "Charge the Hessian probe's time (the prototype did "
                          "not)."),
    "estimate_margin": AWS_COST_CONFIG["estimate_margin"],
    "estimate_rounds": AWS_COST_CONFIG["estimate_rounds"],
    "stall_s": AWS_COST_CONFIG["stall_s"],
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
    "at": Field("list[float]", [], "Fractions of stop.budget_usd spent at which the next of "
                "`steps` starts (one fewer than steps, rising, each in (0, 1)); replaces "
                "every. A schedule in dollars, not rounds."),
}

CRITICAL_BATCH_CONFIG = {
    "smoothing": Field("float", 0.7, "EMA factor of the squared gradient norm and tr(Sigma) "
                       "across rounds.", min=0, max=0.99),
}

GROW_CONFIG = {
    "base": Field("int", None, "The count the band is centred on (default actors.count).",
                  min=1),
    "gain": Field("float", 2.0, "N runs from base / gain (while the noise scale is at its "
                  "reference) to base x gain.", min=1),
    "exponent": Field("float", 0.2, "N grows as (B_noise / B_ref)^exponent: 0.2 crosses "
                      "a band of gain 2 over the 300- to 1,000-fold growth of the noise scale "
                      "seen in a budgeted run.", min=0, min_exclusive=True),
    "smoothing": CRITICAL_BATCH_CONFIG["smoothing"],
    "warmup": Field("int", 5, "Measurements before the reference noise scale is fixed.", min=1),
}

REWARD_SLOPE_CONFIG = {
    "window": Field("int", 5, "Rounds with a return in the slope fit.", min=2),
    "flat_threshold": Field("float", 0.01, "Relative slope per round counted as flat.", min=0),
    "step": Field("int", 1, "Actors added or removed per round.", min=1),
}

PLUGINS = [
    Plugin("fixed", "scaler", "plugins.scalers.schedules:FixedScaler",
           "Always scaler.count (default actors.count).", config=FIXED_CONFIG),
    Plugin("min", "scaler", "plugins.scalers.schedules:MinScaler", "Always actors.min."),
    Plugin("max", "scaler", "plugins.scalers.schedules:MaxScaler", "Always actors.max."),
    Plugin("random", "scaler", "plugins.scalers.schedules:RandomScaler",
           "Uniform in [actors.min, actors.max], seeded; capped by the budget.",
           validator=ADAPTIVE),
    Plugin("nitro", "scaler", "plugins.scalers.curvature:NitroScaler",
           "Hessian-ratio boosting: N within a factor gain of base as log rho leaves its "
           "moving mean (rule = anchored), or the paper's window rule (rule = window).",
           config=NITRO_CONFIG, validator=ADAPTIVE),
    Plugin("prototype", "scaler", "plugins.scalers.curvature:PrototypeScaler",
           "The paper's prototype rule exactly (nitro with prototype_compat = true).",
           config=NITRO_CONFIG, validator=ADAPTIVE),
    Plugin("prototype_compat", "scaler", "plugins.scalers.curvature:PrototypeScaler",
           "Another name for prototype: the paper's rule as its description names it.",
           config=NITRO_CONFIG, validator=ADAPTIVE),
    Plugin("decay_only", "scaler", "plugins.scalers.schedules:DecayOnlyScaler",
           "nitro's decaying floor without the curvature (the ablation).",
           config=DECAY_ONLY_CONFIG, validator=ADAPTIVE),
    Plugin("no_boost", "scaler", "plugins.scalers.curvature:NoBoostScaler",
           "The paper's no-boost baseline: nitro's score computed, N kept at count.",
           config=NO_BOOST_CONFIG, validator="plugins.scalers.validation:validate_probe"),
    Plugin("kungfu", "scaler", "plugins.scalers.noise:KungfuScaler",
           "KungFu: N grows with the gradient noise scale whenever it rises.",
           config=KUNGFU_CONFIG, validator=ADAPTIVE),
    Plugin("hydrozoa", "scaler", "plugins.scalers.schedules:HydrozoaScaler",
           "Hydrozoa: actors.min doubled every 10 rounds.", config=HYDROZOA_CONFIG,
           validator=ADAPTIVE),
    Plugin("critical_batch", "scaler", "plugins.scalers.noise:CriticalBatchScaler",
           "N = sqrt(B_noise c_round / c_sample) / samples per actor: the round size that "
           "buys progress cheapest (gradient noise scale and the round estimate's prices).",
           config=CRITICAL_BATCH_CONFIG,
           validator=ADAPTIVE),
    Plugin("grow", "scaler", "plugins.scalers.noise:GrowScaler",
           "N grows with the gradient noise scale from base / gain to base x gain: small "
           "rounds while updates pay, big ones once the gradient is noisy.",
           config=GROW_CONFIG, validator=ADAPTIVE),
    Plugin("gns", "scaler", "plugins.scalers.noise:GnsScaler",
           "actors.max when the gradient noise scale jumps (z-score), else actors.min.",
           config=GNS_SCALER_CONFIG, validator=ADAPTIVE),
    Plugin("schedule", "scaler", "plugins.scalers.schedules:ScheduleScaler",
           "Ascending or descending step schedule, in rounds or in budget spent.",
           config=SCHEDULE_CONFIG, validator="plugins.scalers.validation:validate_schedule"),
    Plugin("reward_slope", "scaler", "plugins.scalers.reward:RewardSlopeScaler",
           "More actors while the return is flat, fewer while it climbs.", validator=ADAPTIVE,
           config=REWARD_SLOPE_CONFIG),
    Plugin("hessian", "probe", "plugins.probes.hessian:HessianProbe",
           "Extreme Hessian eigenvalues of the loss (Lanczos); reports hessian_ratio.",
           config=HESSIAN_CONFIG),
    Plugin("gns", "probe", "plugins.probes.gns:GnsProbe",
           "Gradient noise scale B_simple (McCandlish et al. 2018); reports gns.",
           config=GNS_CONFIG),
    Plugin("aws", "cost", "plugins.cost.aws:AwsCost",
           "Everything AWS bills: Lambda GB-s, requests, init, errors and cancelled calls (or "
           "actor VMs); learner instance and Redis node per hour.",
           config=AWS_COST_CONFIG, validator="plugins.cost.aws:validate"),
    Plugin("prototype", "cost", "plugins.cost.prototype:PrototypeCost",
           "The paper's prototype: round duration x ($3.06 + $0.68)/h, no Lambda GB-s.",
           config=PROTOTYPE_COST_CONFIG),
]
