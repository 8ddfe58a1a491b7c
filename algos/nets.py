"""Actor-critic networks, built from the JSON spaces description of `docs/contracts.md`.

The layout follows CleanRL: separate actor and critic MLPs for vector observations
(`ppo_continuous_action.py`), one shared Nature-CNN trunk for pixels (`ppo_atari.py`), and
orthogonal initialisation with small policy heads so the first policy is close to uniform.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Independent, Normal

L = TypeVar("L", nn.Linear, nn.Conv2d)

_HALF_LOG_2PI = 0.5 * float(np.log(2 * np.pi))

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}

#: The Nature-CNN trunk's compute dtypes: float32 as built, or bfloat16 under autocast.
COMPUTE_DTYPES: dict[str, torch.dtype | None] = {"float32": None, "bfloat16": torch.bfloat16}


_skip_init = contextvars.ContextVar("skip_init", default=False)


@contextlib.contextmanager
def weights_loaded_later() -> Iterator[None]:
    """Build models without orthogonal init, for copies whose weights are loaded right after
    (an actor's policy): the QR of the Nature CNN's 3136x512 layer alone costs ~0.9 s of every
    cold start."""
    token = _skip_init.set(True)
    try:
        yield
    finally:
        _skip_init.reset(token)


def layer_init(layer: L, std: float = float(np.sqrt(2)), bias_const: float = 0.0) -> L:
    """Orthogonal weights, constant bias: the initialisation PPO's reference results rely on."""
    if not _skip_init.get():
        torch.nn.init.orthogonal_(layer.weight, std)
        torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(
    in_dim: int, hidden_sizes: Sequence[int], out_dim: int, activation: str, out_std: float
) -> nn.Sequential:
    """Hidden layers with gain sqrt(2); the output layer's gain `out_std` sets its initial scale."""
    layers: list[nn.Module] = []
    for size in hidden_sizes:
        layers += [layer_init(nn.Linear(in_dim, size)), ACTIVATIONS[activation]()]
        in_dim = size
    layers.append(layer_init(nn.Linear(in_dim, out_dim), std=out_std))
    return nn.Sequential(*layers)


class NatureCNN(nn.Module):
    """The DQN-Nature encoder: uint8 frames [N, C, 84, 84] -> 512 features.

    Scaling by 1/255 happens here so rollouts can carry pixels as uint8 (4x less data). The
    frames enter the convolutions channels-last: oneDNN's CPU convolutions (forward and
    backward) run on NHWC without reordering, about 1.6x faster per update step than on the
    NCHW layout; the weights keep their own layout, so the flat parameter buffer is unchanged.
    Reordering the uint8 frames before the division moves a quarter of the bytes, and the
    division casts to float32 in the same pass.

    ``compute_dtype="bfloat16"`` runs the trunk under autocast: on a CPU with AMX (Intel
    Sapphire Rapids and later) oneDNN's bfloat16 convolutions make a whole APPO or IMPALA
    update two to three times faster than float32; on a CPU without native bfloat16 it is
    emulated and slower. The weights, their gradients and everything after the trunk (heads,
    losses, the optimiser) stay float32; only the trunk's products round to bfloat16's 8-bit
    mantissa.
    """

    def __init__(self, in_channels: int = 4, frame_hw: Sequence[int] = (84, 84),
                 compute_dtype: str = "float32"):
        super().__init__()
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)}, "
                             f"not {compute_dtype!r}")
        self.autocast_dtype = COMPUTE_DTYPES[compute_dtype]
        self.convs = nn.Sequential(
            layer_init(nn.Conv2d(in_channels, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():  # the flattened size depends on the frame size (64*7*7 for 84x84)
            n_flat = self.convs(torch.zeros(1, in_channels, *frame_hw)).shape[1]
        self.fc = nn.Sequential(layer_init(nn.Linear(n_flat, 512)), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        if self.autocast_dtype is None:
            return self.fc(self.convs(x / 255.0))
        # Pixels 0-255 are exact in bfloat16: scaling after the cast rounds once, as autocast
        # would, and moves half the bytes of a float32 intermediate.
        x = x.to(self.autocast_dtype).mul_(1.0 / 255.0)
        with torch.autocast(x.device.type, dtype=self.autocast_dtype):
            return self.fc(self.convs(x)).float()


class ActorCritic(nn.Module):
    """Policy and value function for a discrete (categorical) or box (diagonal Gaussian) action.

    Vector observations get two independent MLPs; uint8 images of rank 3 get one shared
    `NatureCNN` trunk with linear heads. The Gaussian's log std is a state-independent
    parameter (initialised to 0, i.e. std 1), as in CleanRL.
    """

    def __init__(
        self,
        spaces: dict[str, Any],
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        cnn_dtype: str = "float32",
    ):
        super().__init__()
        obs_shape = tuple(spaces["obs_shape"])
        action = spaces["action"]
        self.discrete = action["kind"] == "discrete"
        self.pixels = spaces["obs_dtype"] == "uint8" and len(obs_shape) == 3
        out_dim = int(action["n"]) if self.discrete else int(np.prod(action["shape"]))

        if self.pixels:
            self.trunk: nn.Module = NatureCNN(obs_shape[0], obs_shape[1:], cnn_dtype)
            self.actor: nn.Module = layer_init(nn.Linear(512, out_dim), std=0.01)
            self.critic: nn.Module = layer_init(nn.Linear(512, 1), std=1.0)
        else:
            # Flatten only for rank > 1 observations; a batch always comes first.
            self.trunk = nn.Flatten() if len(obs_shape) > 1 else nn.Identity()
            in_dim = int(np.prod(obs_shape))
            self.actor = mlp(in_dim, hidden_sizes, out_dim, activation, out_std=0.01)
            self.critic = mlp(in_dim, hidden_sizes, 1, activation, out_std=1.0)
        if not self.discrete:
            self.actor_logstd = nn.Parameter(torch.zeros(1, out_dim))

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits or Gaussian mean, value [N]) with the trunk evaluated once."""
        hidden = self.trunk(obs)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.trunk(obs)).squeeze(-1)

    def make_dist(self, actor_out: torch.Tensor) -> Distribution:
        """Categorical over logits, or a diagonal Gaussian whose log_prob/entropy sum over dims."""
        if self.discrete:
            return Categorical(logits=actor_out, validate_args=False)
        std = self.actor_logstd.expand_as(actor_out).exp()
        return Independent(Normal(actor_out, std, validate_args=False), 1, validate_args=False)

    def dist(self, obs: torch.Tensor) -> Distribution:
        return self.make_dist(self.actor(self.trunk(obs)))

    def get_action_and_value(
        self, obs: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(action, logprob, entropy, value); samples an action when none is given.

        Scoring given actions (every learner minibatch) uses the closed forms below rather than
        a `torch.distributions` object, whose construction and checks cost about a tenth of a
        small MLP's whole SGD step; the values are the same formulas `Normal` and `Categorical`
        evaluate.
        """
        actor_out, value = self.heads(obs)
        if action is None:
            action = self.make_dist(actor_out).sample()
        if self.discrete:
            log_probs = torch.log_softmax(actor_out, dim=-1)
            logprob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(log_probs.exp() * log_probs).sum(-1)
        else:
            log_std = self.actor_logstd.expand_as(actor_out)
            z = (action - actor_out) * torch.exp(-log_std)
            logprob = (-0.5 * z.square() - log_std).sum(-1) - _HALF_LOG_2PI * actor_out.shape[-1]
            entropy = (log_std + (0.5 + _HALF_LOG_2PI)).sum(-1)
        return action, logprob, entropy, value

    # `forward` is what `torch.func.functional_call` runs, so the loss can be taken functionally.
    forward = get_action_and_value
