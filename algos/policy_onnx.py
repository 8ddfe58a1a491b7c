"""The Nature-CNN actor-critic's sampling side on ONNX Runtime: no torch in a pixel actor.

An Atari actor steps a handful of envs per call, and at such small batches eager torch spends
much of a forward in per-call work (reordering every convolution's weights into oneDNN's
blocked layout, dispatch, allocation). ONNX Runtime packs the weights once when the session is
built and its CPU kernels are tuned for small batches: the forward of 8 frames takes about half
of eager torch's time here. The graphs are written by hand (`algos.onnx_graphs`), so neither
torch nor an exporter is needed, and `import torch` (about a second of every cold start) is
skipped as for MLP actors.

The math is the learner's `algos.nets.ActorCritic` in float32 (uint8 frames divided by 255,
three ReLU convolutions, a 512-unit ReLU layer, linear heads), or the same network with 8-bit
products where the plan asks for it; sampling and scoring are
`algos.policy_numpy.sample_actions`. `tests/test_policy_onnx.py` checks both against the model.
Needs the optional `onnx` extra (onnxruntime and onnx).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import numpy as np

from algos.onnx_graphs import CALIBRATION_OUTPUTS, nature_cnn_graph, nature_cnn_int8_graph
from algos.policy_numpy import is_mlp_spec, sample_actions

#: The forward's arithmetic: the learner's float32, or 8-bit products (`algos.onnx_graphs`).
ACTOR_DTYPES = ("float32", "int8")
#: A calibrated activation peak below this is no peak at all (see `CNNPolicy._calibrate`).
MIN_CALIBRATED_PEAK = 1e-6


def actor_dtype(spec: Mapping[str, Any]) -> str:
    """The arithmetic an actor spec asks its Nature-CNN forward to sample with."""
    return str(dict(spec.get("net") or {}).get("actor_dtype", "float32"))


def onnx_available() -> bool:
    """Whether the optional `onnx` extra is installed (checked without importing it)."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))


class CNNPolicy:
    """Drop-in for `algos.policy.ActorPolicy` on pixel observations (same spec, weights and
    methods), running the forward in one ONNX Runtime session on one thread (actors are one
    per core).

    With ``actor_dtype = "int8"`` in the spec's ``net`` the forward is the 8-bit graph. Its
    activation scales are calibrated on the first batch each loaded set of weights sees: a
    float32 forward of those frames gives each convolution's largest output, then the int8
    session takes over. Calibrating per load follows the weights as they train, costs one
    float32 forward per invocation, and keeps a seeded run replayable.
    """

    def __init__(self, spec: Mapping[str, Any], threads: int = 1):
        if is_mlp_spec(spec):
            raise ValueError("CNNPolicy runs pixel observations; vectors need MLPPolicy")
        spaces = spec["spaces"]
        action = spaces["action"]
        self.discrete = action["kind"] == "discrete"
        self.obs_shape = tuple(int(d) for d in spaces["obs_shape"])
        self.threads = threads
        self.dtype = actor_dtype(spec)
        if self.dtype not in ACTOR_DTYPES:
            raise ValueError(f"net.actor_dtype must be one of {list(ACTOR_DTYPES)}, "
                             f"not {self.dtype!r}")
        self.session: Any = None
        #: The weights awaiting int8 calibration on the next batch (None once calibrated).
        self._uncalibrated: Mapping[str, Any] | None = None
        self.log_std = np.zeros((1, 0), dtype=np.float32)
        #: The policy's own random stream, reseeded per invocation (see `ActorPolicy`).
        self.rng = np.random.default_rng()

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def load(self, weights: Mapping[str, Any]) -> None:
        """The learner's state_dict names; extra keys (e.g. obs statistics) are ignored."""
        if not self.discrete:
            if "actor_logstd" not in weights:
                raise KeyError("weights lack parameters ['actor_logstd']")
            self.log_std = np.array(weights["actor_logstd"], dtype=np.float32).reshape(1, -1)
        int8 = self.dtype == "int8"
        self.session = self._session(nature_cnn_graph(weights, self.obs_shape, activations=int8))
        self._uncalibrated = weights if int8 else None

    def _session(self, graph: bytes) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # warnings about unused initializers are not ours
        return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])

    def _calibrate(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The float32 outputs of ``obs``, and the int8 session built from its activations.

        A layer that stayed at zero on these frames (a blank screen, dead units) gives no
        scale to quantise with: this weights version then samples in float32 throughout
        rather than saturating every later activation."""
        weights, self._uncalibrated = self._uncalibrated, None
        out, value, *activations = self.session.run(
            ["actor_out", "value", *CALIBRATION_OUTPUTS], {"obs": obs})
        peaks = [float(a.max()) for a in activations]
        if min(peaks) > MIN_CALIBRATED_PEAK:
            self.session = self._session(nature_cnn_int8_graph(weights, self.obs_shape, peaks))
        return out, value

    def heads(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(logits or Gaussian mean [E, n], value [E]) of a uint8 batch [E, C, H, W]."""
        if self.session is None:
            raise RuntimeError("load weights before acting")
        obs = np.asarray(obs)
        if obs.dtype != np.uint8:  # normalised (float) frames would wrap around silently
            raise ValueError(f"CNNPolicy takes uint8 frames, got {obs.dtype} (normalize_obs "
                             "must be false for pixels)")
        obs = np.ascontiguousarray(obs)
        if self._uncalibrated is not None:
            return self._calibrate(obs)
        out, value = self.session.run(["actor_out", "value"], {"obs": obs})
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
