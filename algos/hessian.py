"""Extreme Hessian eigenvalues of a loss by Lanczos on Hessian-vector products (pure torch).

Nitro's convexity signal is the ratio rho = -lambda_max / lambda_min of the loss Hessian on the
round's batch. Only the two extremes are needed, and Lanczos finds extremes first, so the
iteration stops as soon as both extreme Ritz pairs have small residuals instead of always
running 100 steps (what the prototype did). Full re-orthogonalisation keeps the Krylov basis
orthogonal in finite precision, which is what prevents "ghost" copies of converged eigenvalues.

The Hessian-vector product is forward-over-reverse (``jvp`` of ``grad``): one extra forward
pass over the backward graph, no Hessian ever formed. torch 2.13 has no ``torch.func.hvp``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

Params = dict[str, torch.Tensor]


def hvp_fn(loss_fn: Callable[[Params], torch.Tensor], params: Params
           ) -> Callable[[Params], Params]:
    """``v -> H v`` for the Hessian of ``loss_fn`` at ``params`` (dicts of tensors)."""
    grad_f = torch.func.grad(loss_fn)

    def hvp(vector: Params) -> Params:
        with warnings.catch_warnings():
            # torch's forward-mode AD still calls its own deprecated torch.jit.script; the
            # warning is about torch's internals, not this code, and would fire every step.
            warnings.filterwarnings("ignore", message=".*torch.jit.script.*",
                                    category=DeprecationWarning)
            return torch.func.jvp(grad_f, (params,), (vector,))[1]

    return hvp


def flat_hvp_fn(loss_fn: Callable[[Params], torch.Tensor], params: Params
                ) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
    """The same product on flat vectors (what Lanczos works with), and the dimension."""
    names = list(params)
    shapes = [params[k].shape for k in names]
    sizes = [params[k].numel() for k in names]
    dtype = params[names[0]].dtype
    hvp = hvp_fn(loss_fn, params)

    def matvec(v: torch.Tensor) -> torch.Tensor:
        parts = torch.split(v.to(dtype), sizes)
        tangent = {k: p.reshape(s) for k, p, s in zip(names, parts, shapes, strict=True)}
        out = hvp(tangent)
        return torch.cat([out[k].reshape(-1) for k in names]).to(v.dtype)

    return matvec, sum(sizes)


@dataclass(frozen=True)
class LanczosResult:
    #: Ritz values, ascending.
    ritz_values: torch.Tensor
    #: Gaussian-quadrature weights of the Ritz values (squared first components of the
    #: tridiagonal's eigenvectors): the spectral density seen from the start vector; sum to 1.
    weights: torch.Tensor
    steps: int
    #: Both extremes met the residual tolerance (or the Krylov space became invariant).
    converged: bool

    @property
    def lambda_max(self) -> float:
        return float(self.ritz_values[-1])

    @property
    def lambda_min(self) -> float:
        return float(self.ritz_values[0])


def lanczos(
    matvec: Callable[[torch.Tensor], torch.Tensor],
    dim: int,
    *,
    max_steps: int = 100,
    min_steps: int = 8,
    tol: float = 1e-3,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float64,
) -> LanczosResult:
    """Lanczos with full re-orthogonalisation on a symmetric operator of size ``dim``.

    Stops once both extreme Ritz pairs have residual ``|beta_k * s_k,i|`` (the classic bound on
    the distance from a Ritz value to the spectrum) below ``tol`` times the largest Ritz value
    in magnitude, after at least ``min_steps`` steps, or after ``max_steps``.
    """
    steps_cap = max(1, min(max_steps, dim))
    q = torch.randn(dim, generator=generator, dtype=dtype, device="cpu").to(device)
    q = q / q.norm()
    basis = torch.zeros(steps_cap, dim, dtype=dtype, device=device)
    alphas: list[float] = []
    betas: list[float] = []
    beta_prev = 0.0
    converged = False
    theta = torch.zeros(0, dtype=torch.float64)
    vecs = torch.zeros(0, 0, dtype=torch.float64)
    for j in range(steps_cap):
        basis[j] = q
        w = matvec(q)
        if not torch.isfinite(w).all():
            raise FloatingPointError("Hessian-vector product is not finite")
        alpha = float(torch.dot(w, q))
        w = w - alpha * q
        if j > 0:
            w = w - beta_prev * basis[j - 1]
        # Full re-orthogonalisation, twice ("twice is enough", Parlett): keeps Q orthonormal.
        for _ in range(2):
            w = w - basis[: j + 1].T @ (basis[: j + 1] @ w)
        beta = float(w.norm())
        alphas.append(alpha)
        theta, vecs = _tridiagonal_eigh(alphas, betas)
        scale = max(float(theta.abs().max()), 1e-30)
        invariant = beta <= 1e-10 * scale
        if invariant:
            converged = True
            break
        residual_lo = abs(beta * float(vecs[-1, 0]))
        residual_hi = abs(beta * float(vecs[-1, -1]))
        if j + 1 >= min(min_steps, steps_cap) and max(residual_lo, residual_hi) <= tol * scale:
            converged = True
            break
        if j + 1 == steps_cap:
            break
        betas.append(beta)
        beta_prev = beta
        q = w / beta
    weights = vecs[0, :] ** 2
    return LanczosResult(ritz_values=theta, weights=weights / weights.sum(), steps=len(alphas),
                         converged=converged or len(alphas) == dim)


def _tridiagonal_eigh(alphas: list[float], betas: list[float]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    k = len(alphas)
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if k > 1:
        off = torch.tensor(betas[: k - 1], dtype=torch.float64)
        t = t + torch.diag(off, 1) + torch.diag(off, -1)
    return torch.linalg.eigh(t)


def hessian_ratio(lambda_max: float, lambda_min: float, rel_eps: float = 1e-6) -> float:
    """rho = -lambda_max / lambda_min, or NaN where it is undefined.

    NaN when either value is not finite, or when ``|lambda_min|`` is below ``rel_eps`` times
    ``|lambda_max|`` (a numerically zero denominator would make rho explode and swamp any
    min-max window downstream). A positive-definite Hessian gives a negative rho, as computed.
    """
    if not (math.isfinite(lambda_max) and math.isfinite(lambda_min)):
        return math.nan
    if abs(lambda_min) <= rel_eps * max(abs(lambda_max), 1e-30):
        return math.nan
    return -lambda_max / lambda_min


def density_summary(result: LanczosResult, zero_rel: float = 1e-3) -> dict[str, float]:
    """A few numbers about the spectral density from the Ritz values and their weights."""
    theta, w = result.ritz_values, result.weights
    scale = max(float(theta.abs().max()), 1e-30)
    return {
        "density_negative_weight": float(w[theta < 0].sum()),
        "density_near_zero_weight": float(w[theta.abs() <= zero_rel * scale].sum()),
        "density_mean": float((w * theta).sum()),
    }
