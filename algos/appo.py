"""APPO's learner core: PPO's clipped surrogate on V-trace advantages, with a target network.

This is the target-network variant of RLlib's APPO (`use_kl_loss=False`): a frozen copy of the
model, refreshed every `target_update_freq` updates, plays PPO's "old policy". V-trace corrects
the actors' lag from the behaviour policy mu to that target policy; the surrogate ratio then
compares the current policy with the target one, clipped as in PPO:

    is_ratio   = clip(mu / pi_target, 0, 2)          (RLlib's guard against a wild mu)
    ratio      = is_ratio * pi / mu                  (= pi / pi_target while unclipped)
    pg_loss    = -mean(min(A * ratio, A * clip(ratio, 1 - eps, 1 + eps)))

with A the V-trace pg advantages computed with pi_target, and the critic regressed towards the
V-trace targets. With `target_update_freq = 1` and fresh batches this is PPO with V-trace
instead of GAE; larger values let several updates share one trust region, which is what keeps
the surrogate meaningful when batches arrive from many policy versions.

Layout, names and interface follow `ppo.py` and `impala.py` (minibatches are whole
env sequences, env-major; `loss(mb, params)` is the pure loss for probes).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from algos.core import Tensors
from algos.vtrace import (
    VTraceConfig,
    VTraceCore,
    forward_sequences,
    make_sequence_batch,
    sequence_forward,
    vtrace_loss,
)


@dataclass
class APPOConfig(VTraceConfig):
    num_minibatches: int = 4
    """the number of mini-batches per epoch (each a set of whole env sequences)"""
    update_epochs: int = 4
    """the K epochs over each batch"""
    norm_adv: bool = True
    """toggles per-minibatch advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient (RLlib's clip_param)"""
    target_update_freq: int = 1
    """refresh the target network every this many updates (batches), before the update"""


def appo_loss(model: nn.Module, mb: Tensors, config: APPOConfig, params: Tensors | None = None
              ) -> tuple[torch.Tensor, Tensors]:
    """APPO's loss on a minibatch of b env sequences, and its named parts (detached).

    `mb["target_logprobs"]` are the target network's logprobs of the actions (fixed during an
    update); values and the bootstrap come from the current model, without gradient in V-trace.
    """
    mb_target_logprobs = mb["target_logprobs"].T  # [T, b]
    f = sequence_forward(model, mb, config, params, mb_target_logprobs)
    newlogprob, mb_logprobs = f.newlogprob, f.behaviour_logprobs
    is_ratio = torch.clamp((mb_logprobs - mb_target_logprobs).exp(), 0.0, 2.0)
    ratio = is_ratio * (newlogprob - mb_logprobs).exp()
    logratio = (newlogprob - mb_target_logprobs).detach()

    # KL(target || current) estimate, http://joschu.net/blog/kl-approx.html
    approx_kl = ((logratio.exp() - 1) - logratio).mean()
    clipfrac = ((ratio.detach() - 1.0).abs() > config.clip_coef).float().mean()

    mb_advantages = f.pg_advantages
    if config.norm_adv:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

    # Policy loss
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - config.clip_coef, 1 + config.clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    # Value loss and entropy bonus: `vtrace_loss`
    return vtrace_loss(pg_loss, f, config, {
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    })


class APPO(VTraceCore):
    """The learner core: owns the model, its target copy and the optimiser; no I/O."""

    config: APPOConfig
    config_class = APPOConfig
    averaged_parts = ("clipfrac",)

    def __init__(
        self,
        spaces: dict[str, Any],
        config: APPOConfig | None = None,
        device: str | torch.device = "cpu",
    ):
        config = config if config is not None else APPOConfig()
        if config.target_update_freq < 1:
            raise ValueError(f"target_update_freq must be >= 1, got {config.target_update_freq}")
        super().__init__(spaces, config, device)
        self.target_model = copy.deepcopy(self.model).requires_grad_(False)
        self.updates = 0

    # ---- checkpoints: the target network and its schedule too ---------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "target_model": self.target_model.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.target_model.load_state_dict(state["target_model"])
        self.updates = int(state["updates"])

    # ---- learning ---------------------------------------------------------------------------
    @torch.no_grad()
    def make_batch(self, rollout: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Time-first tensors plus the target network's logprobs of the batch's actions."""
        b = make_sequence_batch(rollout, self.config.gamma, self.model.discrete, self.device)
        self.target_model.train(False)  # inference mode for the target network
        b["target_logprobs"] = forward_sequences(self.target_model, b, None)[0].T.contiguous()
        return b

    def loss(
        self, mb: dict[str, torch.Tensor], params: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`appo_loss` with this learner's model and config (for probes)."""
        return appo_loss(self.model, mb, self.config, params)

    def before_update(self) -> None:
        """Refresh the target network when due (every `target_update_freq` updates)."""
        if self.updates % self.config.target_update_freq == 0:
            self.target_model.load_state_dict(self.model.state_dict())
        self.updates += 1
