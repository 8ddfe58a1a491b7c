"""Learner factories for the V-trace algorithms (IMPALA, APPO).

Both cores have PPO's interface (`actor_spec`, `weights`, `update(rollout, progress)`,
`state_dict`), so the distributed shell is `OnPolicyLearner` unchanged: batch checks, statistics
merging, reward scaling and concatenation along the env axis. Batches may come from older policy
versions; their `logprobs` are the behaviour policy's, which is all V-trace needs to correct the
lag.
"""

from __future__ import annotations

from kernel.roles import PluginContext
from plugins.learners.onpolicy import OnPolicyLearner, build_learner


def make_vtrace(ctx: PluginContext, algo: str) -> OnPolicyLearner:
    """The learner of V-trace algorithm `algo` ("impala" or "appo")."""
    from algos.appo import APPO, APPOConfig
    from algos.impala import IMPALA, IMPALAConfig

    core_class, config_class = {"impala": (IMPALA, IMPALAConfig), "appo": (APPO, APPOConfig)}[algo]
    return build_learner(ctx, core_class, config_class)


def make_impala(ctx: PluginContext) -> OnPolicyLearner:
    return make_vtrace(ctx, "impala")


def make_appo(ctx: PluginContext) -> OnPolicyLearner:
    return make_vtrace(ctx, "appo")
