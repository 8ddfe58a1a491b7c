"""The ``tensorboard`` sink: scalars per round, under ``<run_dir>/tensorboard``.

``tensorboardX.SummaryWriter`` queues records to its own writer thread, so ``add_scalar`` costs
the loop a queue put; the file is flushed per round (the writer's ``flush_secs`` would
otherwise hold the newest round back for up to two minutes).

The x axis is ``env_steps`` by default (what RL curves are compared on); ``step = "round"``
switches every scalar to the round number.
"""

from __future__ import annotations

import math
from typing import Any

from kernel import events as ev
from kernel.roles import PluginContext


class TensorboardSink:
    def __init__(self, ctx: PluginContext):
        self.logdir = ctx.run_dir / ctx.config.get("dir", "tensorboard")
        self.step_by = ctx.config.get("step", "env_steps")
        self.writer: Any = None
        self._started_ts: float | None = None
        self._scale: dict[int, ev.ScaleDecided] = {}
        self._cost: dict[int, float] = {}

    async def start(self, ctx: PluginContext) -> None:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=str(self.logdir), flush_secs=30)

    def _add(self, tag: str, value: Any, step: int) -> None:
        if value is None or isinstance(value, bool):
            return
        value = float(value)
        if math.isfinite(value):
            self.writer.add_scalar(tag, value, step)

    async def handle(self, event: Any) -> None:
        if self.writer is None:
            return
        if isinstance(event, ev.RunStarted):
            self._started_ts = event.ts
            self.writer.add_text("run", f"{event.name} ({event.run_id})", 0)
        elif isinstance(event, ev.ScaleDecided):
            self._scale[event.round] = event
        elif isinstance(event, ev.CostCharged):
            self._cost[event.round] = event.round_usd
        elif isinstance(event, ev.RoundFinished):
            self._round(event)
            self.writer.flush()

    def _round(self, e: ev.RoundFinished) -> None:
        step = e.env_steps if self.step_by == "env_steps" else e.round
        add = self._add
        add("eval/return", e.eval_return, step)
        for key in ("eval_return_min", "eval_return_max", "eval_return_std"):
            add(f"eval/{key.removeprefix('eval_')}", e.probes.get(key), step)
        add("train/episode_return_mean", e.episode_return_mean, step)
        add("train/episodes", e.episodes, step)
        add("progress/round", e.round, step)
        add("progress/env_steps", e.env_steps, step)
        add("actors/count", e.actors, step)
        add("actors/batches", e.batches, step)
        for key, value in e.metrics.items():
            add(f"learner/{key}", value, step)
        for key, value in e.probes.items():
            if not key.startswith("eval_return"):
                add(f"probes/{key}", value, step)
        add("cost/total_usd", e.cost_usd, step)
        add("cost/round_usd", self._cost.pop(e.round, None), step)
        add("time/round_s", e.round_s, step)
        add("time/actor_s", e.actor_s, step)
        add("time/learner_s", e.learner_s, step)
        add("time/probe_s", e.probe_s, step)
        add("time/sim_time_s", e.sim_time_s, step)
        if self._started_ts is not None:
            add("time/wall_s", e.ts - self._started_ts, step)
        scale = self._scale.pop(e.round, None)
        if scale is not None:
            add("actors/next", scale.actors, step)
            for key, value in scale.detail.items():
                add(f"scaler/{key}", value, step)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
