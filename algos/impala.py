"""IMPALA's learner core (V-trace actor-critic, Espeholt et al. 2018), laid out like `ppo.py`.

The actors' batches were sampled by a policy that may lag the learner's (each batch carries its
`version`); V-trace (`algos/vtrace.py`) corrects that lag with truncated importance weights.
Unlike PPO's flat minibatches, a V-trace minibatch keeps whole env sequences: the targets run
backwards through time, so minibatches split the env axis and never the time axis. Batches are
therefore env-major ([B, T, ...]): indexing dim 0 picks sequences, for us and for probes.

`update` takes the round's rollouts (time-first [T, B], see `docs/contracts.md`) and returns
scalar diagnostics; the loss is the pure function `impala_loss` so that probes can take
gradients and Hessian-vector products of exactly what the learner optimises:

    b = impala.make_batch(rollout)
    f = lambda p: impala.loss(b, p)[0]          # b is env-major: b[k][idx] picks sequences
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from algos.core import LearnerCore, set_learning_rate
from algos.ppo import explained_variance
from algos.vtrace import vtrace


@dataclass
class IMPALAConfig:
    learning_rate: float = 5e-4
    """the learning rate of the optimizer (the value at progress 0)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    rho_bar: float = 1.0
    """V-trace's truncation of the importance weights rho (value targets and pg advantages)"""
    c_bar: float = 1.0
    """V-trace's truncation of the trace-cutting weights c"""
    num_minibatches: int = 1
    """the number of mini-batches per epoch (each a set of whole env sequences)"""
    update_epochs: int = 1
    """the K epochs over each batch (1 in the paper: every sample is used once)"""
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


def forward_sequences(
    model: nn.Module, mb: dict[str, torch.Tensor], params: dict[str, torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprob, entropy, value) as time-first [T, b] and the bootstrap value V(last_obs) [b].

    The last observations ride through the same forward as the rest (with a dummy action whose
    logprob is dropped), so one `functional_call` covers everything the loss differentiates.
    """
    B, T = mb["rewards"].shape
    obs = torch.cat([mb["obs"].reshape(B * T, *mb["obs"].shape[2:]), mb["last_obs"]])
    actions = mb["actions"].reshape(B * T, *mb["actions"].shape[2:])
    actions = torch.cat([actions, torch.zeros_like(actions[:B])])
    if params is None:
        _, logprob, entropy, value = model(obs, actions)
    else:
        _, logprob, entropy, value = functional_call(model, params, (obs, actions))
    n = B * T
    return (
        logprob[:n].reshape(B, T).T,
        entropy[:n].reshape(B, T).T,
        value[:n].reshape(B, T).T,
        value[n:],
    )


def impala_loss(
    model: nn.Module,
    mb: dict[str, torch.Tensor],
    config: IMPALAConfig,
    params: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IMPALA's loss on a minibatch of b env sequences, and its named parts (detached).

    V-trace runs on the current model's logprobs and values (without gradient); the gradient
    flows through `newlogprob` (policy) and `newvalue` (critic) only.
    """
    newlogprob, entropy, newvalue, bootstrap_value = forward_sequences(model, mb, params)
    mb_logprobs = mb["logprobs"].T  # V-trace runs time-first: [T, b]
    vs, pg_advantages = vtrace(
        mb_logprobs,
        newlogprob.detach(),
        mb["rewards"].T,
        newvalue.detach(),
        bootstrap_value.detach(),
        mb["discounts"].T,
        rho_bar=config.rho_bar,
        c_bar=config.c_bar,
    )
    logratio = (newlogprob - mb_logprobs).detach()
    ratio = logratio.exp()

    # Policy loss: pg_advantages already carry the truncated weight rho_s (paper, eq. 4)
    pg_loss = -(pg_advantages * newlogprob).mean()
    # Value loss: regress V(x_s) towards the V-trace target v_s
    v_loss = 0.5 * ((newvalue - vs) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - config.ent_coef * entropy_loss + v_loss * config.vf_coef
    parts = {
        "pg_loss": pg_loss.detach(),
        "v_loss": v_loss.detach(),
        "entropy_loss": entropy_loss.detach(),
        # KL(behaviour || current) estimate, http://joschu.net/blog/kl-approx.html
        "approx_kl": ((ratio - 1) - logratio).mean(),
        "rho_mean": ratio.mean(),
        "rho_clipfrac": (ratio > config.rho_bar).float().mean(),
        "vs": vs,
        "newvalue": newvalue.detach(),
    }
    return loss, parts


def make_sequence_batch(
    rollout: dict[str, np.ndarray], gamma: float, discrete: bool, device: torch.device
) -> dict[str, torch.Tensor]:
    """The [T, B] rollout as env-major [B, T, ...] tensors, truncation folded into the rewards.

    Env-major so that indexing dim 0 selects whole sequences in every entry (`last_obs` [B]
    included): learner minibatches and probes' subsamples (`{k: v[idx]}`) stay valid batches.

    A truncated (not terminated) step did not end in the MDP, so its missing future,
    gamma * V(final obs), is added to the reward (as PPO's GAE does); any done then cuts the
    trace through `discounts = gamma * (1 - done)`.
    """
    terminated = np.asarray(rollout["terminated"], dtype=bool)
    truncated = np.asarray(rollout["truncated"], dtype=bool)
    rewards = np.asarray(rollout["rewards"], dtype=np.float32)
    bootstrap = np.asarray(rollout["bootstrap_values"], dtype=np.float32)
    rewards = rewards + gamma * bootstrap * (truncated & ~terminated)
    discounts = gamma * (1.0 - (terminated | truncated)).astype(np.float32)

    def tensor(x: np.ndarray, dtype: Any, time_first: bool = True) -> torch.Tensor:
        x = np.asarray(x).astype(dtype, copy=False)
        x = np.ascontiguousarray(np.swapaxes(x, 0, 1) if time_first else x)
        return torch.as_tensor(np.array(x, copy=True), device=device)

    obs_dtype = np.uint8 if np.asarray(rollout["obs"]).dtype == np.uint8 else np.float32
    return {
        "obs": tensor(rollout["obs"], obs_dtype),
        "actions": tensor(rollout["actions"], np.int64 if discrete else np.float32),
        "logprobs": tensor(rollout["logprobs"], np.float32),
        "rewards": tensor(rewards, np.float32),
        "discounts": tensor(discounts, np.float32),
        "values": tensor(rollout["values"], np.float32),
        "last_obs": tensor(rollout["last_obs"], obs_dtype, time_first=False),
    }


class IMPALA(LearnerCore):
    """The IMPALA learner core: V-trace targets, policy gradient with an entropy bonus."""

    def __init__(
        self,
        spaces: dict[str, Any],
        config: IMPALAConfig | None = None,
        device: str | torch.device = "cpu",
    ):
        super().__init__(spaces, config if config is not None else IMPALAConfig(), device)
        self.config: IMPALAConfig

    # ---- learning ---------------------------------------------------------------------------
    def make_batch(self, rollout: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """The [T, B] rollout as time-first tensors on the learner's device."""
        return make_sequence_batch(rollout, self.config.gamma, self.model.discrete, self.device)

    def loss(
        self, mb: dict[str, torch.Tensor], params: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`impala_loss` with this learner's model and config (for probes)."""
        return impala_loss(self.model, mb, self.config, params)

    def update(self, rollout: dict[str, np.ndarray], progress: float) -> dict[str, float]:
        """K epochs (1 by default) of SGD over env-sequence minibatches; returns diagnostics."""
        c = self.config
        lrnow = set_learning_rate(self.optimizer, c.learning_rate, c.anneal_lr, progress)
        b = self.make_batch(rollout)
        num_envs = b["rewards"].shape[0]

        # ALGO LOGIC: V-trace actor-critic
        self.model.train()
        rho_clipfracs: list[float] = []
        for _epoch in range(c.update_epochs):
            b_inds = torch.randperm(num_envs, device=self.device)
            for mb_inds in torch.tensor_split(b_inds, min(c.num_minibatches, num_envs)):
                mb = {k: v[mb_inds] for k, v in b.items()}
                loss, parts = impala_loss(self.model, mb, c)
                rho_clipfracs.append(parts["rho_clipfrac"].item())

                self.sgd_step(loss, c.max_grad_norm)

        return {
            "learning_rate": float(lrnow),
            "loss": loss.item(),
            "v_loss": parts["v_loss"].item(),
            "pg_loss": parts["pg_loss"].item(),
            "entropy": parts["entropy_loss"].item(),
            "approx_kl": parts["approx_kl"].item(),
            "rho_mean": parts["rho_mean"].item(),
            "rho_clipfrac": float(np.mean(rho_clipfracs)),
            "explained_variance": explained_variance(
                parts["newvalue"].cpu().numpy(), parts["vs"].cpu().numpy()
            ),
        }
