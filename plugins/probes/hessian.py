"""The ``hessian`` probe: extreme eigenvalues of the learner's own loss on the round's batch.

It differentiates exactly what the learner optimised: ``core.loss`` on ``core.probe_batch`` of
``learner.last_rollout``, which for decoupled PPO is the batch as the update saw it (the
proximal log-probabilities, importance weights, values and advantages of the model *before* the
update), at the parameters *after* it. Rebuilding the batch from the updated model instead
would measure the updated policy against itself, a PPO ratio of exactly 1 where the clip is
never active. Parameters are copied under the learner's lock, so a concurrent update can
neither see nor disturb them. The coordinator runs ``measure`` in a worker thread and bills
its time (``probe_s`` is part of the round's simulated time, charged as learner time).

Cheap by construction: a subsample of the batch, Hessian-vector products as double backward
through one retained gradient graph, a Lanczos that stops when each end has converged, started
from the previous round's extreme Ritz vectors (the curvature directions move slowly between
rounds), with its basis held to ``basis_mb`` and, if set, its time to ``max_s``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import structlog
import torch

from algos.hessian import (
    density_summary,
    flat_hvp_fn,
    hessian_ratio,
    hessian_ratio_prototype,
    lanczos,
)
from kernel.roles import PluginContext, ProbeContext

log = structlog.get_logger("plugins.probes.hessian")

NAN = float("nan")
Params = dict[str, torch.Tensor]


def snapshot(learner: Any, samples: int, seed: int, *, before: bool = False
             ) -> tuple[Any, Params, Params] | None:
    """(core, parameter copies, subsampled flat batch) of the last update, or None.

    The batch is the one the update optimised (``probe_batch``; a core without it falls back
    to ``make_batch``, right when its batch does not depend on the model). The parameters are
    those after the update, or with ``before`` those it started from."""
    rollout = getattr(learner, "last_rollout", None)
    core = getattr(learner, "core", None)
    if rollout is None or core is None:
        return None
    if not all(hasattr(core, a) for a in ("model", "make_batch", "loss")):
        # An algorithm core without PPO's probe interface: nothing to measure, not a crash.
        log.warning("probe_unsupported_core", core=type(core).__name__)
        return None
    make = getattr(core, "probe_batch", None) or core.make_batch
    lock = getattr(learner, "_lock", None)
    with lock if lock is not None else contextlib.nullcontext():
        kept = getattr(core, "params_before", None) if before else None
        if before and kept is None:
            return None
        params = dict(kept) if before else {
            k: v.detach().clone() for k, v in core.model.named_parameters()}
        with torch.no_grad():
            batch = make(rollout)
    size = int(next(iter(batch.values())).shape[0])
    if 0 < samples < size:
        g = torch.Generator().manual_seed(seed)
        idx = torch.randperm(size, generator=g)[:samples].to(next(iter(batch.values())).device)
        batch = {k: v[idx] for k, v in batch.items()}
    return core, params, batch


class HessianProbe:
    """Reports, every ``every`` rounds (see ``measure``), the regularised and the prototype's
    rho, both extremes, the Lanczos steps and whether both ends converged."""

    def __init__(self, ctx: PluginContext):
        cfg = ctx.config
        self.every = int(cfg["every"])
        self.samples = int(cfg["samples"])
        self.max_steps = int(cfg["max_steps"])
        self.min_steps = int(cfg["min_steps"])
        self.tol = float(cfg["tol"])
        self.floor = float(cfg["floor"])
        self.rho_eps = float(cfg["rho_eps"])
        self.basis_bytes = int(float(cfg["basis_mb"]) * 2**20)
        self.warm_start = bool(cfg["warm_start"])
        self.max_s = None if cfg["max_s"] is None else float(cfg["max_s"])
        self.density = bool(cfg["density"])
        #: Sum of the last run's extreme Ritz vectors (the next run's start direction).
        self._start: torch.Tensor | None = None

    def loss_at(self, ctx: ProbeContext
                ) -> tuple[Callable[[Params], torch.Tensor], Params, Params] | None:
        """(the loss the probe differentiates, the parameters it does so at, its batch)."""
        snap = snapshot(ctx.learner, self.samples, ctx.seed)
        if snap is None:
            return None
        core, params, batch = snap

        def loss_fn(p: Params) -> torch.Tensor:
            return core.loss(batch, p)[0]

        return loss_fn, params, batch

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        """Values (all floats; NaN ones are dropped from the published event):

        ``hessian_ratio`` regularised rho (``algos.hessian.hessian_ratio``), what the default
        scaler reads; ``hessian_ratio_prototype`` the prototype's -(l_max + 0.01) / (l_min -
        0.01); ``lambda_max``, ``lambda_min`` the extreme Ritz values; ``lanczos_steps``;
        ``hessian_converged`` 1 when both ends met their residual tests, else 0;
        ``hessian_samples`` the batch samples the Hessian was taken on.
        """
        at = self.loss_at(ctx)
        if at is None:
            return {}
        loss_fn, params, batch = at
        samples = int(next(iter(batch.values())).shape[0])
        try:
            matvec, dim = flat_hvp_fn(loss_fn, params)
            start = self._start if self.warm_start else None
            device = next(iter(params.values())).device
            result = lanczos(matvec, dim, max_steps=self.max_steps, min_steps=self.min_steps,
                             tol=self.tol, floor=self.floor,
                             generator=torch.Generator().manual_seed(ctx.seed), device=device,
                             max_basis_bytes=self.basis_bytes, start=start,
                             max_seconds=self.max_s)
        except FloatingPointError as exc:
            log.warning("hessian_not_finite", round=ctx.round, error=str(exc))
            self._start = None
            return {"hessian_ratio": NAN, "hessian_ratio_prototype": NAN, "lambda_max": NAN,
                    "lambda_min": NAN, "lanczos_steps": 0.0, "hessian_converged": 0.0,
                    "hessian_samples": float(samples)}
        self._start = (result.vector_min + result.vector_max).to(torch.float32)
        lam_max, lam_min = result.lambda_max, result.lambda_min
        values = {
            "hessian_ratio": hessian_ratio(lam_max, lam_min, self.rho_eps),
            "hessian_ratio_prototype": hessian_ratio_prototype(lam_max, lam_min),
            "lambda_max": lam_max,
            "lambda_min": lam_min,
            "lanczos_steps": float(result.steps),
            "hessian_converged": float(result.converged),
            "hessian_samples": float(samples),
        }
        if self.density:
            values.update(density_summary(result))
        if not math.isfinite(values["hessian_ratio_prototype"]):
            log.info("hessian_ratio_prototype_undefined", round=ctx.round, lambda_max=lam_max,
                     lambda_min=lam_min)
        return values
