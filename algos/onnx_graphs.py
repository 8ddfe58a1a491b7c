"""The Nature-CNN actor-critic as ONNX graphs, written by hand from the learner's state_dict
names (`algos.nets.NatureCNN` and the linear heads), so that neither torch nor an exporter is
needed where actors sample with them (`algos.policy_onnx.CNNPolicy`).

`nature_cnn_graph` is the learner's float32 math exactly. `nature_cnn_int8_graph` is the same
network with 8-bit products: at an actor's batch of a few frames the float32 forward is bound
by arithmetic in the convolutions and by memory in the 3136x512 hidden layer (6.4 MB of weights
read per call, out of cache once the emulator has run in between); integer products (VNNI does
four per float32 lane) and a quarter of the weight bytes make it much cheaper. Its
quantisation is the standard static one, chosen so that it costs nothing at run time:

- the frames are already 8-bit: ``x / 255`` is exactly the uint8 tensor with scale 1/255 and
  zero point 0, so the graph takes the frames as they come, with no cast or quantise step;
- weights are symmetric int8 per output channel (scale = max |w| / 127); biases int32 at the
  product of the input and weight scales, as integer convolutions require;
- each ReLU convolution's output is uint8 with zero point 0, whose saturation at 0 *is* the
  ReLU; its scale comes from the largest activation of a calibration batch, widened by
  `HEADROOM`, and larger activations saturate;
- the hidden layer multiplies in int8 and returns float32; the two small heads stay float32.

The int8 policy is not bit-equal to the learner's (logits differ by about a thousandth of their
range). An actor records the log-probabilities of the actions it actually sampled, so a learner
that corrects for its behaviour policy (V-trace, PPO's ratio) sees the difference as a little
more staleness, not as an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: The Nature CNN's convolutions as (state_dict prefix, stride), in order.
CONVS = (("trunk.convs.0", 4), ("trunk.convs.2", 2), ("trunk.convs.4", 1))
#: Linear layers, input to output: (state_dict prefix, graph output or None for hidden).
LINEARS = (("trunk.fc.0", None), ("actor", "actor_out"), ("critic", "value"))
#: Calibrated maxima are widened by this factor before they set a layer's scale: activations
#: of frames unlike the calibration batch's saturate less often, at 0.4 bits of resolution.
HEADROOM = 1.3
#: The graph outputs the calibration reads: every ReLU convolution's output.
CALIBRATION_OUTPUTS = tuple(f"relu{i}" for i in range(len(CONVS)))


def nature_cnn_graph(weights: Mapping[str, Any], obs_shape: tuple[int, ...],
                     activations: bool = False) -> bytes:
    """The serialized ONNX model: uint8 `obs` [N, C, H, W] -> `actor_out` [N, n], `value` [N],
    and with ``activations`` every ReLU convolution's output too (what int8 calibration reads).

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
    outputs = [helper.make_tensor_value_info("actor_out", TensorProto.FLOAT, ["N", n_out]),
               helper.make_tensor_value_info("value", TensorProto.FLOAT, ["N"])]
    if activations:
        outputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                  ["N", f"{name}_c", f"{name}_h", f"{name}_w"])
                    for name in CALIBRATION_OUTPUTS]
    graph = helper.make_graph(
        nodes, "nature_cnn_actor_critic",
        [helper.make_tensor_value_info("obs", TensorProto.UINT8, ["N", *obs_shape])],
        outputs, initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what ONNX Runtime releases of the last years all read
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _folds_to_depth(kernel: int, stride: int, obs_shape: Sequence[int]) -> bool:
    """Whether a first convolution can run on the frames folded space-to-depth."""
    return stride > 1 and kernel % stride == 0 and all(d % stride == 0 for d in obs_shape[1:])


def _space_to_depth_kernel(w: np.ndarray, s: int) -> np.ndarray:
    """The kernel [O, C, k, k] of a stride-``s`` convolution, for the same convolution at
    stride 1 over the input folded by ``SpaceToDepth(s)``: [O, s*s*C, k/s, k/s].

    Integer convolutions are slow on few input channels (4 frames, an 8x8 kernel at stride 4):
    folded, the first convolution has 64 channels and a 2x2 kernel, the same products in a
    shape the kernels handle well (about a tenth off the whole sampling step here).
    SpaceToDepth puts pixel (s*h + i, s*w + j) of channel c at channel (i*s + j)*C + c of
    position (h, w), so tap (s*a + i, s*b + j) of channel c moves to that channel, tap (a, b).
    """
    o, c, k, _ = w.shape
    a = k // s
    return w.reshape(o, c, a, s, a, s).transpose(0, 3, 5, 1, 2, 4).reshape(o, s * s * c, a, a)


def _channel_scales(w: np.ndarray, b: np.ndarray, x_scale: float) -> np.ndarray:
    """Symmetric int8 scale per output channel (rows of ``w``), never so small that the
    channel's int32 bias (at scale ``x_scale`` times this) would overflow: a row of zero
    weights still adds its bias."""
    peak = np.abs(w.reshape(len(w), -1)).max(axis=1) / 127.0
    return np.maximum(peak, np.abs(b) / (x_scale * 2.0**30)).clip(min=1e-12).astype(np.float32)


def _quantise(w: np.ndarray, scales: np.ndarray) -> np.ndarray:
    shape = (-1,) + (1,) * (w.ndim - 1)
    return np.clip(np.rint(w / scales.reshape(shape)), -127, 127).astype(np.int8)


def nature_cnn_int8_graph(weights: Mapping[str, Any], obs_shape: Sequence[int],
                          activation_max: Sequence[float]) -> bytes:
    """The serialized graph: uint8 ``obs`` [N, C, H, W] -> ``actor_out`` [N, n], ``value`` [N].

    ``activation_max`` holds, for each of the three convolutions, the largest ReLU output of a
    calibration batch (see `CNNPolicy` in `algos.policy_onnx`, which measures it)."""
    from onnx import TensorProto, helper, numpy_helper

    if len(activation_max) != len(CONVS):
        raise ValueError(f"need {len(CONVS)} activation maxima, got {len(activation_max)}")
    inits: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: Any) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def param(name: str) -> np.ndarray:
        return np.asarray(weights[name], dtype=np.float32)

    const("zero_u8", np.array(0, dtype=np.uint8))
    x, x_scale = "obs", np.float32(1.0 / 255.0)
    const("scale_in", x_scale)
    x_scale_name = "scale_in"
    for i, ((prefix, stride), peak) in enumerate(zip(CONVS, activation_max, strict=True)):
        w, b = param(f"{prefix}.weight"), param(f"{prefix}.bias")
        if i == 0 and _folds_to_depth(w.shape[-1], stride, obs_shape):
            nodes.append(helper.make_node("SpaceToDepth", [x], ["obs_s2d"], blocksize=stride))
            x, w, stride = "obs_s2d", _space_to_depth_kernel(w, stride), 1
        w_scale = _channel_scales(w, b, x_scale)
        y_scale = np.float32(max(float(peak), 1e-6) * HEADROOM / 255.0)
        bias = np.rint(b / (x_scale * w_scale)).astype(np.int32)
        nodes.append(helper.make_node(
            "QLinearConv",
            [x, x_scale_name, "zero_u8", const(f"w{i}", _quantise(w, w_scale)),
             const(f"w{i}_scale", w_scale), const(f"w{i}_zero", np.zeros(len(w), np.int8)),
             const(f"y{i}_scale", y_scale), "zero_u8", const(f"b{i}", bias)],
            [f"q{i}"], strides=[stride, stride]))
        x, x_scale, x_scale_name = f"q{i}", y_scale, f"y{i}_scale"
    nodes.append(helper.make_node("Flatten", [x], ["flat"], axis=1))
    w, b = param("trunk.fc.0.weight"), param("trunk.fc.0.bias")
    w_scale = _channel_scales(w, b, x_scale)
    nodes.append(helper.make_node(
        "QGemm",  # ONNX Runtime's int8 Gemm: without an output scale it returns float32
        ["flat", x_scale_name, "zero_u8", const("fc_w", _quantise(w, w_scale)),
         const("fc_w_scale", w_scale), const("fc_w_zero", np.zeros(len(w), np.int8)),
         const("fc_b", np.rint(b / (x_scale * w_scale)).astype(np.int32))],
        ["fc"], domain="com.microsoft", transB=1))
    nodes.append(helper.make_node("Relu", ["fc"], ["hidden"]))
    n_out = len(param("actor.weight"))
    heads_w = np.concatenate([param("actor.weight"), param("critic.weight")])
    heads_b = np.concatenate([param("actor.bias"), param("critic.bias")])
    nodes.append(helper.make_node("Gemm", ["hidden", const("heads_w", heads_w),
                                           const("heads_b", heads_b)], ["heads"], transB=1))
    nodes.append(helper.make_node("Split", ["heads", const("split", np.array([n_out, 1], np.int64))],
                                  ["actor_out", "value_2d"], axis=1))
    nodes.append(helper.make_node("Reshape", ["value_2d", const("flat_shape", np.array([-1], np.int64))],
                                  ["value"]))
    graph = helper.make_graph(
        nodes, "nature_cnn_actor_critic_int8",
        [helper.make_tensor_value_info("obs", TensorProto.UINT8, ["N", *obs_shape])],
        [helper.make_tensor_value_info("actor_out", TensorProto.FLOAT, ["N", n_out]),
         helper.make_tensor_value_info("value", TensorProto.FLOAT, ["N"])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model.SerializeToString()
