"""What every learner core shares, so PPO, IMPALA and APPO differ only where the math does.

A core owns an actor-critic model and its Adam optimiser; it tells actors how to rebuild the
policy (`actor_spec`), hands out weights as numpy copies, and saves and restores itself. The
algorithm — `make_batch`, `loss`, `update` — is the subclass's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn, optim

from algos.flat import FlatParameters
from algos.nets import ActorCritic

Rollout = dict[str, np.ndarray]
#: Tensors by name: a minibatch, a set of parameters, a loss's named parts.
Tensors = dict[str, torch.Tensor]

#: Annealing must never reach lr = 0 exactly: Adam would then silently stop moving at progress 1.
MIN_LEARNING_RATE = 1e-10


@dataclass
class NetworkConfig:
    """The actor-critic network's hyperparameters, shared by the stock cores' configs."""

    hidden_sizes: tuple[int, ...] = (64, 64)
    """hidden layer sizes of the actor and critic MLPs (ignored for pixel observations)"""
    activation: str = "tanh"
    """activation of the MLPs ("tanh" or "relu")"""
    cnn_dtype: str = "float32"
    """compute dtype of the learner's Nature-CNN trunk ("float32", or "bfloat16" under
    autocast: 2-3x faster updates on a CPU with native bfloat16, emulated and slower elsewhere)"""
    actor_dtype: str = "float32"
    """arithmetic of the actors' Nature-CNN forward ("float32", or "int8": 8-bit products on
    ONNX Runtime, calibrated per weights version; the learner and evaluation stay exact)"""


class NetConfig(Protocol):
    learning_rate: float
    hidden_sizes: tuple[int, ...]
    activation: str


def set_learning_rate(optimizer: optim.Optimizer, lr: float, anneal: bool, progress: float
                      ) -> float:
    """Linear annealing to (almost) 0 at progress 1; returns the rate now in force."""
    lrnow = lr
    if anneal:
        lrnow = max((1.0 - min(max(progress, 0.0), 1.0)) * lr, MIN_LEARNING_RATE)
    optimizer.param_groups[0]["lr"] = lrnow
    return lrnow


class LearnerCore:
    """The model, the optimiser, what actors need and checkpoints; no I/O, no threads."""

    def __init__(self, spaces: dict[str, Any], config: NetConfig, device: str | torch.device):
        self.spaces = spaces
        self.config = config
        self.device = torch.device(device)
        # A config without the field (an algorithm of a user's, written before it) keeps
        # the trunk in float32.
        cnn_dtype = getattr(config, "cnn_dtype", "float32")
        self.model = ActorCritic(spaces, config.hidden_sizes, config.activation,
                                 cnn_dtype).to(self.device)
        #: One buffer for every weight and one for every gradient (see `algos.flat`).
        self.flat = FlatParameters(self.model)
        self.optimizer = self.make_optimizer()
        # The optimiser's own zero_grad() would drop the flat gradient and leave the views'
        # gradients accumulating; a core that steps by hand must get the buffer's zeroing.
        self.optimizer.zero_grad = self.flat.zero_grad  # type: ignore[method-assign,assignment]
        #: The last update's rollout and the batch parts its model made (see `probe_batch`).
        self.optimised: tuple[Rollout, dict[str, torch.Tensor]] | None = None
        #: The parameters the last update started from (see `remember_optimised`).
        self.params_before: dict[str, torch.Tensor] | None = None

    def make_optimizer(self) -> optim.Optimizer:
        """Adam, as PPO, IMPALA and APPO use; a core with another optimiser overrides this.

        The fused kernel updates every parameter in one call: on a 64x64 MLP's minibatch of 64
        it cuts the whole SGD step by a fifth against the default multi-tensor Adam. It steps
        the flat parameter buffer: Adam is elementwise, so that is the same update.
        """
        return optim.Adam([self.flat.param], lr=self.config.learning_rate,
                          eps=self.config.adam_eps,
                          fused=self.device.type in ("cpu", "cuda") or None)

    # ---- what actors need -------------------------------------------------------------------
    def actor_spec(self) -> dict[str, Any]:
        """JSON-able recipe for `algos.policy.ActorPolicy`."""
        net = {"hidden_sizes": list(self.config.hidden_sizes), "activation": self.config.activation,
               "actor_dtype": getattr(self.config, "actor_dtype", "float32")}
        return {"spaces": self.spaces, "net": net}

    def weights(self) -> dict[str, np.ndarray]:
        """The model's state_dict as float32 CPU numpy copies (safe to encode while training)."""
        return {
            k: v.detach().to("cpu", torch.float32).clone().numpy()
            for k, v in self.model.state_dict().items()
        }

    # ---- the batch, and what probes see of it -------------------------------------------------
    def make_batch(self, rollout: Rollout) -> dict[str, torch.Tensor]:
        """The rollout as the tensors the loss takes (the subclass's algorithm)."""
        raise NotImplementedError

    def probe_batch(self, rollout: Rollout) -> dict[str, torch.Tensor]:
        """The batch a probe differentiates after the update: the one the update optimised.

        `make_batch(rollout)` here, right for a core whose batch does not depend on the model;
        a core whose batch does (PPO's decoupled proximal policy) overrides this with what it
        kept through `remember_optimised`, since rebuilding after the update would measure the
        updated model against itself (a PPO ratio of exactly 1)."""
        return self.make_batch(rollout)

    def remember_optimised(self, rollout: Rollout, parts: dict[str, torch.Tensor]) -> None:
        """Keep the model-made `parts` of the batch the update is about to optimise, and the
        parameters it starts from: the gradient noise the update faced is measured there (after
        the update the batch's own gradient is near zero by construction)."""
        self.optimised = (rollout, parts)
        self.params_before = {k: v.detach().clone() for k, v in self.model.named_parameters()}

    def optimised_parts(self, rollout: Rollout) -> dict[str, torch.Tensor] | None:
        """The kept parts if `rollout` is the very object the last update was given, else None
        (identity, not equality: comparing whole rollouts would cost a copy's worth of time)."""
        kept = self.optimised
        return kept[1] if kept is not None and kept[0] is rollout else None

    # ---- one optimiser step -----------------------------------------------------------------
    def sgd_step(self, loss: torch.Tensor, max_grad_norm: float) -> torch.Tensor:
        """Backward, clip the global gradient norm, step; returns the norm before clipping.

        The norm stays a tensor on the learner's device: reading it (``float``, ``.item()``)
        waits for the GPU to finish the step, and one such wait per minibatch stops the host
        from queueing the next step's kernels while this one runs."""
        self.flat.check_bound()
        self.flat.zero_grad()
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.flat.param, max_grad_norm)
        self.optimizer.step()
        return grad_norm

    # ---- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(flat_optimizer_state(state["optimizer"], self.flat))


def flat_optimizer_state(saved: dict[str, Any], flat: FlatParameters) -> dict[str, Any]:
    """Checkpoints written before `algos.flat` hold Adam's moments per parameter: concatenate
    them in parameter order (the flat buffer's layout) so such a run resumes where it was."""
    groups = saved["param_groups"]
    if len(flat.params) == 1 or len(groups) != 1 or len(groups[0]["params"]) != len(flat.params):
        return saved  # already flat, or not ours: the optimiser's own checks report it
    group = groups[0]
    per_param = [saved["state"].get(i, {}) for i in group["params"]]
    state: dict[int, Any] = {}
    if all(per_param):
        state[0] = {"step": torch.as_tensor(per_param[0]["step"]).clone()}
        for key in ("exp_avg", "exp_avg_sq"):
            state[0][key] = torch.cat([s[key].reshape(-1) for s in per_param])
    return {"state": state, "param_groups": [{**group, "params": [0]}]}
