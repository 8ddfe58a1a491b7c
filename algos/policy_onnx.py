"""The Nature-CNN actor-critic's sampling side on ONNX Runtime: no torch in a pixel actor.

An Atari actor steps a handful of envs per call, and at such small batches eager torch spends
much of a forward in per-call work (reordering every convolution's weights into oneDNN's
blocked layout, dispatch, allocation). ONNX Runtime packs the weights once when the session is
built and its CPU kernels are tuned for small batches: the forward of 8 frames takes about half
of eager torch's time here. The graph is written by hand from the learner's state_dict names
(`algos.nets.NatureCNN` and the linear heads), so neither torch nor an exporter is needed, and
`import torch` (about a second of every cold start) is skipped as for MLP actors.

The math is the learner's `algos.nets.ActorCritic` in float32 (uint8 frames divided by 255,
three ReLU convolutions, a 512-unit ReLU layer, linear heads); sampling and scoring are
`algos.policy_numpy.sample_actions`. `tests/test_policy_onnx.py` checks both against the model.
Needs the optional `onnx` extra (onnxruntime and onnx).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import numpy as np

from algos.policy_numpy import is_mlp_spec, sample_actions

#: The Nature CNN's convolutions as (state_dict prefix, stride), in order.
CONVS = (("trunk.convs.0", 4), ("trunk.convs.2", 2), ("trunk.convs.4", 1))
#: Linear layers, input to output: (state_dict prefix, graph output or None for hidden).
LINEARS = (("trunk.fc.0", None), ("actor", "actor_out"), ("critic", "value"))


def onnx_available() -> bool:
    """Whether the optional `onnx` extra is installed (checked without importing it)."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))


def nature_cnn_graph(weights: Mapping[str, Any], obs_shape: tuple[int, ...]) -> bytes:
    """The serialized ONNX model: uint8 `obs` [N, C, H, W] -> `actor_out` [N, n], `value` [N].

    Weights are the graph's initializers, so a session built from these bytes owns its copy.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    missing = [f"{p}.{part}" for p, _ in (*CONVS, *LINEARS) for part in ("weight", "bias")
               if f"{p}.{part}" not in weights]
    if missing:
        raise KeyError(f"weights lack parameters {missing}")
    inits, nodes = [], []

    def init(name: str) -> str:
        inits.append(numpy_helper.from_array(np.asarray(weights[name], dtype=np.float32), name))
        return name

    nodes.append(helper.make_node("Cast", ["obs"], ["obs_f"], to=TensorProto.FLOAT))
    inits.append(numpy_helper.from_array(np.array(255.0, dtype=np.float32), "scale"))
    nodes.append(helper.make_node("Div", ["obs_f", "scale"], ["x0"]))
    x = "x0"
    for i, (prefix, stride) in enumerate(CONVS):
        nodes.append(helper.make_node("Conv", [x, init(f"{prefix}.weight"), init(f"{prefix}.bias")],
                                      [f"conv{i}"], strides=[stride, stride]))
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"]))
        x = f"relu{i}"
    nodes.append(helper.make_node("Flatten", [x], ["flat"], axis=1))
    nodes.append(helper.make_node("Gemm", ["flat", init("trunk.fc.0.weight"),
                                           init("trunk.fc.0.bias")], ["fc"], transB=1))
    nodes.append(helper.make_node("Relu", ["fc"], ["hidden"]))
    for prefix, out in LINEARS[1:]:
        nodes.append(helper.make_node("Gemm", ["hidden", init(f"{prefix}.weight"),
                                               init(f"{prefix}.bias")], [f"{out}_2d"], transB=1))
    nodes.append(helper.make_node("Identity", ["actor_out_2d"], ["actor_out"]))
    inits.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), "flat_shape"))
    nodes.append(helper.make_node("Reshape", ["value_2d", "flat_shape"], ["value"]))
    n_out = int(np.asarray(weights["actor.weight"]).shape[0])
    graph = helper.make_graph(
        nodes, "nature_cnn_actor_critic",
        [helper.make_tensor_value_info("obs", TensorProto.UINT8, ["N", *obs_shape])],
        [helper.make_tensor_value_info("actor_out", TensorProto.FLOAT, ["N", n_out]),
         helper.make_tensor_value_info("value", TensorProto.FLOAT, ["N"])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what ONNX Runtime releases of the last years all read
    onnx.checker.check_model(model)
    return model.SerializeToString()


class CNNPolicy:
    """Drop-in for `algos.policy.ActorPolicy` on pixel observations (same spec, weights and
    methods), running the forward in one ONNX Runtime session on one thread (actors are one
    per core)."""

    def __init__(self, spec: Mapping[str, Any], threads: int = 1):
        if is_mlp_spec(spec):
            raise ValueError("CNNPolicy runs pixel observations; vectors need MLPPolicy")
        spaces = spec["spaces"]
        action = spaces["action"]
        self.discrete = action["kind"] == "discrete"
        self.obs_shape = tuple(int(d) for d in spaces["obs_shape"])
        self.threads = threads
        self.session: Any = None
        self.log_std = np.zeros((1, 0), dtype=np.float32)
        #: The policy's own random stream, reseeded per invocation (see `ActorPolicy`).
        self.rng = np.random.default_rng()

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def load(self, weights: Mapping[str, Any]) -> None:
        """The learner's state_dict names; extra keys (e.g. obs statistics) are ignored."""
        import onnxruntime as ort

        if not self.discrete:
            if "actor_logstd" not in weights:
                raise KeyError("weights lack parameters ['actor_logstd']")
            self.log_std = np.array(weights["actor_logstd"], dtype=np.float32).reshape(1, -1)
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # warnings about unused initializers are not ours
        self.session = ort.InferenceSession(nature_cnn_graph(weights, self.obs_shape), options,
                                            providers=["CPUExecutionProvider"])

    def heads(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(logits or Gaussian mean [E, n], value [E]) of a uint8 batch [E, C, H, W]."""
        if self.session is None:
            raise RuntimeError("load weights before acting")
        obs = np.asarray(obs)
        if obs.dtype != np.uint8:  # normalised (float) frames would wrap around silently
            raise ValueError(f"CNNPolicy takes uint8 frames, got {obs.dtype} (normalize_obs "
                             "must be false for pixels)")
        out, value = self.session.run(None, {"obs": np.ascontiguousarray(obs)})
        return out, value

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sample actions for a batch [E, *obs_shape]; also return their logprobs and values."""
        out, values = self.heads(obs)
        return sample_actions(out, self.log_std, self.rng, self.discrete, values)

    def act_deterministic(self, obs: np.ndarray) -> np.ndarray:
        """Most likely action (argmax / Gaussian mean), for evaluation."""
        out = self.heads(obs)[0]
        return out.argmax(axis=-1) if self.discrete else out

    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) [E], e.g. for the truncation bootstrap on a final observation."""
        return self.heads(obs)[1]
