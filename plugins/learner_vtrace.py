"""Learner factories for the V-trace algorithms (IMPALA, APPO).

Both cores have PPO's interface (`actor_spec`, `weights`, `update(rollout, progress)`,
`state_dict`), so the distributed shell is `OnPolicyLearner` unchanged: batch checks, statistics
merging, reward scaling and concatenation along the env axis. Batches may come from older policy
versions; their `logprobs` are the behaviour policy's, which is all V-trace needs to correct the
lag.
"""

from __future__ import annotations

from typing import Any

from envs import describe
from kernel.roles import PluginContext
from plugins.learner import OnPolicyLearner, _env_spec, resolve_device


def _config(ctx: PluginContext) -> dict[str, Any]:
    cfg = {k: v for k, v in ctx.config.items() if k != "name"}
    if "hidden_sizes" in cfg:
        cfg["hidden_sizes"] = tuple(cfg["hidden_sizes"])
    return cfg


def make_vtrace(ctx: PluginContext, algo: str) -> OnPolicyLearner:
    """The learner of V-trace algorithm `algo` ("impala" or "appo"): its core, seeded, on the
    plan's device, inside the on-policy shell."""
    import torch

    from algos.appo import APPO, APPOConfig
    from algos.impala import IMPALA, IMPALAConfig

    core_class, config_class = {"impala": (IMPALA, IMPALAConfig), "appo": (APPO, APPOConfig)}[algo]
    torch.manual_seed(ctx.seed)
    spaces = describe(_env_spec(ctx.plan))
    core = core_class(spaces, config_class(**_config(ctx)),
                      device=resolve_device(ctx.plan["run"]["device"]))
    return OnPolicyLearner(ctx, core, spaces, ctx.name)


def make_impala(ctx: PluginContext) -> OnPolicyLearner:
    return make_vtrace(ctx, "impala")


def make_appo(ctx: PluginContext) -> OnPolicyLearner:
    return make_vtrace(ctx, "appo")
