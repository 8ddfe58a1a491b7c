"""PPO's learner core (clipped surrogate, GAE), laid out like CleanRL's `ppo.py`.

`update` takes the round's rollouts (time-first [T, B], see `docs/contracts.md`) and returns
scalar diagnostics. The loss lives in the pure function `ppo_loss` so that probes can take
gradients and Hessian-vector products of exactly the loss the learner optimises, e.g.

    params = dict(ppo.model.named_parameters())
    f = lambda p: ppo_loss(ppo.model, mb, ppo.config, p)[0]
    torch.func.jvp(torch.func.grad(f), (params,), (vector,))  # Hessian-vector product
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from algos.core import LearnerCore, NetworkConfig, Tensors, set_learning_rate

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)

#: Batch entries made by the model (or from its outputs) rather than read from the rollout:
#: what a probe after the update needs as the update saw them. `logprobs` is the proximal
#: policy's when decoupled (the behaviour policy's otherwise, then equal to the rollout's).
MODEL_PARTS = ("logprobs", "is_weights", "advantages", "returns", "values")


@dataclass
class PPOConfig(NetworkConfig):
    learning_rate: float = 3e-4
    """the learning rate of the optimizer (the value at progress 0)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches per epoch"""
    minibatch_size: int | None = None
    """samples per mini-batch; when set it overrides num_minibatches, so a bigger round
    (a boost) takes more optimiser steps rather than bigger ones"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles per-minibatch advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold: stop the epochs early once approx_kl exceeds it"""
    anneal_lr: bool = True
    """toggle learning rate annealing: lr = (1 - progress) * learning_rate"""
    lr_reference_minibatch: int | None = None
    """samples per minibatch at which learning_rate applies; when set, the rate follows the
    minibatch size by Adam's square-root rule, lr * sqrt(size / reference), so a boosted
    round's bigger (less noisy) steps are also longer. None keeps the rate whatever the size"""
    clip_reference_batch: int | None = None
    """samples per round at which clip_coef applies; when set, the clip range (the policy's
    and the value's) follows the round's batch by the same square-root rule, clip_coef *
    sqrt(batch / reference): the surrogate's sampling error shrinks as the square root of the
    samples behind it, so a boosted round may move as much further. None keeps the range"""
    adam_eps: float = 1e-5
    """Adam's epsilon (1e-5 as in the PPO implementation details, not torch's 1e-8)"""
    decoupled: bool = True
    """clip against the learner's policy at the start of the update (the proximal policy)
    and weight each sample by pi_prox / mu, capped at 2 (Hilton et al., 2022): pipelined
    actors sample with the previous weights, and clipping against their policy would
    start every update with many samples already clipped. With fresh batches pi_prox = mu
    and the weights are 1."""




def _as_bool(x: ArrayT) -> ArrayT:
    return x.bool() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=bool)


def compute_gae(
    rewards: ArrayT,
    values: ArrayT,
    terminated: ArrayT,
    truncated: ArrayT,
    bootstrap_values: ArrayT,
    last_values: ArrayT,
    gamma: float,
    lam: float,
) -> ArrayT:
    """Generalised advantage estimates [T, B] (numpy or torch in, the same out).

    Autoreset is SAME_STEP: after any done step the next row belongs to a new episode, so a done
    cuts the recursion. A truncated (not terminated) episode did not end in the MDP, so its
    missing future, gamma * V(final obs), is added to the reward of that step instead.
    The returns (value targets) are `advantages + values`.
    """
    terminated, truncated = _as_bool(terminated), _as_bool(truncated)
    nextnonterminal_all = ~(terminated | truncated)
    rewards = rewards + gamma * bootstrap_values * (truncated & ~terminated)
    zeros_like = torch.zeros_like if isinstance(rewards, torch.Tensor) else np.zeros_like
    advantages = zeros_like(rewards)
    lastgaelam = zeros_like(last_values)
    num_steps = rewards.shape[0]
    for t in reversed(range(num_steps)):
        nextvalues = last_values if t == num_steps - 1 else values[t + 1]
        nextnonterminal = nextnonterminal_all[t]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        lastgaelam = delta + gamma * lam * nextnonterminal * lastgaelam
        advantages[t] = lastgaelam
    return advantages


def ppo_loss(model: nn.Module, mb: Tensors, config: PPOConfig, params: Tensors | None = None
             ) -> tuple[torch.Tensor, Tensors]:
    """PPO's loss on one minibatch, and its named parts (detached) for logging.

    `mb` holds `obs`, `actions`, `logprobs`, `advantages`, `returns`, `values`. With `params`
    the model runs through `torch.func.functional_call`, so `torch.func.grad`/`hvp` can
    differentiate the loss with respect to those parameters.
    """
    if params is None:
        _, newlogprob, entropy, newvalue = model(mb["obs"], mb["actions"])
    else:
        args = (mb["obs"], mb["actions"])
        _, newlogprob, entropy, newvalue = functional_call(model, params, args)
    logratio = newlogprob - mb["logprobs"]
    ratio = logratio.exp()

    # calculate approx_kl http://joschu.net/blog/kl-approx.html (no graph: diagnostics only)
    with torch.no_grad():
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > config.clip_coef).float().mean()

    mb_advantages = mb["advantages"]
    if config.norm_adv:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

    # Policy loss (`is_weights`, pi_prox / mu, corrects for actors that lag the learner)
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - config.clip_coef, 1 + config.clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2)
    pg_loss = (pg_loss * mb["is_weights"] if "is_weights" in mb else pg_loss).mean()

    # Value loss
    if config.clip_vloss:
        v_loss_unclipped = (newvalue - mb["returns"]) ** 2
        v_clipped = mb["values"] + torch.clamp(
            newvalue - mb["values"], -config.clip_coef, config.clip_coef
        )
        v_loss_clipped = (v_clipped - mb["returns"]) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - config.ent_coef * entropy_loss + v_loss * config.vf_coef
    parts = {
        "pg_loss": pg_loss.detach(),
        "v_loss": v_loss.detach(),
        "entropy_loss": entropy_loss.detach(),
        "approx_kl": approx_kl,
        "old_approx_kl": old_approx_kl,
        "clipfrac": clipfrac,
    }
    return loss, parts


def explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """1 - Var[y_true - y_pred] / Var[y_true]; NaN when the targets are constant (undefined)."""
    var_y = np.var(y_true)
    return float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)


class PPO(LearnerCore):
    """The PPO learner core: GAE, then K epochs of minibatch SGD on the clipped surrogate."""

    def __init__(
        self,
        spaces: dict[str, Any],
        config: PPOConfig | None = None,
        device: str | torch.device = "cpu",
    ):
        super().__init__(spaces, config if config is not None else PPOConfig(), device)
        self.config: PPOConfig
        self.loss_config = self.config  # the last update's (its clip range may follow its batch)

    # ---- learning ---------------------------------------------------------------------------
    def batch_inputs(self, rollout: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """What the batch takes from the rollout alone: `obs`, `actions` and the behaviour
        `logprobs`, flattened to [T * B] on the learner's device (no model involved)."""
        obs = np.asarray(rollout["obs"])
        if obs.dtype != np.uint8:
            obs = obs.astype(np.float32, copy=False)
        actions = np.asarray(rollout["actions"])
        actions = actions.astype(np.int64 if self.model.discrete else np.float32, copy=False)
        return {
            "obs": self._flat(obs),
            "actions": self._flat(actions),
            "logprobs": self._flat(np.asarray(rollout["logprobs"], dtype=np.float32)),
        }

    def _flat(self, x: np.ndarray) -> torch.Tensor:
        x = np.asarray(x)
        return torch.as_tensor(x.reshape(-1, *x.shape[2:]).copy(), device=self.device)

    def make_batch(self, rollout: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """GAE on the [T, B] rollout, then flatten to the batch [T * B] on the learner's device.

        With `decoupled` the batch depends on the model it is made with (the proximal policy's
        logprobs and the critic's values): `update` keeps those parts, and `probe_batch` hands
        them back, because after the update this method would rebuild them from the new model.
        """
        c = self.config
        flat = self._flat
        b = self.batch_inputs(rollout)
        values = np.asarray(rollout["values"], dtype=np.float32)
        last_values = np.asarray(rollout["last_values"], dtype=np.float32)
        if c.decoupled:
            # The proximal policy is the learner's own; its critic is also the one to anchor
            # GAE and the value clip on (actors that lag report an older critic's values).
            with torch.no_grad():
                _, prox_logprobs, _, prox_values = self.model(b["obs"], b["actions"])
                last_obs = np.asarray(rollout["last_obs"])
                if last_obs.dtype != np.uint8:
                    last_obs = last_obs.astype(np.float32, copy=False)
                last_values = self.model.value(torch.as_tensor(last_obs, device=self.device))
                last_values = last_values.cpu().numpy()
            values = prox_values.cpu().numpy().reshape(values.shape)
            b["is_weights"] = (prox_logprobs - b["logprobs"]).exp().clamp(max=2.0)
            b["logprobs"] = prox_logprobs
        advantages = compute_gae(
            np.asarray(rollout["rewards"], dtype=np.float32),
            values,
            rollout["terminated"],
            rollout["truncated"],
            np.asarray(rollout["bootstrap_values"], dtype=np.float32),
            last_values,
            c.gamma,
            c.gae_lambda,
        )
        b["advantages"] = flat(advantages)
        b["returns"] = flat(advantages + values)
        b["values"] = flat(values)
        return b

    def loss(
        self, mb: dict[str, torch.Tensor], params: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`ppo_loss` with this learner's model and the config of its last update (for probes:
        the loss the learner optimised, at the clip range that round's batch set)."""
        return ppo_loss(self.model, mb, self.loss_config, params)

    def probe_batch(self, rollout: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """The batch the last update optimised when `rollout` is the one it was given (the
        model-made parts as they were, the inputs rebuilt), else `make_batch(rollout)`."""
        kept = self.optimised_parts(rollout)
        if kept is None:
            return self.make_batch(rollout)
        return {**self.batch_inputs(rollout), **kept}

    def lr_size_factor(self, minibatch_samples: float) -> float:
        """Adam's square-root scaling rule (Malladi et al., 2022: the SDE of Adam is kept when
        the rate grows as the square root of the batch), relative to the minibatch size the
        rate was tuned at; 1 when no reference is set."""
        reference = self.config.lr_reference_minibatch
        return 1.0 if reference is None else math.sqrt(minibatch_samples / reference)

    def clip_for(self, batch_samples: int) -> float:
        """The clip range of a round of ``batch_samples`` (clip_reference_batch's rule)."""
        reference = self.config.clip_reference_batch
        scale = 1.0 if reference is None else math.sqrt(batch_samples / reference)
        return self.config.clip_coef * scale

    def update(
        self,
        rollout: dict[str, np.ndarray],
        progress: float,
        on_step: Callable[[int, int], None] | None = None,
    ) -> dict[str, float]:
        """K epochs of minibatch SGD on the clipped surrogate; returns CleanRL's diagnostics.

        `on_step(done, total)` runs after every optimiser step (the engine snapshots weights
        part-way through for pipelined actors)."""
        c = self.config
        self.optimised = None  # the last round's parts are stale now; free them first
        b = self.make_batch(rollout)
        self.remember_optimised(rollout, {k: v for k, v in b.items() if k in MODEL_PARTS})
        batch_size = b["obs"].shape[0]
        minibatches = c.num_minibatches if c.minibatch_size is None else \
            max(1, min(batch_size // 2, round(batch_size / c.minibatch_size)))
        total_steps = c.update_epochs * minibatches
        # Annealing the rate if instructed to do so, at the size of this round's minibatches.
        lrnow = set_learning_rate(self.optimizer, c.learning_rate * self.lr_size_factor(
            batch_size / minibatches), c.anneal_lr, progress)
        if c.clip_reference_batch is not None:
            c = self.loss_config = dataclasses.replace(c, clip_coef=self.clip_for(batch_size))

        # ALGO LOGIC: optimizing the policy and value network
        self.model.train()
        clipfracs: list[torch.Tensor] = []
        for _epoch in range(c.update_epochs):
            b_inds = torch.randperm(batch_size, device=self.device)
            # Shuffle once per epoch, then slice: minibatches are views, not one gather per
            # tensor per minibatch. Exactly `minibatches` near-equal parts: B (summed over
            # actors) need not divide, and a minibatch of one sample would make the std NaN.
            parts_of = {k: torch.tensor_split(v[b_inds], minibatches) for k, v in b.items()}
            for i in range(minibatches):
                mb = {k: v[i] for k, v in parts_of.items()}
                loss, parts = ppo_loss(self.model, mb, c)
                clipfracs.append(parts["clipfrac"])

                self.sgd_step(loss, c.max_grad_norm)
                if on_step is not None:
                    on_step(len(clipfracs), total_steps)

            if c.target_kl is not None and parts["approx_kl"].item() > c.target_kl:
                break

        b_values = b["values"].cpu().numpy()
        b_returns = b["returns"].cpu().numpy()
        return {
            "learning_rate": float(lrnow),
            "loss": loss.item(),
            "v_loss": parts["v_loss"].item(),
            "pg_loss": parts["pg_loss"].item(),
            "entropy": parts["entropy_loss"].item(),
            "old_approx_kl": parts["old_approx_kl"].item(),
            "approx_kl": parts["approx_kl"].item(),
            "clipfrac": torch.stack(clipfracs).mean().item(),
            "clip_coef": c.clip_coef,
            "explained_variance": explained_variance(b_values, b_returns),
        }
