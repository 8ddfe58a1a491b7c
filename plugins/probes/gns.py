"""The ``gns`` probe: gradient noise scale of the learner's loss on the round's batch, at the
parameters the update started from (``at = "before"``, the noise the update faced) or ended with.

Same snapshot as the Hessian probe (parameter copies and the flat batch the learner trained
on, subsampled); the batch is shuffled before slicing so that slices are not single env
columns of the time-major rollout.
"""

from __future__ import annotations

import torch

from algos.gns import noise_scale, slice_gradients
from kernel.roles import PluginContext, ProbeContext
from plugins.probes.hessian import snapshot


class GnsProbe:
    def __init__(self, ctx: PluginContext):
        cfg = ctx.config
        self.every = int(cfg["every"])
        self.samples = int(cfg["samples"])
        self.slices = int(cfg["slices"])
        self.before = cfg["at"] == "before"

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        # Where the update started: after it, the batch's own gradient is near zero by
        # construction (it was just optimised) and |G|^2 reads as noise, often negative.
        snap = snapshot(ctx.learner, self.samples, ctx.seed, before=self.before)
        if snap is None:
            return {}
        core, params, batch = snap
        size = int(next(iter(batch.values())).shape[0])
        if size < 2 * self.slices:
            return {}
        g = torch.Generator().manual_seed(ctx.seed + 1)
        idx = torch.randperm(size, generator=g).to(next(iter(batch.values())).device)
        batch = {k: v[idx] for k, v in batch.items()}

        def loss_fn(p: dict[str, torch.Tensor], mb: dict[str, torch.Tensor]) -> torch.Tensor:
            return core.loss(mb, p)[0]

        grads, slice_size = slice_gradients(loss_fn, params, batch, self.slices)
        est = noise_scale(grads, slice_size)
        # gns_samples is the probe's work, what a time model bills it by.
        return {"gns": est.gns, "grad_norm_sq": est.grad_norm_sq,
                "trace_sigma": est.trace_sigma, "gns_samples": float(size)}
