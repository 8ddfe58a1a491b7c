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

from algos.core import LearnerCore, set_learning_rate
from algos.impala import forward_sequences, make_sequence_batch
from algos.ppo import explained_variance
from algos.vtrace import vtrace


@dataclass
class APPOConfig:
    learning_rate: float = 5e-4
    """the learning rate of the optimizer (the value at progress 0)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    rho_bar: float = 1.0
    """V-trace's truncation of the importance weights rho (value targets and pg advantages)"""
    c_bar: float = 1.0
    """V-trace's truncation of the trace-cutting weights c"""
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
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    anneal_lr: bool = True
    """toggle learning rate annealing: lr = (1 - progress) * learning_rate"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """hidden layer sizes of the actor and critic MLPs (ignored for pixel observations)"""
    activation: str = "tanh"
    """activation of the MLPs ("tanh" or "relu")"""
    adam_eps: float = 1e-5
    """Adam's epsilon"""


def appo_loss(
    model: nn.Module,
    mb: dict[str, torch.Tensor],
    config: APPOConfig,
    params: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """APPO's loss on a minibatch of b env sequences, and its named parts (detached).

    `mb["target_logprobs"]` are the target network's logprobs of the actions (fixed during an
    update); values and the bootstrap come from the current model, without gradient in V-trace.
    """
    newlogprob, entropy, newvalue, bootstrap_value = forward_sequences(model, mb, params)
    mb_logprobs, mb_target_logprobs = mb["logprobs"].T, mb["target_logprobs"].T  # [T, b]
    vs, pg_advantages = vtrace(
        mb_logprobs,
        mb_target_logprobs,
        mb["rewards"].T,
        newvalue.detach(),
        bootstrap_value.detach(),
        mb["discounts"].T,
        rho_bar=config.rho_bar,
        c_bar=config.c_bar,
    )
    is_ratio = torch.clamp((mb_logprobs - mb_target_logprobs).exp(), 0.0, 2.0)
    ratio = is_ratio * (newlogprob - mb_logprobs).exp()
    logratio = (newlogprob - mb_target_logprobs).detach()

    # KL(target || current) estimate, http://joschu.net/blog/kl-approx.html
    approx_kl = ((logratio.exp() - 1) - logratio).mean()
    clipfrac = ((ratio.detach() - 1.0).abs() > config.clip_coef).float().mean()

    mb_advantages = pg_advantages
    if config.norm_adv:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

    # Policy loss
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - config.clip_coef, 1 + config.clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    # Value loss
    v_loss = 0.5 * ((newvalue - vs) ** 2).mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - config.ent_coef * entropy_loss + v_loss * config.vf_coef
    behaviour_ratio = (mb_target_logprobs - mb_logprobs).exp()
    parts = {
        "pg_loss": pg_loss.detach(),
        "v_loss": v_loss.detach(),
        "entropy_loss": entropy_loss.detach(),
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
        "rho_mean": behaviour_ratio.mean(),
        "rho_clipfrac": (behaviour_ratio > config.rho_bar).float().mean(),
        "vs": vs,
        "newvalue": newvalue.detach(),
    }
    return loss, parts


class APPO(LearnerCore):
    """The learner core: owns the model, its target copy and the optimiser; no I/O."""

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
        self.config: APPOConfig
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

    def update(self, rollout: dict[str, np.ndarray], progress: float) -> dict[str, float]:
        """Refresh the target when due, then K epochs of clipped-surrogate SGD; diagnostics."""
        c = self.config
        lrnow = set_learning_rate(self.optimizer, c.learning_rate, c.anneal_lr, progress)
        if self.updates % c.target_update_freq == 0:
            self.target_model.load_state_dict(self.model.state_dict())
        self.updates += 1
        b = self.make_batch(rollout)
        num_envs = b["rewards"].shape[0]

        # ALGO LOGIC: clipped surrogate on V-trace advantages
        self.model.train()
        clipfracs: list[float] = []
        for _epoch in range(c.update_epochs):
            b_inds = torch.randperm(num_envs, device=self.device)
            for mb_inds in torch.tensor_split(b_inds, min(c.num_minibatches, num_envs)):
                mb = {k: v[mb_inds] for k, v in b.items()}
                loss, parts = appo_loss(self.model, mb, c)
                clipfracs.append(parts["clipfrac"].item())

                self.sgd_step(loss, c.max_grad_norm)

        return {
            "learning_rate": float(lrnow),
            "loss": loss.item(),
            "v_loss": parts["v_loss"].item(),
            "pg_loss": parts["pg_loss"].item(),
            "entropy": parts["entropy_loss"].item(),
            "approx_kl": parts["approx_kl"].item(),
            "clipfrac": float(np.mean(clipfracs)),
            "rho_mean": parts["rho_mean"].item(),
            "rho_clipfrac": parts["rho_clipfrac"].item(),
            "explained_variance": explained_variance(
                parts["newvalue"].cpu().numpy(), parts["vs"].cpu().numpy()
            ),
        }
