"""The MLP actor-critic's sampling side in plain numpy: no torch in the actor.

Two reasons. Speed: an actor steps a few envs at a time, and a 64x64 MLP forward on 4 rows is
a dozen tiny operations whose cost is per call — about 60 us in numpy against 175 us in
eager torch here, a sixth of a Hopper actor's whole time. Start-up: `import torch` takes about
a second, which every cold serverless actor would pay; a vector-observation actor never
imports it now. Pixel policies (the Nature CNN) still run `algos.policy.ActorPolicy`.

The math is the learner's `algos.nets.ActorCritic` (same layers, float32, same formulas for
the Gaussian and the categorical); `tests/test_policy_numpy.py` checks it against that model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0, out=x),
}


def is_mlp_spec(spec: Mapping[str, Any]) -> bool:
    """Vector observations: the learner builds MLPs, which this module can run."""
    spaces = spec["spaces"]
    return not (spaces["obs_dtype"] == "uint8" and len(spaces["obs_shape"]) == 3)


class _MLP:
    """Linear layers with an activation between them, weights transposed once on load.

    The layout is `algos.nets.mlp`'s: Linear modules at even indices of an `nn.Sequential`,
    `layers` of them; shapes must chain from `in_dim` to `out_dim`.
    """

    def __init__(self, prefix: str, weights: Mapping[str, Any], layers: int, in_dim: int,
                 out_dim: int, activation: str):
        names = [f"{prefix}.{2 * i}.{part}" for i in range(layers) for part in ("weight", "bias")]
        missing = [k for k in names if k not in weights]
        if missing:
            raise KeyError(f"weights lack parameters {missing}")
        self.layers = []
        for i in range(layers):
            w = np.asarray(weights[f"{prefix}.{2 * i}.weight"], dtype=np.float32)
            b = np.array(weights[f"{prefix}.{2 * i}.bias"], dtype=np.float32)
            if w.ndim != 2 or w.shape[1] != in_dim or b.shape != (w.shape[0],):
                raise ValueError(f"{prefix}.{2 * i} has shape {w.shape}, expected (*, {in_dim})")
            self.layers.append((np.ascontiguousarray(w.T), b))
            in_dim = w.shape[0]
        if in_dim != out_dim:
            raise ValueError(f"{prefix} outputs {in_dim} values, expected {out_dim}")
        self.activation = ACTIVATIONS[activation]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        last = len(self.layers) - 1
        for i, (w, b) in enumerate(self.layers):
            x = x @ w
            x += b
            if i < last:
                x = self.activation(x)
        return x


def sample_actions(out: np.ndarray, log_std: np.ndarray, rng: np.random.Generator,
                   discrete: bool, values: np.ndarray
                   ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Actions drawn from the policy head's output `out` [E, n] (categorical logits, or the
    Gaussian mean with state-independent `log_std`), with their logprobs; the formulas of
    `algos.nets.ActorCritic`, so any numpy-side policy scores actions as the learner does."""
    if discrete:
        shifted = out - out.max(axis=-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        cdf = np.cumsum(np.exp(log_probs), axis=-1)
        u = rng.random((len(out), 1), dtype=np.float32) * cdf[:, -1:]
        actions = np.minimum((cdf < u).sum(axis=-1), out.shape[-1] - 1)
        logprobs = np.take_along_axis(log_probs, actions[:, None], axis=-1)[:, 0]
    else:
        noise = rng.standard_normal(out.shape, dtype=np.float32)
        actions = out + noise * np.exp(log_std)
        # log N(a; mu, std) summed over action dims, with (a - mu) / std = noise.
        logprobs = (-0.5 * noise * noise - log_std - _HALF_LOG_2PI).sum(axis=-1)
    return actions, {"logprobs": logprobs.astype(np.float32), "values": values}


class MLPPolicy:
    """Drop-in for `ActorPolicy` on vector observations (same spec, weights and methods)."""

    def __init__(self, spec: Mapping[str, Any]):
        if not is_mlp_spec(spec):
            raise ValueError("MLPPolicy runs vector observations; pixels need ActorPolicy")
        net = dict(spec.get("net", {}))
        self.layers = len(net.get("hidden_sizes", (64, 64))) + 1
        self.activation = str(net.get("activation", "tanh"))
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}")
        action = spec["spaces"]["action"]
        self.discrete = action["kind"] == "discrete"
        self.out_dim = int(action["n"]) if self.discrete else int(np.prod(action["shape"]))
        self.obs_size = int(np.prod(spec["spaces"]["obs_shape"]))
        self.actor: _MLP | None = None
        self.critic: _MLP | None = None
        self.log_std = np.zeros((1, 0), dtype=np.float32)
        #: The policy's own random stream, reseeded per invocation (see `ActorPolicy`).
        self.rng = np.random.default_rng()

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def load(self, weights: Mapping[str, Any]) -> None:
        """The learner's state_dict names; extra keys (e.g. obs statistics) are ignored."""
        actor = _MLP("actor", weights, self.layers, self.obs_size, self.out_dim, self.activation)
        critic = _MLP("critic", weights, self.layers, self.obs_size, 1, self.activation)
        if not self.discrete:
            if "actor_logstd" not in weights:
                raise KeyError("weights lack parameters ['actor_logstd']")
            log_std = np.array(weights["actor_logstd"], dtype=np.float32).reshape(1, -1)
            if log_std.shape[1] != self.out_dim:
                raise ValueError(f"actor_logstd has {log_std.shape[1]} values, not {self.out_dim}")
            self.log_std = log_std
        self.actor, self.critic = actor, critic

    def _flat(self, obs: np.ndarray) -> np.ndarray:
        if self.actor is None or self.critic is None:
            raise RuntimeError("load weights before acting")
        return np.asarray(obs, dtype=np.float32).reshape(len(obs), self.obs_size)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sample actions for a batch [E, *obs_shape]; also return their logprobs and values."""
        x = self._flat(obs)
        values = self.critic(x)[:, 0]  # type: ignore[misc]
        return sample_actions(self.actor(x), self.log_std, self.rng, self.discrete, values)  # type: ignore[misc]

    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        """Most likely action (argmax / Gaussian mean), for evaluation."""
        out = self.actor(self._flat(obs))  # type: ignore[misc]
        return out.argmax(axis=-1) if self.discrete else out

    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) [E], e.g. for the truncation bootstrap on a final observation."""
        return self.critic(self._flat(obs))[:, 0]  # type: ignore[misc]

