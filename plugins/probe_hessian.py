"""The ``hessian`` probe: extreme eigenvalues of the learner's own loss on the round's batch.

It differentiates exactly what the learner optimised (``core.loss`` on ``core.make_batch`` of
``learner.last_rollout``), on a detached copy of the parameters taken under the learner's
lock, so a concurrent update can neither see nor disturb it. The coordinator already runs
``measure`` in a worker thread and bills its time (``probe_s`` is part of the round's
simulated time, which the cost model charges as learner time).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import structlog
import torch

from algos.hessian import density_summary, flat_hvp_fn, hessian_ratio, lanczos
from kernel.roles import PluginContext, ProbeContext

log = structlog.get_logger("plugins.probe_hessian")

NAN = float("nan")


def snapshot(learner: Any, samples: int, seed: int) -> tuple[Any, dict[str, torch.Tensor],
                                                              dict[str, torch.Tensor]] | None:
    """(core, parameter copies, subsampled flat batch) of the last update, or None."""
    rollout = getattr(learner, "last_rollout", None)
    core = getattr(learner, "core", None)
    if rollout is None or core is None:
        return None
    if not all(hasattr(core, a) for a in ("model", "make_batch", "loss")):
        # An algorithm core without PPO's probe interface: nothing to measure, not a crash.
        log.warning("probe_unsupported_core", core=type(core).__name__)
        return None
    lock = getattr(learner, "_lock", None)
    with lock if lock is not None else contextlib.nullcontext():
        params = {k: v.detach().clone() for k, v in core.model.named_parameters()}
        with torch.no_grad():
            batch = core.make_batch(rollout)
    size = int(next(iter(batch.values())).shape[0])
    if 0 < samples < size:
        g = torch.Generator().manual_seed(seed)
        idx = torch.randperm(size, generator=g)[:samples].to(next(iter(batch.values())).device)
        batch = {k: v[idx] for k, v in batch.items()}
    return core, params, batch


class HessianProbe:
    def __init__(self, ctx: PluginContext):
        cfg = ctx.config
        self.every = int(cfg["every"])
        self.samples = int(cfg.get("samples", 2048))
        self.max_steps = int(cfg.get("max_steps", 100))
        self.min_steps = int(cfg.get("min_steps", 8))
        self.tol = float(cfg.get("tol", 1e-2))
        self.density = bool(cfg.get("density", False))

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        snap = snapshot(ctx.learner, self.samples, ctx.seed)
        if snap is None:
            return {}
        core, params, batch = snap

        def loss_fn(p: dict[str, torch.Tensor]) -> torch.Tensor:
            return core.loss(batch, p)[0]

        matvec, dim = flat_hvp_fn(loss_fn, params)
        device = next(iter(params.values())).device
        g = torch.Generator().manual_seed(ctx.seed)
        try:
            result = lanczos(matvec, dim, max_steps=self.max_steps, min_steps=self.min_steps,
                             tol=self.tol, generator=g, device=device)
        except FloatingPointError as exc:
            log.warning("hessian_not_finite", round=ctx.round, error=str(exc))
            return {"hessian_ratio": NAN, "lambda_max": NAN, "lambda_min": NAN,
                    "lanczos_steps": 0.0}
        lam_max, lam_min = result.lambda_max, result.lambda_min
        values = {
            "hessian_ratio": hessian_ratio(lam_max, lam_min),
            "lambda_max": lam_max,
            "lambda_min": lam_min,
            "lanczos_steps": float(result.steps),
            "lanczos_converged": float(result.converged),
        }
        if self.density:
            values.update(density_summary(result))
        if not math.isfinite(values["hessian_ratio"]):
            log.info("hessian_ratio_undefined", round=ctx.round, lambda_max=lam_max,
                     lambda_min=lam_min)
        return values
