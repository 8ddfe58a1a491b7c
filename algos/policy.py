"""The actor's side of the policy: numpy in, numpy out, on CPU, no autograd.

Actors step a few envs at a time, so one forward costs ~0.07 ms and per-call overhead
(distribution objects, argument validation, autograd bookkeeping) would dominate. `act`
therefore samples and scores actions with plain tensor ops instead of building a
`torch.distributions` object; `tests/test_algos_ppo.py` checks it against the learner's model.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from algos.nets import ActorCritic, weights_loaded_later

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _as_tensor(obs: np.ndarray) -> torch.Tensor:
    """Wrap without copying when possible; decoded arrays are read-only, which torch rejects."""
    obs = np.asarray(obs)
    if obs.dtype.kind == "f" and obs.dtype != np.float32:
        obs = obs.astype(np.float32)  # some envs emit float64; the weights are float32
    elif not obs.flags.writeable:
        obs = obs.copy()
    return torch.from_numpy(obs)


class ActorPolicy:
    """Builds the learner's `ActorCritic` from `actor_spec()` and runs it for sampling."""

    def __init__(self, spec: dict[str, Any]):
        net = dict(spec.get("net", {}))
        with weights_loaded_later():  # load() overwrites every parameter before first use
            self.model = ActorCritic(
                spec["spaces"],
                hidden_sizes=tuple(net.get("hidden_sizes", (64, 64))),
                activation=net.get("activation", "tanh"),
            )
        self.model.train(False)  # inference only: no dropout/batch-norm updates
        self.discrete = self.model.discrete
        #: The policy's own random stream, reseeded per invocation (`reseed`): which warm
        #: process runs a call must not change the actions it samples.
        self.generator = torch.Generator()

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def load(self, weights: dict[str, Any]) -> None:
        """Copy in the learner's weights (state_dict names). Keys the model lacks, such as
        normalisation statistics riding in the same dict, are ignored; missing ones raise."""
        names = self.model.state_dict().keys()
        missing = [k for k in names if k not in weights]
        if missing:
            raise KeyError(f"weights lack parameters {missing}")
        state = {k: torch.from_numpy(np.array(weights[k], dtype=np.float32)) for k in names}
        self.model.load_state_dict(state)

    @torch.inference_mode()
    def act(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sample actions for a batch [E, *obs_shape]; also return their logprobs and values."""
        actor_out, values = self.model.heads(_as_tensor(obs))
        if self.discrete:
            log_probs = torch.log_softmax(actor_out, dim=-1)
            actions = torch.multinomial(log_probs.exp(), 1, generator=self.generator)
            logprobs = log_probs.gather(-1, actions).squeeze(-1)
            actions = actions.squeeze(-1)
        else:
            log_std = self.model.actor_logstd.expand_as(actor_out)
            noise = torch.randn(actor_out.shape, generator=self.generator)
            actions = actor_out + noise * log_std.exp()
            # log N(a; mu, std) summed over action dims, with (a - mu) / std = noise.
            logprobs = (-0.5 * noise.square() - log_std - _LOG_SQRT_2PI).sum(-1)
        extras = {"logprobs": logprobs.numpy(), "values": values.numpy()}
        return actions.numpy(), extras

    @torch.inference_mode()
    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        """Most likely action (argmax / Gaussian mean), for evaluation."""
        actor_out = self.model.actor(self.model.trunk(_as_tensor(obs)))
        return (actor_out.argmax(-1) if self.discrete else actor_out).numpy()

    @torch.inference_mode()
    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) [E], e.g. for the truncation bootstrap on a final observation."""
        return self.model.value(_as_tensor(obs)).numpy()
