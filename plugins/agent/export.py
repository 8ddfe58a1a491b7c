"""Standalone policy files from a trained run: ONNX, TorchScript or safetensors.

ONNX and TorchScript files hold one function, ``action = f(obs)`` for a batch of raw
observations: the run's observation normalisation and clipping are baked in, then the
actor's deterministic head (argmax, or the Gaussian mean clipped to the action bounds), so a
deployment needs no Nitro, only a runtime. The safetensors file holds the weights and the
normalisation statistics as tensors, with the network recipe and env spec as JSON metadata,
for users who rebuild the network in their own code.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from plugins.agent.policy import Policy

FORMATS = {"onnx": ".onnx", "torchscript": ".pt", "safetensors": ".safetensors"}
#: ONNX opset: 17 is read by every ONNX Runtime of the last years.
OPSET = 17


class DeployedPolicy(nn.Module):
    """Raw observations [B, *obs_shape] -> env actions [B] or [B, *action_shape]."""

    def __init__(self, policy: Policy):
        super().__init__()
        model = policy.torch_model()
        self.trunk = model.trunk
        self.actor = model.actor
        self.discrete = policy.discrete
        f = policy.obs_filter
        self.normalize = f.enabled
        self.clip = float(f.clip)
        shape = policy.obs_shape
        mean = f.mean if f.mean is not None else np.zeros(shape)
        scale = f.scale if f.scale is not None else np.ones(shape)
        # float64 like the actors' transform, so exported actions match predict() exactly.
        self.register_buffer("obs_mean", torch.from_numpy(np.asarray(mean, dtype=np.float64)))
        self.register_buffer("obs_scale", torch.from_numpy(np.asarray(scale, dtype=np.float64)))
        if not self.discrete:
            action = policy.action
            low = np.asarray(action["low"], dtype=np.float32).reshape(action["shape"])
            high = np.asarray(action["high"], dtype=np.float32).reshape(action["shape"])
            self.register_buffer("action_low", torch.from_numpy(low))
            self.register_buffer("action_high", torch.from_numpy(high))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.normalize:
            x = ((obs.double() - self.obs_mean) / self.obs_scale).clamp(-self.clip, self.clip)
            x = x.float()
        else:
            x = obs.float()  # uint8 frames: the CNN's own /255 gives the same as on uint8
        out = self.actor(self.trunk(x))
        if self.discrete:
            return out.argmax(-1)
        return torch.minimum(torch.maximum(out, self.action_low), self.action_high)


def _example(policy: Policy) -> torch.Tensor:
    dtype = torch.uint8 if policy.spaces["obs_dtype"] == "uint8" else torch.float32
    return torch.zeros((2, *policy.obs_shape), dtype=dtype)


def export_torchscript(policy: Policy, out: Path) -> None:
    """A traced module: ``torch.jit.load(out)(obs)`` in any torch, without Nitro."""
    module = DeployedPolicy(policy).train(False)
    with torch.no_grad():
        traced = torch.jit.trace(module, _example(policy))
    torch.jit.save(traced, str(out))


def export_onnx(policy: Policy, out: Path) -> None:
    """One input ``obs`` and one output ``action``, both with a dynamic batch axis.

    The TorchScript-based exporter: it needs no extra package and takes well under a second;
    its deprecation warning is torch's, not the user's business, so it is silenced.
    """
    module = DeployedPolicy(policy).train(False)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (_example(policy),), str(out), input_names=["obs"],
            output_names=["action"], dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
            opset_version=OPSET, dynamo=False,
        )


def export_safetensors(policy: Policy, out: Path) -> None:
    """Weights as ``model.<name>``, statistics as ``obs_rms.mean``/``obs_rms.var``."""
    from safetensors.numpy import save_file

    tensors: dict[str, np.ndarray] = {
        f"model.{k}": np.ascontiguousarray(v) for k, v in policy.weights.items()
    }
    if policy.obs_rms:
        for key in ("mean", "var"):
            tensors[f"obs_rms.{key}"] = np.ascontiguousarray(policy.obs_rms[key],
                                                             dtype=np.float64)
    metadata = {
        "format": "nitro-policy",
        "actor_spec": json.dumps(policy.actor_spec),
        "env": json.dumps(policy.env_spec),
    }
    save_file(tensors, str(out), metadata=metadata)


def export(policy: Policy, fmt: str, out: Path) -> Path:
    """Write ``policy`` in format ``fmt`` to ``out``; returns the path written."""
    writers: dict[str, Any] = {"onnx": export_onnx, "torchscript": export_torchscript,
                               "safetensors": export_safetensors}
    if fmt not in writers:
        raise ValueError(f"unknown export format {fmt!r} (one of {', '.join(FORMATS)})")
    out.parent.mkdir(parents=True, exist_ok=True)
    writers[fmt](policy, out)
    return out
