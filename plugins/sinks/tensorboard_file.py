"""The ``tensorboard`` sink: scalars per round, under ``<run_dir>/tensorboard``.

``tensorboardX.SummaryWriter`` queues records to its own writer thread, so ``add_scalar`` costs
the loop a queue put; the file is flushed per round (the writer's ``flush_secs`` would
otherwise hold the newest round back for up to two minutes).

The x axis is ``env_steps`` by default (what RL curves are compared on); ``step = "round"``
switches every scalar to the round number. Tags are ``group/key`` with the keys every other
sink uses (``rollout/episode_return_mean``, ``time/env_steps_per_s``); ``tag_style = "sb3"`` or
``"cleanrl"`` writes those libraries' tags instead (``rollout/ep_rew_mean``, ``time/fps``;
``charts/episodic_return``, ``charts/SPS``) so dashboards made for them keep working.
"""

from __future__ import annotations

import math
from typing import Any

from kernel import events as ev
from kernel.roles import PluginContext
from kernel.schema import defaults
from plugins.descriptors.observe import TENSORBOARD_CONFIG
from plugins.sinks.metrics import FileSink, learner_tag, round_values, tensorboard_tag


class TensorboardSink(FileSink):
    def __init__(self, ctx: PluginContext):
        cfg = {**defaults(TENSORBOARD_CONFIG), **ctx.config}
        self.logdir = ctx.run_dir / cfg["dir"]
        self.step_by = cfg["step"]
        self.tag_style = cfg["tag_style"]
        self.file: Any = None
        self._started_ts: float | None = None
        self._scale: dict[int, ev.ScaleDecided] = {}
        self._cost: dict[int, float] = {}

    async def start(self, ctx: PluginContext) -> None:
        from tensorboardX import SummaryWriter

        self.file = SummaryWriter(logdir=str(self.logdir), flush_secs=30)

    def _add(self, tag: str, value: Any, step: int) -> None:
        if value is None or isinstance(value, bool):
            return
        value = float(value)
        if math.isfinite(value):
            self.file.add_scalar(tag, value, step)

    async def handle(self, event: Any) -> None:
        if self.file is None:
            return
        if isinstance(event, ev.RunStarted):
            self._started_ts = event.ts
            self.file.add_text("run", f"{event.name} ({event.run_id})", 0)
        elif isinstance(event, ev.ScaleDecided):
            self._scale[event.round] = event
        elif isinstance(event, ev.CostCharged):
            self._cost[event.round] = event.round_usd
        elif isinstance(event, ev.RoundFinished):
            self._round(event)
            self.file.flush()

    def _round(self, e: ev.RoundFinished) -> None:
        step = e.env_steps if self.step_by == "env_steps" else e.round
        style = self.tag_style
        scale = self._scale.pop(e.round, None)
        values = round_values(e, started_ts=self._started_ts,
                              round_cost_usd=self._cost.pop(e.round, None), scale=scale)
        for key, value in values.items():
            self._add(tensorboard_tag(key, style), value, step)
        for key, value in e.metrics.items():
            tag, sign = learner_tag(key, style)
            self._add(tag, None if value is None else sign * value, step)
        for key, value in e.probes.items():
            if key not in values:
                self._add(f"probes/{key}", value, step)
        for key, value in (scale.detail if scale is not None else {}).items():
            if key != "score":  # the score is boost_score
                self._add(f"scaler/{key}", value, step)
