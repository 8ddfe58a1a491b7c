"""The ``eval`` probe: E episodes with the deterministic policy; its mean is ``eval_return``.

It runs on a copy of the learner's weights (``learner.weights()``), in the probe thread, on
fresh envs with raw rewards, normalising observations with the learner's current statistics —
exactly what a deployed policy would see.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envs import evaluate
from kernel.roles import PluginContext, ProbeContext
from plugins.learners.onpolicy import env_spec_of


class EvalProbe:
    def __init__(self, ctx: PluginContext):
        self.every = int(ctx.config["every"])
        self.episodes = int(ctx.config["episodes"])
        self.env_spec = env_spec_of(ctx.plan)
        self._policy: Any = None

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        learner = ctx.learner
        if self._policy is None:
            from plugins.registry_access import actor_policy

            self._policy = actor_policy(learner.actor_spec(), exact=True)
        weights = learner.weights()
        self._policy.load(weights["model"])
        returns = np.asarray(
            evaluate(self._policy, self.env_spec, self.episodes, seed=ctx.seed,
                     obs_rms=weights.get("obs_rms")),
            dtype=np.float64,
        )
        return {
            "eval_return": float(returns.mean()),
            "eval_return_min": float(returns.min()),
            "eval_return_max": float(returns.max()),
            "eval_return_std": float(returns.std()),
        }
