"""The stock actor policy of the algo plugins: ``actor="algos.actor:make_actor_policy"``.

It picks the cheapest implementation that runs the learner's `algos.nets.ActorCritic`:

- numpy for MLPs (`algos.policy_numpy.MLPPolicy`): faster on a few envs, and no `import torch`
  in a cold actor;
- ONNX Runtime for the Nature CNN (`algos.policy_onnx.CNNPolicy`) when the optional ``onnx``
  extra is installed: at an actor's handful of frames its forward takes about half of eager
  torch's time, which is most of a pixel actor's step, and a cold actor skips `import torch`;
  an int8 ``net.actor_dtype`` needs it (only its graph has 8-bit products);
- torch otherwise (`algos.policy.ActorPolicy`), the reference the other two are tested against.

This module imports neither torch nor the policies until asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def make_actor_policy(spec: Mapping[str, Any]) -> Any:
    """A policy for `spec` (the learner's `actor_spec()`), with the `ActorPolicy` methods."""
    from algos.policy_numpy import MLPPolicy, is_mlp_spec

    if is_mlp_spec(spec):
        return MLPPolicy(spec)
    from algos.policy_onnx import CNNPolicy, actor_dtype, onnx_available

    if onnx_available():
        return CNNPolicy(spec)
    if actor_dtype(spec) != "float32":
        raise RuntimeError("algo.actor_dtype = \"int8\" runs on ONNX Runtime: install the "
                           "optional onnx extra (pip install 'nitro-rl[onnx]') where actors run")
    from algos.policy import ActorPolicy

    return ActorPolicy(dict(spec))
