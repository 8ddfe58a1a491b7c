"""V-trace off-policy targets (Espeholt et al., 2018, "IMPALA", section 4.1).

Actors sample with a policy that lags the learner's (the behaviour policy mu); V-trace turns
their trajectories into value targets ``vs`` and policy-gradient advantages for the learner's
current policy (the target policy pi), with truncated importance weights

    rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t)),   c_t = min(c_bar, pi / mu)
    delta_t V = rho_t * (r_t + gamma_t * V(x_{t+1}) - V(x_t))
    v_s = V(x_s) + delta_s V + gamma_s * c_s * (v_{s+1} - V(x_{s+1}))      (eq. 1, recursive)
    A_s = rho_s * (r_s + gamma_s * v_{s+1} - V(x_s))                       (the pg advantage)

Everything is time-first [T, B]; ``discounts[t] = gamma * (1 - done[t])``, so a done cuts the
trace exactly like the zero discount of the paper's episode boundaries. On-policy (pi = mu) with
rho_bar, c_bar >= 1 every weight is 1 and ``vs`` are the n-step returns bootstrapped from
``bootstrap_value``, i.e. TD(lambda = 1) targets.

IMPALA (`algos/impala.py`) and APPO (`algos/appo.py`) differ only in their loss; the batches of
whole env sequences, their forward pass and the update loop they share live here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from algos.core import LearnerCore, NetworkConfig, set_learning_rate
from algos.ppo import explained_variance

__all__ = ["SequenceForward", "VTraceConfig", "VTraceCore", "forward_sequences", "lag_parts",
           "make_sequence_batch", "reverse_linear_scan", "sequence_forward", "vtrace",
           "vtrace_loss"]


@torch.no_grad()
def vtrace(
    behaviour_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    discounts: torch.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(vs, pg_advantages)``, both [T, B] and without gradient.

    ``bootstrap_value`` [B] is V(x_T), the value after the last step. The pg advantages use the
    same clipping threshold ``rho_bar`` as the value targets (the paper's rho_bar; the reference
    implementation's separate ``clip_pg_rho_threshold`` defaults to the same 1.0).
    """
    rhos = torch.exp(target_logp - behaviour_logp)
    clipped_rhos = torch.clamp(rhos, max=rho_bar)
    cs = torch.clamp(rhos, max=c_bar)

    values_t_plus_1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)

    vs = reverse_linear_scan(discounts * cs, deltas) + values

    vs_t_plus_1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    pg_advantages = clipped_rhos * (rewards + discounts * vs_t_plus_1 - values)
    return vs, pg_advantages


def reverse_linear_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x [T, ...] with x_t = b_t + a_t * x_{t+1} and x_T = 0: here v_s - V(x_s) of eq. (1).

    A step-by-step loop launches ~4 operations per time step, a few thousand tiny kernels per
    update that leave a GPU idle while the host queues them. Recursive doubling (Hillis and
    Steele) gets the same sums in log2(T) rounds of whole-tensor operations: after the round
    with offset k, each (a_t, b_t) folds in the next 2k steps, x_t = b_t + a_t * x_{t+2k}. It
    multiplies only the a's themselves (no division, so a zero discount at an episode's end
    stays exact) and adds the same terms as the loop in another order.
    """
    a, b = a.clone(), b.clone()
    offset, steps = 1, a.shape[0]
    while offset < steps:
        b[:-offset] += a[:-offset] * b[offset:]
        a[:-offset] *= a[offset:].clone()
        offset *= 2
    return b


# ---- what IMPALA and APPO share: sequence batches, their forward pass, the update loop -------


@dataclass
class VTraceConfig(NetworkConfig):
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
    """the K epochs over each batch (1 in the IMPALA paper: every sample is used once)"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    anneal_lr: bool = True
    """toggle learning rate annealing: lr = (1 - progress) * learning_rate"""
    adam_eps: float = 1e-5
    """Adam's epsilon"""


def forward_sequences(
    model: nn.Module, mb: dict[str, torch.Tensor], params: dict[str, torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprob, entropy, value) as time-first [T, b] and the bootstrap value V(last_obs) [b].

    The last observations ride through the same forward as the rest (with a dummy action whose
    logprob is dropped), so one pass over the trunk gives the differentiated logprobs and values
    and the values V-trace needs, and one `functional_call` covers everything.
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


def lag_parts(behaviour_logp: torch.Tensor, target_logp: torch.Tensor, rho_bar: float
              ) -> dict[str, torch.Tensor]:
    """How far the behaviour policy lagged the target and how much of it V-trace corrects.

    `rho_mean` and `rho_clipfrac` (the share of frames whose weight was truncated at
    `rho_bar`) say how stale the data was; `rho_kept` = mean(min(rho, rho_bar)) / rho_bar is
    the share of the frames' importance weight the update trains on, 1 for on-policy data and
    falling towards 0 for frames the lag made useless."""
    rho = (target_logp - behaviour_logp).exp()
    return {
        "rho_mean": rho.mean(),
        "rho_clipfrac": (rho > rho_bar).float().mean(),
        "rho_kept": rho.clamp(max=rho_bar).mean() / rho_bar,
    }


class SequenceForward(NamedTuple):
    """One forward pass over a minibatch of env sequences and V-trace on it, time-first [T, b]."""

    newlogprob: torch.Tensor
    """the current policy's logprobs of the actions (with gradient)"""
    entropy: torch.Tensor
    newvalue: torch.Tensor
    """the current critic's values (with gradient)"""
    behaviour_logprobs: torch.Tensor
    """mu: the logprobs the actors sampled with"""
    target_logprobs: torch.Tensor
    """pi: the policy V-trace corrects towards (without gradient)"""
    vs: torch.Tensor
    pg_advantages: torch.Tensor


def sequence_forward(
    model: nn.Module,
    mb: dict[str, torch.Tensor],
    config: VTraceConfig,
    params: dict[str, torch.Tensor] | None,
    target_logprobs: torch.Tensor | None = None,
) -> SequenceForward:
    """The model's outputs on `mb` and V-trace's targets towards `target_logprobs` [T, b] (the
    current policy itself when None); values and the bootstrap come from the current model,
    without gradient in V-trace. One pass over the trunk serves both."""
    newlogprob, entropy, newvalue, bootstrap_value = forward_sequences(model, mb, params)
    behaviour = mb["logprobs"].T  # V-trace runs time-first: [T, b]
    target = newlogprob.detach() if target_logprobs is None else target_logprobs
    vs, pg_advantages = vtrace(
        behaviour,
        target,
        mb["rewards"].T,
        newvalue.detach(),
        bootstrap_value.detach(),
        mb["discounts"].T,
        rho_bar=config.rho_bar,
        c_bar=config.c_bar,
    )
    return SequenceForward(newlogprob, entropy, newvalue, behaviour, target, vs, pg_advantages)


def vtrace_loss(
    pg_loss: torch.Tensor,
    f: SequenceForward,
    config: VTraceConfig,
    diagnostics: dict[str, torch.Tensor],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A V-trace learner's loss from its policy loss: the critic regressed towards the V-trace
    targets, minus the entropy bonus; and the named parts (detached), `diagnostics` and the lag
    (`lag_parts`) among them."""
    v_loss = 0.5 * ((f.newvalue - f.vs) ** 2).mean()
    entropy_loss = f.entropy.mean()
    loss = pg_loss - config.ent_coef * entropy_loss + v_loss * config.vf_coef
    parts = {
        "pg_loss": pg_loss.detach(),
        "v_loss": v_loss.detach(),
        "entropy_loss": entropy_loss.detach(),
        **diagnostics,
        **lag_parts(f.behaviour_logprobs, f.target_logprobs, config.rho_bar),
        "vs": f.vs,
        "newvalue": f.newvalue.detach(),
    }
    return loss, parts


class VTraceCore(LearnerCore):
    """The update loop of the V-trace learners; a subclass supplies its loss (and may refresh a
    target network before each update in `before_update`).

    Minibatches are sets of whole env sequences (V-trace runs backwards through time), drawn
    from one permutation of the envs per epoch.
    """

    config: VTraceConfig
    #: The configuration a core built without one gets (its defaults).
    config_class: type[VTraceConfig] = VTraceConfig
    #: Loss parts averaged over every minibatch of an update; the others are the last one's.
    averaged_parts: tuple[str, ...] = ()

    def __init__(
        self,
        spaces: dict[str, Any],
        config: VTraceConfig | None = None,
        device: str | torch.device = "cpu",
    ):
        super().__init__(spaces, config if config is not None else self.config_class(), device)

    def make_batch(self, rollout: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """The [T, B] rollout as env-major tensors on the learner's device."""
        return make_sequence_batch(rollout, self.config.gamma, self.model.discrete, self.device)

    def loss(
        self, mb: dict[str, torch.Tensor], params: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def before_update(self) -> None:
        """Runs before the batch is made (APPO refreshes its target network here)."""

    def update(self, rollout: dict[str, np.ndarray], progress: float) -> dict[str, float]:
        """K epochs of SGD over env-sequence minibatches; returns diagnostics."""
        c = self.config
        lrnow = set_learning_rate(self.optimizer, c.learning_rate, c.anneal_lr, progress)
        self.before_update()
        b = self.make_batch(rollout)
        num_envs = b["rewards"].shape[0]

        # ALGO LOGIC: V-trace targets inside each subclass's loss
        self.model.train()
        # Kept on the device and read once at the end: an .item() per minibatch would make the
        # host wait for each step on a GPU.
        history: dict[str, list[torch.Tensor]] = {k: [] for k in self.averaged_parts}
        for _epoch in range(c.update_epochs):
            b_inds = torch.randperm(num_envs, device=self.device)
            for mb_inds in torch.tensor_split(b_inds, min(c.num_minibatches, num_envs)):
                mb = {k: v[mb_inds] for k, v in b.items()}
                loss, parts = self.loss(mb)
                for k, values in history.items():
                    values.append(parts[k])

                self.sgd_step(loss, c.max_grad_norm)

        metrics = {"learning_rate": float(lrnow), "loss": loss.item()}
        for k, v in parts.items():
            if v.ndim == 0:
                name = "entropy" if k == "entropy_loss" else k
                metrics[name] = (torch.stack(history[k]).double().mean().item() if k in history
                                 else v.item())
        metrics["explained_variance"] = explained_variance(
            parts["newvalue"].cpu().numpy(), parts["vs"].cpu().numpy()
        )
        return metrics

