"""The gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al., 2018, App. A.1).

From gradients at two batch sizes, B_small (each slice) and B_big (the whole batch = the mean
of equal slices), the unbiased estimates are

    |G|^2    = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) = (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

where |G_small|^2 is averaged over the slices. |G|^2 can come out zero or negative when the
true gradient is small against the noise: B_simple is then undefined (NaN), not huge.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

Params = dict[str, torch.Tensor]
Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class NoiseScale:
    gns: float
    grad_norm_sq: float
    trace_sigma: float
    b_small: int
    b_big: int


def noise_scale(slice_grads: Sequence[torch.Tensor], slice_size: int) -> NoiseScale:
    """B_simple from flat gradients of ``k >= 2`` equal slices of ``slice_size`` samples."""
    k = len(slice_grads)
    if k < 2 or slice_size < 1:
        raise ValueError("need at least two slices of at least one sample")
    grads = torch.stack([g.to(torch.float64) for g in slice_grads])
    b_small, b_big = slice_size, slice_size * k
    small_sq = float((grads * grads).sum(dim=1).mean())
    big = grads.mean(dim=0)
    big_sq = float(big @ big)
    grad_norm_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace_sigma = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    if not (math.isfinite(grad_norm_sq) and math.isfinite(trace_sigma)) or grad_norm_sq <= 0:
        gns = math.nan
    else:
        gns = max(trace_sigma, 0.0) / grad_norm_sq
    return NoiseScale(gns=gns, grad_norm_sq=grad_norm_sq, trace_sigma=trace_sigma,
                      b_small=b_small, b_big=b_big)


def slice_gradients(
    loss_fn: Callable[[Params, Batch], torch.Tensor],
    params: Params,
    batch: Batch,
    num_slices: int,
) -> tuple[list[torch.Tensor], int]:
    """Flat gradients of ``loss_fn`` on ``num_slices`` equal slices (a remainder is dropped,
    so that the whole-batch gradient is exactly the mean of the slices'), and the slice size."""
    size = int(next(iter(batch.values())).shape[0])
    slice_size = size // num_slices
    if slice_size < 1:
        raise ValueError(f"batch of {size} cannot be cut into {num_slices} slices")
    grad_f = torch.func.grad(loss_fn)
    grads = []
    for i in range(num_slices):
        part = {k: v[i * slice_size:(i + 1) * slice_size] for k, v in batch.items()}
        g = grad_f(params, part)
        grads.append(torch.cat([g[k].reshape(-1) for k in params]).detach())
    return grads, slice_size
