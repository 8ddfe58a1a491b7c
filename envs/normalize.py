"""Running mean/variance statistics that can be split across actors and merged at the learner.

The math matches gymnasium's ``NormalizeObservation`` / ``NormalizeReward`` (initial count 1e-4,
mean 0, var 1, epsilon 1e-8 under the square root), but the statistics live at the learner:
actors normalise with a frozen copy and send back only the moments of what they saw
(``moments``), which the learner folds in with Chan et al.'s parallel formula. Merging deltas
in any order gives the same result as one sequential update over all the data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["EPSILON", "INITIAL_COUNT", "RunningMeanStd", "moments"]

#: Added to the variance under the square root (gymnasium's default).
EPSILON = 1e-8
#: Pseudo-count of the prior (mean 0, var 1), as in gymnasium, so the first update dominates.
INITIAL_COUNT = 1e-4


def moments(x: np.ndarray, sample_ndim: int = 0) -> dict[str, Any]:
    """The exact moments of a batch, as the delta an actor sends: ``{"mean","var","count"}``.

    ``x`` has any number of leading batch axes followed by ``sample_ndim`` axes of one sample
    (``[T, E, *obs_shape]`` with ``sample_ndim=len(obs_shape)``). Unlike a fresh
    ``RunningMeanStd`` there is no prior here, so merging deltas does not add 1e-4 per fragment.
    """
    x = np.asarray(x)
    flat = x.reshape(-1, *x.shape[x.ndim - sample_ndim :]) if sample_ndim else x.reshape(-1)
    flat = flat.astype(np.float64, copy=False)
    return {
        "mean": flat.mean(axis=0),
        "var": flat.var(axis=0),
        "count": float(flat.shape[0]),
    }


class RunningMeanStd:
    """float64 mean, variance and count of a stream of samples of one shape."""

    __slots__ = ("count", "mean", "var")

    def __init__(self, shape: tuple[int, ...] | list[int] = (), count: float = INITIAL_COUNT):
        self.mean = np.zeros(tuple(shape), dtype=np.float64)
        self.var = np.ones(tuple(shape), dtype=np.float64)
        self.count = float(count)

    @classmethod
    def empty(cls, shape: tuple[int, ...] | list[int] = ()) -> RunningMeanStd:
        """A zero-count accumulator: the delta form an actor fills with what *it* saw.

        With count 0 the prior carries no weight, so after updates it holds the exact moments of
        those samples, and ``merge`` of it into the learner's statistics adds nothing else.
        """
        return cls(shape, count=0.0)

    def __repr__(self) -> str:
        return f"RunningMeanStd(shape={self.mean.shape}, count={self.count:g})"

    def update(self, batch: np.ndarray) -> None:
        """Fold in a batch whose first axis indexes samples (gymnasium's ``update``)."""
        batch = np.asarray(batch, dtype=np.float64)
        self.update_from_moments(batch.mean(axis=0), batch.var(axis=0), batch.shape[0])

    def update_from_moments(
        self, batch_mean: np.ndarray, batch_var: np.ndarray, batch_count: float
    ) -> None:
        """Chan et al.'s parallel-variance combination of two sets of moments."""
        batch_count = float(batch_count)
        if batch_count <= 0:
            return
        batch_mean = np.asarray(batch_mean, dtype=np.float64)
        batch_var = np.asarray(batch_var, dtype=np.float64)
        delta = batch_mean - self.mean
        tot_count = self.count + batch_count
        new_mean = self.mean + delta * (batch_count / tot_count)
        m2 = (
            self.var * self.count
            + batch_var * batch_count
            + np.square(delta) * (self.count * batch_count / tot_count)
        )
        self.mean = new_mean
        self.var = m2 / tot_count
        self.count = tot_count

    def merge(self, other: RunningMeanStd | Mapping[str, Any]) -> None:
        """Fold in another set of statistics (a ``RunningMeanStd`` or its ``to_dict`` form)."""
        if isinstance(other, RunningMeanStd):
            self.update_from_moments(other.mean, other.var, other.count)
        else:
            self.update_from_moments(other["mean"], other["var"], other["count"])

    def std(self) -> np.ndarray:
        """The scale used to normalise: ``sqrt(var + EPSILON)``."""
        return np.sqrt(self.var + EPSILON)

    def normalize(
        self, x: np.ndarray, clip: float | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """``(x - mean) / sqrt(var + eps)``, clipped to ``[-clip, clip]``, as float32.

        Computed in float64 like gymnasium, then cast; ``out`` (float32) lets the sampler write
        straight into its rollout buffer without a temporary per step.
        """
        z = (np.asarray(x, dtype=np.float64) - self.mean) / self.std()
        if out is None:
            out = np.empty(z.shape, dtype=np.float32)
        if clip is None:
            np.copyto(out, z, casting="same_kind")
        else:
            np.clip(z, -clip, clip, out=out)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain numpy/float form that crosses the codec (copies, so the receiver may mutate)."""
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": float(self.count)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunningMeanStd:
        """Rebuild from ``to_dict`` output; copies because decoded arrays may be read-only."""
        mean = np.array(d["mean"], dtype=np.float64)
        rms = cls(mean.shape)
        rms.mean = mean
        rms.var = np.array(d["var"], dtype=np.float64)
        rms.count = float(d["count"])
        return rms

    def copy(self) -> RunningMeanStd:
        """An independent copy (a frozen snapshot for actors, for instance)."""
        return RunningMeanStd.from_dict(self.to_dict())
