"""A2C's learner core: one gradient step of the advantage actor-critic loss per round.

It follows the same contract as ``algos.ppo.PPO`` (see Nitro's ``docs/contracts.md``):
``update`` receives the round's rollouts, time-first [T, B], with rewards already scaled, and
returns scalar diagnostics. It reuses Nitro's ``ActorCritic`` so the actors can run the stock
policy, ``algos.actor.make_actor_policy``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn, optim

from algos.core import LearnerCore, set_learning_rate
from algos.ppo import compute_gae, explained_variance


@dataclass
class A2CConfig:
    learning_rate: float = 7e-4
    """the optimiser's learning rate (the value at progress 0)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 1.0
    """GAE lambda; 1.0 gives the n-step returns of the original A2C"""
    ent_coef: float = 0.0
    """coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    norm_adv: bool = False
    """normalise advantages over the whole batch"""
    optimizer: str = "rmsprop"
    """"rmsprop" (alpha 0.99, eps 1e-5, as in the A2C paper's baselines) or "adam\""""
    anneal_lr: bool = False
    """lr = (1 - progress) * learning_rate"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """hidden layer sizes of the actor and critic MLPs"""
    activation: str = "tanh"
    """activation of the MLPs"""


def a2c_loss(
    model: nn.Module, b: dict[str, torch.Tensor], config: A2CConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The A2C loss on the whole batch, and its named parts (detached) for logging."""
    _, newlogprob, entropy, newvalue = model(b["obs"], b["actions"])
    advantages = b["advantages"]
    if config.norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = -(advantages * newlogprob).mean()
    v_loss = 0.5 * ((newvalue - b["returns"]) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - config.ent_coef * entropy_loss + config.vf_coef * v_loss
    parts = {"pg_loss": pg_loss.detach(), "v_loss": v_loss.detach(),
             "entropy_loss": entropy_loss.detach()}
    return loss, parts


class A2C(LearnerCore):
    """Nitro's ``LearnerCore`` gives the model, actor spec, weights and checkpoints; A2C adds
    its optimiser and its update."""

    def __init__(self, spaces: dict[str, Any], config: A2CConfig | None = None,
                 device: str | torch.device = "cpu"):
        super().__init__(spaces, config if config is not None else A2CConfig(), device)
        self.config: A2CConfig

    def make_optimizer(self) -> optim.Optimizer:
        params = [self.flat.param]  # every parameter, as one tensor (see algos.flat)
        if self.config.optimizer == "rmsprop":
            return optim.RMSprop(params, lr=self.config.learning_rate, alpha=0.99, eps=1e-5)
        return optim.Adam(params, lr=self.config.learning_rate, eps=1e-5)

    # ---- learning ---------------------------------------------------------------------------
    def update(self, rollout: dict[str, np.ndarray], progress: float) -> dict[str, float]:
        """Bootstrapped returns over the fragment, then one step on the whole batch."""
        c = self.config
        lrnow = set_learning_rate(self.optimizer, c.learning_rate, c.anneal_lr, progress)

        values = np.asarray(rollout["values"], dtype=np.float32)
        advantages = compute_gae(
            np.asarray(rollout["rewards"], dtype=np.float32), values,
            rollout["terminated"], rollout["truncated"],
            np.asarray(rollout["bootstrap_values"], dtype=np.float32),
            np.asarray(rollout["last_values"], dtype=np.float32), c.gamma, c.gae_lambda,
        )
        returns = advantages + values

        def flat(x: np.ndarray, dtype: Any) -> torch.Tensor:
            x = np.asarray(x).astype(dtype, copy=False)
            return torch.as_tensor(x.reshape(-1, *x.shape[2:]).copy(), device=self.device)

        b = {
            "obs": flat(rollout["obs"], np.float32),
            "actions": flat(rollout["actions"], np.int64 if self.model.discrete else np.float32),
            "advantages": flat(advantages, np.float32),
            "returns": flat(returns, np.float32),
        }
        self.model.train()
        loss, parts = a2c_loss(self.model, b, c)
        grad_norm = self.sgd_step(loss, c.max_grad_norm)
        return {
            "learning_rate": float(lrnow),
            "loss": loss.item(),
            "pg_loss": parts["pg_loss"].item(),
            "v_loss": parts["v_loss"].item(),
            "entropy": parts["entropy_loss"].item(),
            "grad_norm": float(grad_norm),
            "explained_variance": explained_variance(values.ravel(), returns.ravel()),
        }
