"""The plugin factory: Nitro's on-policy learner shell around the A2C core."""

from __future__ import annotations

from envs import describe
from kernel.roles import PluginContext
from plugins.learners.onpolicy import OnPolicyLearner, env_spec_of, resolve_device


def make_a2c(ctx: PluginContext) -> OnPolicyLearner:
    """Called once per run with the plan's ``[algo]`` section (defaults filled) in ctx.config."""
    import torch

    from nitro_a2c.a2c import A2C, A2CConfig

    cfg = {k: v for k, v in ctx.config.items() if k != "name"}
    cfg["hidden_sizes"] = tuple(cfg.get("hidden_sizes", (64, 64)))
    torch.manual_seed(ctx.seed)
    spaces = describe(env_spec_of(ctx.plan))
    device = resolve_device(ctx.plan["run"]["device"], spaces)
    core = A2C(spaces, A2CConfig(**cfg), device=device)
    return OnPolicyLearner(ctx, core, spaces, ctx.name)
