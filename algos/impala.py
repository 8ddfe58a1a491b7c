"""IMPALA's learner core (V-trace actor-critic, Espeholt et al. 2018), laid out like `ppo.py`.

The actors' batches were sampled by a policy that may lag the learner's (each batch carries its
`version`); V-trace (`algos/vtrace.py`) corrects that lag with truncated importance weights.
Unlike PPO's flat minibatches, a V-trace minibatch keeps whole env sequences: the targets run
backwards through time, so minibatches split the env axis and never the time axis. Batches are
therefore env-major ([B, T, ...]): indexing dim 0 picks sequences, for us and for probes.

`update` (the loop shared with APPO, `algos.vtrace.VTraceCore`) takes the round's rollouts
(time-first [T, B], see `docs/contracts.md`) and returns scalar diagnostics; the loss is the
pure function `impala_loss` so that probes can take gradients and Hessian-vector products of
exactly what the learner optimises:

    b = impala.make_batch(rollout)
    f = lambda p: impala.loss(b, p)[0]          # b is env-major: b[k][idx] picks sequences
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from algos.core import Tensors
from algos.vtrace import VTraceConfig, VTraceCore, sequence_forward, vtrace_loss


@dataclass
class IMPALAConfig(VTraceConfig):
    """IMPALA's hyperparameters: `VTraceConfig`'s, whose one epoch of one minibatch is the
    paper's (every sample is used once)."""


def impala_loss(model: nn.Module, mb: Tensors, config: IMPALAConfig, params: Tensors | None = None
                ) -> tuple[torch.Tensor, Tensors]:
    """IMPALA's loss on a minibatch of b env sequences, and its named parts (detached).

    V-trace runs on the current model's logprobs and values (without gradient); the gradient
    flows through `newlogprob` (policy) and `newvalue` (critic) only.
    """
    f = sequence_forward(model, mb, config, params)
    logratio = (f.newlogprob - f.behaviour_logprobs).detach()

    # Policy loss: pg_advantages already carry the truncated weight rho_s (paper, eq. 4)
    pg_loss = -(f.pg_advantages * f.newlogprob).mean()
    # Value loss and entropy bonus: `vtrace_loss` regresses V(x_s) towards v_s
    return vtrace_loss(pg_loss, f, config, {
        # KL(behaviour || current) estimate, http://joschu.net/blog/kl-approx.html
        "approx_kl": ((logratio.exp() - 1) - logratio).mean(),
    })


class IMPALA(VTraceCore):
    """The IMPALA learner core: V-trace targets, policy gradient with an entropy bonus."""

    config: IMPALAConfig
    config_class = IMPALAConfig
    averaged_parts = ("rho_clipfrac",)

    def loss(
        self, mb: dict[str, torch.Tensor], params: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`impala_loss` with this learner's model and config (for probes)."""
        return impala_loss(self.model, mb, self.config, params)
